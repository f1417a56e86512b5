package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/sim/scenario"
)

// ChangeKind is one kind of API change the soak makes.
type ChangeKind string

// The kinds of change, each one valid edit of API objects as a controller
// or a user would make it.
const (
	// ChangeReadiness flips one endpoint's ready (and serving) condition;
	// a terminating endpoint only flips serving, as the kubelet would.
	ChangeReadiness ChangeKind = "readiness"
	// ChangeScaleUp adds 1-3 ready endpoints on random nodes.
	ChangeScaleUp ChangeKind = "scale-up"
	// ChangeScaleDown removes the last 1-3 endpoints.
	ChangeScaleDown ChangeKind = "scale-down"
	// ChangeTerminate makes one endpoint terminating (not ready, serving
	// as it was ready), as a pod deletion does.
	ChangeTerminate ChangeKind = "terminate"
	// ChangeRemoveEndpoint takes one endpoint out of its slice.
	ChangeRemoveEndpoint ChangeKind = "remove-endpoint"
	// ChangeServiceCreate creates a Service and its EndpointSlice.
	ChangeServiceCreate ChangeKind = "service-create"
	// ChangeServiceDelete deletes a Service, then its EndpointSlices (as the
	// garbage collector does).
	ChangeServiceDelete ChangeKind = "service-delete"
	// ChangeAffinity toggles sessionAffinity None/ClientIP or changes the
	// ClientIP timeout.
	ChangeAffinity ChangeKind = "affinity"
	// ChangePolicy toggles internalTrafficPolicy Cluster/Local.
	ChangePolicy ChangeKind = "internal-traffic-policy"
)

// weights of the kinds: readiness flaps are the most common churn in a real
// cluster, Service creation and deletion the rarest.
var weights = []struct {
	kind ChangeKind
	w    int
}{
	{ChangeReadiness, 30}, {ChangeScaleUp, 10}, {ChangeScaleDown, 10}, {ChangeTerminate, 8},
	{ChangeRemoveEndpoint, 8}, {ChangeServiceCreate, 5}, {ChangeServiceDelete, 5},
	{ChangeAffinity, 12}, {ChangePolicy, 12},
}

// Kinds lists every change kind in a stable order.
func Kinds() []ChangeKind {
	out := make([]ChangeKind, len(weights))
	for i, w := range weights {
		out[i] = w.kind
	}
	return out
}

// Change is one generated API change.
type Change struct {
	Kind    ChangeKind
	Service string // namespace/name
	Detail  string
	// Writes is the number of API writes it made (one informer event per
	// tracker each).
	Writes int
}

func (c Change) String() string { return fmt.Sprintf("%s %s %s", c.Kind, c.Service, c.Detail) }

// Bounds keep the generated cluster in a fixed envelope, whatever N.
type Bounds struct {
	// MinServices and MaxServices bound the number of Services (creation
	// and deletion are skipped outside them).
	MinServices, MaxServices int
	// MaxEndpoints bounds the endpoints of one Service.
	MaxEndpoints int
	// MaxNodeFill is the fraction of a node's pod block that endpoints may
	// use (scale-up and creation are skipped beyond it).
	MaxNodeFill float64
}

type nodeInfo struct {
	name, zone string
	block      netip.Prefix
	used       int
}

// Generator makes seeded random API changes through a clientset. It must be
// the only writer: it keeps the live Service names and the addresses in use
// (ClusterIPs, endpoint addresses), and reads objects back with Get/List
// before each edit. The same seed and initial objects give the same changes.
type Generator struct {
	client      kubernetes.Interface
	rng         *rand.Rand
	bounds      Bounds
	serviceCIDR netip.Prefix
	nodes       []*nodeInfo
	services    []types.NamespacedName // sorted
	clusterIPs  map[netip.Addr]bool
	addrs       map[netip.Addr]bool
	created     int
	counts      map[ChangeKind]int
}

// NewGenerator reads the cluster's Nodes, Services and EndpointSlices from
// client and returns a generator seeded by rng.
func NewGenerator(ctx context.Context, client kubernetes.Interface, serviceCIDR netip.Prefix, rng *rand.Rand, b Bounds) (*Generator, error) {
	g := &Generator{client: client, rng: rng, bounds: b, serviceCIDR: serviceCIDR,
		clusterIPs: map[netip.Addr]bool{}, addrs: map[netip.Addr]bool{}, counts: map[ChangeKind]int{}}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("could not list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		p, err := netip.ParsePrefix(n.Spec.PodCIDR)
		if err != nil {
			return nil, fmt.Errorf("node %s has no usable pod CIDR %q: %w", n.Name, n.Spec.PodCIDR, err)
		}
		g.nodes = append(g.nodes, &nodeInfo{name: n.Name, zone: n.Labels[scenario.LabelZone], block: p.Masked()})
	}
	if len(g.nodes) == 0 {
		return nil, fmt.Errorf("could not generate changes: the cluster has no node")
	}
	sort.Slice(g.nodes, func(i, j int) bool { return g.nodes[i].name < g.nodes[j].name })
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("could not list services: %w", err)
	}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == corev1.ClusterIPNone || s.Spec.ClusterIP == "" {
			continue // headless: nothing to program, left alone
		}
		if a, err := netip.ParseAddr(s.Spec.ClusterIP); err == nil {
			g.clusterIPs[a] = true
		}
		g.services = append(g.services, types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
	}
	g.sortServices()
	sl, err := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("could not list endpointslices: %w", err)
	}
	for _, s := range sl.Items {
		for _, ep := range s.Endpoints {
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					g.use(ip)
				}
			}
		}
	}
	return g, nil
}

func (g *Generator) sortServices() {
	sort.Slice(g.services, func(i, j int) bool {
		a, b := g.services[i], g.services[j]
		return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
	})
}

func (g *Generator) use(a netip.Addr) {
	g.addrs[a] = true
	for _, n := range g.nodes {
		if n.block.Contains(a) {
			n.used++
		}
	}
}

func (g *Generator) free(a netip.Addr) {
	if !g.addrs[a] {
		return
	}
	delete(g.addrs, a)
	for _, n := range g.nodes {
		if n.block.Contains(a) {
			n.used--
		}
	}
}

// Counts returns how many changes of each kind were made.
func (g *Generator) Counts() map[ChangeKind]int { return maps(g.counts) }

// Services is the number of live Services.
func (g *Generator) Services() int { return len(g.services) }

func maps(m map[ChangeKind]int) map[ChangeKind]int {
	out := make(map[ChangeKind]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Next makes one change. A kind that cannot apply (no endpoint to flip, the
// Service bound reached) is drawn again; after a bounded number of draws
// Next fails.
func (g *Generator) Next(ctx context.Context) (Change, error) {
	total := 0
	for _, w := range weights {
		total += w.w
	}
	for attempt := 0; attempt < 64; attempt++ {
		x := g.rng.IntN(total)
		var kind ChangeKind
		for _, w := range weights {
			if x < w.w {
				kind = w.kind
				break
			}
			x -= w.w
		}
		ch, ok, err := g.apply(ctx, kind)
		if err != nil {
			return ch, err
		}
		if ok {
			g.counts[kind]++
			return ch, nil
		}
	}
	return Change{}, fmt.Errorf("could not find an applicable change in 64 draws (%d services)", len(g.services))
}

func (g *Generator) apply(ctx context.Context, kind ChangeKind) (Change, bool, error) {
	switch kind {
	case ChangeServiceCreate:
		return g.createService(ctx)
	}
	if len(g.services) == 0 {
		return Change{}, false, nil
	}
	key := g.services[g.rng.IntN(len(g.services))]
	ch := Change{Kind: kind, Service: key.String()}
	switch kind {
	case ChangeServiceDelete:
		return g.deleteService(ctx, key, ch)
	case ChangeAffinity, ChangePolicy:
		return g.editService(ctx, key, ch)
	}
	return g.editEndpoints(ctx, key, ch)
}

func (g *Generator) slicesOf(ctx context.Context, key types.NamespacedName) ([]*discoveryv1.EndpointSlice, error) {
	l, err := g.client.DiscoveryV1().EndpointSlices(key.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + key.Name})
	if err != nil {
		return nil, fmt.Errorf("could not list the endpointslices of %s: %w", key, err)
	}
	out := make([]*discoveryv1.EndpointSlice, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	slices.SortFunc(out, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

type ref struct{ slice, idx int }

func allEndpoints(sl []*discoveryv1.EndpointSlice, keep func(discoveryv1.Endpoint) bool) []ref {
	var out []ref
	for i, s := range sl {
		for j, ep := range s.Endpoints {
			if keep == nil || keep(ep) {
				out = append(out, ref{i, j})
			}
		}
	}
	return out
}

func isTrue(b *bool, absent bool) bool {
	if b == nil {
		return absent
	}
	return *b
}

// sliceEdit is an edit in progress of one Service's EndpointSlices: the
// slices in name order, which of them changed and which are new.
type sliceEdit struct {
	sl      []*discoveryv1.EndpointSlice
	changed map[int]bool
	created []*discoveryv1.EndpointSlice
}

// editEndpoints makes one endpoint change of ch.Kind to the Service's
// EndpointSlices and writes the slices it touched. It reports false when
// the change has nothing to act on (no endpoint, or no room to add one).
func (g *Generator) editEndpoints(ctx context.Context, key types.NamespacedName, ch Change) (Change, bool, error) {
	sl, err := g.slicesOf(ctx, key)
	if err != nil || len(sl) == 0 {
		return ch, false, err
	}
	e := &sliceEdit{sl: sl, changed: map[int]bool{}}
	detail, ok := ch.Detail, true
	switch ch.Kind {
	case ChangeReadiness:
		detail, ok = g.flipReadiness(e)
	case ChangeTerminate:
		detail, ok = g.terminate(e)
	case ChangeRemoveEndpoint, ChangeScaleDown:
		detail, ok = g.removeEndpoints(e, ch.Kind == ChangeRemoveEndpoint)
	case ChangeScaleUp:
		detail, ok = g.scaleUp(e, key)
	}
	if !ok {
		return ch, false, nil
	}
	ch.Detail = detail
	if err := g.writeSlices(ctx, key, e, &ch); err != nil {
		return ch, false, err
	}
	return ch, true, nil
}

// flipReadiness flips one endpoint's readiness at random: a terminating
// endpoint's serving condition, any other's ready and serving together.
func (g *Generator) flipReadiness(e *sliceEdit) (string, bool) {
	all := allEndpoints(e.sl, nil)
	if len(all) == 0 {
		return "", false
	}
	r := all[g.rng.IntN(len(all))]
	ep := &e.sl[r.slice].Endpoints[r.idx]
	var detail string
	if isTrue(ep.Conditions.Terminating, false) {
		sv := !isTrue(ep.Conditions.Serving, true)
		f := false
		ep.Conditions.Ready, ep.Conditions.Serving = &f, &sv
		detail = fmt.Sprintf("%s serving=%t (terminating)", ep.Addresses[0], sv)
	} else {
		rd := !isTrue(ep.Conditions.Ready, true)
		sv := rd
		ep.Conditions.Ready, ep.Conditions.Serving = &rd, &sv
		detail = fmt.Sprintf("%s ready=%t", ep.Addresses[0], rd)
	}
	e.changed[r.slice] = true
	return detail, true
}

// terminate marks one endpoint that is not terminating yet as terminating,
// serving if it was ready.
func (g *Generator) terminate(e *sliceEdit) (string, bool) {
	live := allEndpoints(e.sl, func(ep discoveryv1.Endpoint) bool { return !isTrue(ep.Conditions.Terminating, false) })
	if len(live) == 0 {
		return "", false
	}
	r := live[g.rng.IntN(len(live))]
	ep := &e.sl[r.slice].Endpoints[r.idx]
	serving := isTrue(ep.Conditions.Ready, true)
	f, t := false, true
	ep.Conditions.Ready, ep.Conditions.Serving, ep.Conditions.Terminating = &f, &serving, &t
	e.changed[r.slice] = true
	return ep.Addresses[0], true
}

// removeEndpoints removes one endpoint at random (one is true) or the last
// one to three (a scale-down), and frees their addresses.
func (g *Generator) removeEndpoints(e *sliceEdit, one bool) (string, bool) {
	sl := e.sl
	all := allEndpoints(sl, nil)
	if len(all) == 0 {
		return "", false
	}
	var del []ref
	if one {
		del = []ref{all[g.rng.IntN(len(all))]}
	} else {
		k := min(len(all), 1+g.rng.IntN(3))
		del = all[len(all)-k:]
	}
	gone := map[ref]bool{}
	for _, r := range del {
		gone[r] = true
		e.changed[r.slice] = true
		if a, err := netip.ParseAddr(sl[r.slice].Endpoints[r.idx].Addresses[0]); err == nil {
			g.free(a)
		}
	}
	for i := range e.changed {
		kept := sl[i].Endpoints[:0]
		for j, ep := range sl[i].Endpoints {
			if !gone[ref{i, j}] {
				kept = append(kept, ep)
			}
		}
		sl[i].Endpoints = kept
	}
	return fmt.Sprintf("%d endpoint(s)", len(del)), true
}

// scaleUp adds one to three endpoints, up to the bounds' MaxEndpoints,
// to the last slice, opening a new slice when that one is full. It
// reports false when it could add none.
func (g *Generator) scaleUp(e *sliceEdit, key types.NamespacedName) (string, bool) {
	n := len(allEndpoints(e.sl, nil))
	k := min(1+g.rng.IntN(3), g.bounds.MaxEndpoints-n)
	if k <= 0 {
		return "", false
	}
	last := len(e.sl) - 1
	added := 0
	for ; added < k; added++ {
		ep, ok := g.newEndpoint(true)
		if !ok {
			break
		}
		if len(e.sl[last].Endpoints) >= scenario.MaxEndpointsPerSlice {
			next := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: g.sliceName(key.Name), Namespace: key.Namespace, Labels: map[string]string{discoveryv1.LabelServiceName: key.Name}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       e.sl[last].Ports,
			}
			e.sl = append(e.sl, next)
			e.created = append(e.created, next)
			last++
		}
		e.sl[last].Endpoints = append(e.sl[last].Endpoints, ep)
		e.changed[last] = true
	}
	if added == 0 {
		return "", false
	}
	return fmt.Sprintf("+%d endpoint(s) to %d", added, n+added), true
}

// writeSlices creates the new slices, then updates the changed ones in
// index order, counting the writes in ch.
func (g *Generator) writeSlices(ctx context.Context, key types.NamespacedName, e *sliceEdit, ch *Change) error {
	for _, s := range e.created {
		if _, err := g.client.DiscoveryV1().EndpointSlices(key.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("could not create endpointslice %s/%s: %w", key.Namespace, s.Name, err)
		}
		ch.Writes++
	}
	for _, i := range sortedKeys(e.changed) {
		if slices.Contains(e.created, e.sl[i]) {
			continue // its endpoints went in with the Create
		}
		stampTrigger(e.sl[i])
		if _, err := g.client.DiscoveryV1().EndpointSlices(key.Namespace).Update(ctx, e.sl[i], metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("could not update endpointslice %s/%s: %w", key.Namespace, e.sl[i].Name, err)
		}
		ch.Writes++
	}
	return nil
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// newEndpoint allocates a fresh address on a random node whose pod block is
// not past its fill bound.
func (g *Generator) newEndpoint(ready bool) (discoveryv1.Endpoint, bool) {
	start := g.rng.IntN(len(g.nodes))
	for k := range g.nodes {
		n := g.nodes[(start+k)%len(g.nodes)]
		size := 1 << (32 - n.block.Bits())
		if float64(n.used+1) > g.bounds.MaxNodeFill*float64(size-3) {
			continue
		}
		// .0 is the network, .1 the node's gateway (netns), the top
		// addresses are where client pods go: draw from the rest.
		for try := 0; try < 4*size; try++ {
			off := 2 + g.rng.IntN(size-8)
			a := n.block.Addr()
			for i := 0; i < off; i++ {
				a = a.Next()
			}
			if g.addrs[a] {
				continue
			}
			g.use(a)
			t, f := ready, false
			sv := ready
			node := n.name
			ep := discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: &node,
				Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &sv, Terminating: &f}}
			if n.zone != "" {
				z := n.zone
				ep.Zone = &z
			}
			return ep, true
		}
	}
	return discoveryv1.Endpoint{}, false
}

const sliceSuffixChars = "bcdfghjklmnpqrstvwxz2456789"

func (g *Generator) sliceName(svc string) string {
	var b strings.Builder
	b.WriteString(svc + "-")
	for i := 0; i < 5; i++ {
		b.WriteByte(sliceSuffixChars[g.rng.IntN(len(sliceSuffixChars))])
	}
	return b.String()
}

func (g *Generator) editService(ctx context.Context, key types.NamespacedName, ch Change) (Change, bool, error) {
	cur, err := g.client.CoreV1().Services(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		return ch, false, fmt.Errorf("could not get service %s: %w", key, err)
	}
	s := cur.DeepCopy()
	switch ch.Kind {
	case ChangeAffinity:
		if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP && g.rng.IntN(2) == 0 {
			s.Spec.SessionAffinity = corev1.ServiceAffinityNone
			s.Spec.SessionAffinityConfig = nil
			ch.Detail = "None"
		} else {
			t := affinityTimeouts[g.rng.IntN(len(affinityTimeouts))]
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
			ch.Detail = fmt.Sprintf("ClientIP %ds", t)
		}
	case ChangePolicy:
		p := corev1.ServiceInternalTrafficPolicyLocal
		if s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal {
			p = corev1.ServiceInternalTrafficPolicyCluster
		}
		s.Spec.InternalTrafficPolicy = &p
		ch.Detail = string(p)
	}
	if _, err := g.client.CoreV1().Services(key.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return ch, false, fmt.Errorf("could not update service %s: %w", key, err)
	}
	ch.Writes = 1
	return ch, true, nil
}

// affinityTimeouts are the ClientIP timeouts the generator sets (the API
// allows 1-86400 s).
var affinityTimeouts = []int32{10, 60, 300, 3600, 10800}

func (g *Generator) deleteService(ctx context.Context, key types.NamespacedName, ch Change) (Change, bool, error) {
	if len(g.services) <= g.bounds.MinServices {
		return ch, false, nil
	}
	cur, err := g.client.CoreV1().Services(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		return ch, false, fmt.Errorf("could not get service %s: %w", key, err)
	}
	sl, err := g.slicesOf(ctx, key)
	if err != nil {
		return ch, false, err
	}
	if err := g.client.CoreV1().Services(key.Namespace).Delete(ctx, key.Name, metav1.DeleteOptions{}); err != nil {
		return ch, false, fmt.Errorf("could not delete service %s: %w", key, err)
	}
	ch.Writes++
	for _, s := range sl {
		if err := g.client.DiscoveryV1().EndpointSlices(key.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			return ch, false, fmt.Errorf("could not delete endpointslice %s/%s: %w", key.Namespace, s.Name, err)
		}
		ch.Writes++
		for _, ep := range s.Endpoints {
			if a, err := netip.ParseAddr(ep.Addresses[0]); err == nil {
				g.free(a)
			}
		}
	}
	if a, err := netip.ParseAddr(cur.Spec.ClusterIP); err == nil {
		delete(g.clusterIPs, a)
	}
	i := slices.Index(g.services, key)
	g.services = slices.Delete(g.services, i, i+1)
	ch.Detail = fmt.Sprintf("with %d slice(s)", len(sl))
	return ch, true, nil
}

func (g *Generator) allocClusterIP() (netip.Addr, bool) {
	size := uint64(1) << (32 - g.serviceCIDR.Bits())
	for try := 0; try < 1000; try++ {
		off := 16 + g.rng.Uint64N(size-32) // clear of the network's first and last addresses
		a := g.serviceCIDR.Masked().Addr()
		b := a.As4()
		v := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
		v += off
		ip := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		if !g.clusterIPs[ip] {
			g.clusterIPs[ip] = true
			return ip, true
		}
	}
	return netip.Addr{}, false
}

func (g *Generator) createService(ctx context.Context) (Change, bool, error) {
	if len(g.services) >= g.bounds.MaxServices || g.serviceCIDR.Bits() > 26 {
		return Change{}, false, nil
	}
	ns := "default"
	if len(g.services) > 0 {
		ns = g.services[g.rng.IntN(len(g.services))].Namespace
	}
	g.created++
	name := fmt.Sprintf("soak-%d", g.created)
	key := types.NamespacedName{Namespace: ns, Name: name}
	ch := Change{Kind: ChangeServiceCreate, Service: key.String()}
	ip, ok := g.allocClusterIP()
	if !ok {
		return ch, false, nil
	}
	proto := corev1.ProtocolTCP
	if g.rng.IntN(10) == 0 {
		proto = corev1.ProtocolUDP
	}
	port := int32(80 + g.rng.IntN(3)*1000)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:            corev1.ServiceTypeClusterIP,
			ClusterIP:       ip.String(),
			ClusterIPs:      []string{ip.String()},
			IPFamilies:      []corev1.IPFamily{corev1.IPv4Protocol},
			SessionAffinity: corev1.ServiceAffinityNone,
			Ports:           []corev1.ServicePort{{Port: port, Protocol: proto, TargetPort: intstr.FromInt32(port + 8000)}},
		},
	}
	if g.rng.IntN(4) == 0 {
		t := affinityTimeouts[g.rng.IntN(len(affinityTimeouts))]
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
	}
	p := corev1.ServiceInternalTrafficPolicyCluster
	if g.rng.IntN(4) == 0 {
		p = corev1.ServiceInternalTrafficPolicyLocal
	}
	svc.Spec.InternalTrafficPolicy = &p
	pname, tp := "", port+8000
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: g.sliceName(name), Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &tp, Protocol: &proto}},
	}
	for k := 1 + g.rng.IntN(min(6, g.bounds.MaxEndpoints)); k > 0; k-- {
		ep, ok := g.newEndpoint(g.rng.IntN(5) != 0)
		if !ok {
			break
		}
		sl.Endpoints = append(sl.Endpoints, ep)
	}
	if _, err := g.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return ch, false, fmt.Errorf("could not create service %s: %w", key, err)
	}
	ch.Writes++
	stampTrigger(sl)
	if _, err := g.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return ch, false, fmt.Errorf("could not create endpointslice %s/%s: %w", ns, sl.Name, err)
	}
	ch.Writes++
	g.services = append(g.services, key)
	g.sortServices()
	ch.Detail = fmt.Sprintf("%s %s/%d, %d endpoint(s)", ip, proto, port, len(sl.Endpoints))
	return ch, true, nil
}

// stampTrigger sets the annotation the EndpointSlice controller writes (when
// the change behind this write happened); proxies measure the network
// programming latency from it.
func stampTrigger(s *discoveryv1.EndpointSlice) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
}
