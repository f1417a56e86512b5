package cluster

import (
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// State is the proxy's view of the cluster after a Drain: every service port
// with its settings and endpoints, and the nodes. Consumers read it between two
// Drains of the tracker that owns it and must not modify it.
type State struct {
	Services  map[ServicePortName]*ServicePort
	Endpoints map[ServicePortName][]*Endpoint
	Nodes     map[string]*Node
}

// SortedServicePorts lists the service ports in a stable order.
func (s *State) SortedServicePorts() []ServicePortName {
	out := make([]ServicePortName, 0, len(s.Services))
	for n := range s.Services {
		out = append(out, n)
	}
	SortNames(out)
	return out
}

// LargeClusterEndpoints is kube-proxy's largeClusterEndpointsThreshold
// (pkg/proxy/iptables): with more endpoints than this (ProxiedEndpoints),
// the iptables proxier leaves comments out and makes no periodic full sync.
const LargeClusterEndpoints = 1000

// ProxiedEndpoints is the number kube-proxy's iptables proxier compares
// with LargeClusterEndpoints: the endpoints of the service ports it
// proxies, every endpoint counted whatever its conditions. Endpoints of a
// service port without a proxied Service do not count.
func (s *State) ProxiedEndpoints() int {
	total := 0
	for spn, eps := range s.Endpoints {
		if sp := s.Services[spn]; sp != nil && !sp.Headless && sp.ClusterIP.IsValid() {
			total += len(eps)
		}
	}
	return total
}

// SortedNodes lists node names in order.
func (s *State) SortedNodes() []string {
	out := make([]string, 0, len(s.Nodes))
	for n := range s.Nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Tracker follows Service, EndpointSlice and Node events and keeps, for each
// object, its current content beside the state last handed out (the previous
// one), as kube-proxy's change trackers do. Drain applies what changed and
// names the changed service ports; updates that change nothing the proxy uses
// are dropped there.
type Tracker struct {
	mu        sync.Mutex
	services  map[types.NamespacedName]*corev1.Service
	slices    map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice
	nodes     map[string]*corev1.Node
	dirtySvc  map[types.NamespacedName]bool
	dirtyEps  map[types.NamespacedName]bool
	dirtyNode bool
	notify    chan struct{}
	// triggers holds, per Service with pending endpoint changes, the
	// earliest last-change-trigger-time annotation seen (as kube-proxy's
	// EndpointChangeTracker does for the network programming latency).
	triggers map[types.NamespacedName]time.Time
	// seq counts the events received; drained is seq at the last Drain.
	seq, drained uint64

	state State
	// byService indexes the applied state's service ports per Service.
	byService map[types.NamespacedName][]ServicePortName
	// epPorts indexes the service ports that have endpoints per Service.
	epPorts map[types.NamespacedName][]ServicePortName
}

// NewTracker returns an empty tracker. sim/apiserver feeds it from its
// informers; a test can call its On* methods directly.
func NewTracker() *Tracker {
	return &Tracker{
		services:  map[types.NamespacedName]*corev1.Service{},
		slices:    map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice{},
		nodes:     map[string]*corev1.Node{},
		dirtySvc:  map[types.NamespacedName]bool{},
		dirtyEps:  map[types.NamespacedName]bool{},
		triggers:  map[types.NamespacedName]time.Time{},
		notify:    make(chan struct{}, 1),
		state:     State{Services: map[ServicePortName]*ServicePort{}, Endpoints: map[ServicePortName][]*Endpoint{}, Nodes: map[string]*Node{}},
		byService: map[types.NamespacedName][]ServicePortName{},
		epPorts:   map[types.NamespacedName][]ServicePortName{},
	}
}

// Changed is signalled (without blocking, coalesced) whenever an event arrives
// that may need a sync.
func (t *Tracker) Changed() <-chan struct{} { return t.notify }

func (t *Tracker) poke() {
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// OnService records a Service's new content (nil: deleted).
func (t *Tracker) OnService(key types.NamespacedName, s *corev1.Service) {
	t.mu.Lock()
	t.seq++
	if s == nil {
		delete(t.services, key)
	} else {
		t.services[key] = s
	}
	t.dirtySvc[key] = true
	t.mu.Unlock()
	t.poke()
}

// OnEndpointSlice records a slice's new content (nil: deleted).
func (t *Tracker) OnEndpointSlice(ns, name string, s *discoveryv1.EndpointSlice, svc string) {
	if svc == "" {
		return // not owned by a Service: kube-proxy ignores it
	}
	key := types.NamespacedName{Namespace: ns, Name: svc}
	t.mu.Lock()
	t.seq++
	m := t.slices[key]
	if s == nil {
		delete(m, name)
		if len(m) == 0 {
			delete(t.slices, key)
		}
	} else {
		if m == nil {
			m = map[string]*discoveryv1.EndpointSlice{}
			t.slices[key] = m
		}
		m[name] = s
	}
	t.dirtyEps[key] = true
	if s != nil {
		if v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
			if ts, err := time.Parse(time.RFC3339Nano, v); err == nil {
				if cur, seen := t.triggers[key]; !seen || ts.Before(cur) {
					t.triggers[key] = ts
				}
			}
		}
	}
	t.mu.Unlock()
	t.poke()
}

// OnNode records a node's new content (nil: deleted).
func (t *Tracker) OnNode(name string, n *corev1.Node) {
	t.mu.Lock()
	t.seq++
	if n == nil {
		delete(t.nodes, name)
	} else {
		t.nodes[name] = n
	}
	t.dirtyNode = true
	t.mu.Unlock()
	t.poke()
}

// Seq is the number of events the tracker has received. After an API write
// that produced k events, Seq grows by k; a consumer that drained up to Seq
// (Changes.Seq) has seen the write.
func (t *Tracker) Seq() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seq
}

// Pending reports whether changes wait for a Drain.
func (t *Tracker) Pending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.dirtySvc) > 0 || len(t.dirtyEps) > 0 || t.dirtyNode
}

// Drain applies the recorded changes to the state and returns the state and
// what changed. The state stays valid until the next Drain.
func (t *Tracker) Drain() (*State, Changes) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ch Changes
	t.drained = t.seq
	ch.Seq = t.seq
	if t.dirtyNode {
		t.dirtyNode = false
		nodes := map[string]*Node{}
		for name, n := range t.nodes {
			nodes[name] = nodeInfo(n)
		}
		if !nodesEqual(nodes, t.state.Nodes) {
			ch.Nodes = true
		}
		t.state.Nodes = nodes
	}
	svcKeys := slices.Collect(maps.Keys(t.dirtySvc))
	ports := convertAll(svcKeys, func(key types.NamespacedName) []*ServicePort {
		if s := t.services[key]; s != nil {
			return servicePorts(s)
		}
		return nil
	})
	for i, key := range svcKeys {
		t.applyService(key, ports[i], &ch)
	}
	clear(t.dirtySvc)
	epKeys := slices.Collect(maps.Keys(t.dirtyEps))
	eps := convertAll(epKeys, func(key types.NamespacedName) map[ServicePortName][]*Endpoint {
		return mergeSlices(key, t.slices[key])
	})
	for i, key := range epKeys {
		t.applyEndpoints(key, eps[i], &ch)
	}
	clear(t.dirtyEps)
	for _, ts := range t.triggers {
		ch.TriggerTimes = append(ch.TriggerTimes, ts)
	}
	clear(t.triggers)
	slices.SortFunc(ch.TriggerTimes, func(a, b time.Time) int { return a.Compare(b) })
	SortNames(ch.Services)
	SortNames(ch.Endpoints)
	return &t.state, ch
}

// parallelDrain is the number of changed objects from which Drain converts
// them on every CPU (a first Drain converts every object at once: half a
// second of one CPU at 30,000 Services).
const parallelDrain = 1024

// convertAll returns f of each key, on every CPU when there are many keys.
// f only reads the tracker's objects (Drain holds the lock, so no handler
// writes them meanwhile).
func convertAll[T any](keys []types.NamespacedName, f func(types.NamespacedName) T) []T {
	out := make([]T, len(keys))
	if len(keys) < parallelDrain {
		for i, k := range keys {
			out[i] = f(k)
		}
		return out
	}
	ParallelFor(len(keys), func(i int) { out[i] = f(keys[i]) })
	return out
}

// ParallelFor calls f(0) ... f(n-1) on every CPU, in batches of 256, and
// returns when all have returned; f(i) may write only what belongs to i.
// (Drain and the simulator's world building share it.)
func ParallelFor(n int, f func(i int)) {
	const batch = 256
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), (n+batch-1)/batch) {
		wg.Go(func() {
			for {
				i := int(next.Add(batch)) - batch
				if i >= n {
					return
				}
				for j := i; j < min(i+batch, n); j++ {
					f(j)
				}
			}
		})
	}
	wg.Wait()
}

// applyService puts a Service's converted ports (cur) into the state.
func (t *Tracker) applyService(key types.NamespacedName, cur []*ServicePort, ch *Changes) {
	prev := t.byService[key]
	seen := make(map[ServicePortName]bool, len(cur))
	names := make([]ServicePortName, 0, len(cur))
	for _, sp := range cur {
		seen[sp.Name] = true
		names = append(names, sp.Name)
		if old, ok := t.state.Services[sp.Name]; !ok || !old.Equal(sp) {
			t.state.Services[sp.Name] = sp
			ch.Services = append(ch.Services, sp.Name)
		}
	}
	for _, n := range prev {
		if !seen[n] {
			delete(t.state.Services, n)
			ch.Services = append(ch.Services, n)
		}
	}
	if len(names) == 0 {
		delete(t.byService, key)
	} else {
		t.byService[key] = names
	}
}

// applyEndpoints puts a Service's merged endpoints (cur) into the state.
func (t *Tracker) applyEndpoints(key types.NamespacedName, cur map[ServicePortName][]*Endpoint, ch *Changes) {
	prev := t.epPorts[key]
	names := make([]ServicePortName, 0, len(cur))
	for n, eps := range cur {
		names = append(names, n)
		if !endpointsEqual(t.state.Endpoints[n], eps) {
			t.state.Endpoints[n] = eps
			ch.Endpoints = append(ch.Endpoints, n)
		}
	}
	for _, n := range prev {
		if _, ok := cur[n]; !ok {
			delete(t.state.Endpoints, n)
			ch.Endpoints = append(ch.Endpoints, n)
		}
	}
	if len(names) == 0 {
		delete(t.epPorts, key)
	} else {
		t.epPorts[key] = names
	}
}

func nodeInfo(n *corev1.Node) *Node {
	out := &Node{Name: n.Name, Zone: n.Labels["topology.kubernetes.io/zone"], Labels: n.Labels}
	// The first IPv4 InternalIP, as kube-proxy picks the node address of an
	// IPv4 cluster (a dual-stack node lists an IPv6 one too).
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && ip.Is4() {
			out.IP = ip
			break
		}
	}
	out.PodCIDR, _ = netip.ParsePrefix(n.Spec.PodCIDR)
	out.Leaving = !n.DeletionTimestamp.IsZero()
	for _, t := range n.Spec.Taints {
		out.Leaving = out.Leaving || t.Key == "ToBeDeletedByClusterAutoscaler"
	}
	return out
}

func nodesEqual(a, b map[string]*Node) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok || x.Zone != y.Zone || x.IP != y.IP || x.PodCIDR != y.PodCIDR || x.Leaving != y.Leaving {
			return false
		}
	}
	return true
}

// servicePorts converts a Service to its service ports, skipping what
// kube-proxy skips (headless and ExternalName Services).
func servicePorts(s *corev1.Service) []*ServicePort {
	if s.Spec.Type == corev1.ServiceTypeExternalName || s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	ip, err := ParseAddrSloppy(s.Spec.ClusterIP)
	if err != nil {
		return nil
	}
	affinity := s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP
	var timeout int32
	if affinity {
		timeout = 10800
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			timeout = *c.ClientIP.TimeoutSeconds
		}
	}
	itpLocal := s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	// apiservice.ExternalPolicyLocal: an externally accessible Service
	// (NodePort, LoadBalancer, or ClusterIP with external IPs) with
	// externalTrafficPolicy Local.
	external := s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer ||
		(s.Spec.Type == corev1.ServiceTypeClusterIP || s.Spec.Type == "") && len(s.Spec.ExternalIPs) > 0
	etpLocal := external && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var hcnp int32 // apiservice.NeedsHealthCheck
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer && etpLocal {
		hcnp = s.Spec.HealthCheckNodePort
	}
	ext := externalAddrs(s)
	out := make([]*ServicePort, 0, len(s.Spec.Ports))
	for _, p := range s.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		out = append(out, &ServicePort{
			Name:             ServicePortName{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, Port: p.Name, Protocol: proto},
			Type:             s.Spec.Type,
			ClusterIP:        ip,
			Port:             p.Port,
			NodePort:         p.NodePort,
			TargetPort:       p.TargetPort.String(),
			ClientIPAffinity: affinity,
			AffinityTimeout:  timeout,
			InternalLocal:    itpLocal,
			ExternalLocal:    etpLocal,

			HealthCheckNodePort: hcnp,
			ExternalIPs:         ext.externalIPs,
			LoadBalancerIPs:     ext.vips,
			ProxyIPs:            ext.proxyIPs,
			SourceRanges:        ext.ranges,
		})
	}
	return out
}

// external are a Service's addresses outside the cluster IP, as
// kube-proxy's newBaseServiceInfo reads them for the IPv4 family.
type external struct {
	externalIPs, vips, proxyIPs []netip.Addr
	ranges                      []netip.Prefix
}

// externalAddrs reads spec.externalIPs, status.loadBalancer.ingress and
// spec.loadBalancerSourceRanges: IPv4 only; an ingress without an IP (a
// hostname) is skipped, and one with ipMode Proxy is set apart; source
// ranges are trimmed (the API allows padding), and a zero CIDR among them
// means "allow any", the same as none. The slices are shared by the
// Service's ports and never modified.
func externalAddrs(s *corev1.Service) external {
	var e external
	for _, a := range s.Spec.ExternalIPs {
		if ip, err := ParseAddrSloppy(strings.TrimSpace(a)); err == nil && ip.Is4() {
			e.externalIPs = append(e.externalIPs, ip)
		}
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		ip, err := ParseAddrSloppy(in.IP)
		if err != nil || !ip.Is4() {
			continue
		}
		if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
			e.proxyIPs = append(e.proxyIPs, ip)
			continue
		}
		e.vips = append(e.vips, ip)
	}
	for _, r := range s.Spec.LoadBalancerSourceRanges {
		p, err := ParsePrefixSloppy(strings.TrimSpace(r))
		if err != nil || !p.Addr().Is4() {
			continue
		}
		if p.Bits() == 0 {
			e.ranges = nil
			break
		}
		e.ranges = append(e.ranges, p.Masked())
	}
	return e
}

// mergeSlices builds the endpoints of each service port of a Service from its
// slices, as kube-proxy's EndpointSliceCache does: endpoints are keyed by
// ip:port, a ready copy wins over a not-ready duplicate, and the result is
// sorted by address.
func mergeSlices(key types.NamespacedName, slices map[string]*discoveryv1.EndpointSlice) map[ServicePortName][]*Endpoint {
	if len(slices) == 0 {
		return nil
	}
	out := map[ServicePortName][]*Endpoint{}
	// Visit slices in name order so that duplicates resolve deterministically.
	names := make([]string, 0, len(slices))
	for n := range slices {
		names = append(names, n)
	}
	if len(names) > 1 {
		sortStrings(names)
	}
	var dups map[ServicePortName]map[string]int
	for _, sn := range names {
		s := slices[sn]
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, p := range s.Ports {
			if p.Port == nil {
				continue
			}
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			spn := ServicePortName{NamespacedName: key, Port: name, Protocol: proto}
			list := out[spn]
			if list == nil {
				list = make([]*Endpoint, 0, len(s.Endpoints))
			}
			for i := range s.Endpoints {
				ep := endpointOf(&s.Endpoints[i], *p.Port)
				if ep == nil {
					continue
				}
				if len(names) > 1 {
					if dups == nil {
						dups = map[ServicePortName]map[string]int{}
					}
					d := dups[spn]
					if d == nil {
						d = map[string]int{}
						dups[spn] = d
					}
					k := ep.String()
					if j, seen := d[k]; seen {
						if ep.Ready && !list[j].Ready {
							list[j] = ep
						}
						continue
					}
					d[k] = len(list)
				}
				list = append(list, ep)
			}
			out[spn] = list
		}
	}
	for n, l := range out {
		slicesSortEndpoints(l)
		out[n] = l
	}
	return out
}

func endpointOf(e *discoveryv1.Endpoint, port int32) *Endpoint {
	if len(e.Addresses) == 0 {
		return nil
	}
	ip, err := ParseAddrSloppy(e.Addresses[0])
	if err != nil {
		return nil
	}
	c := e.Conditions
	ep := &Endpoint{
		IP:          ip,
		Port:        port,
		Ready:       c.Ready == nil || *c.Ready,
		Serving:     c.Serving == nil || *c.Serving,
		Terminating: c.Terminating != nil && *c.Terminating,
	}
	if e.NodeName != nil {
		ep.NodeName = *e.NodeName
	}
	if e.Zone != nil {
		ep.Zone = *e.Zone
	}
	if e.TargetRef != nil {
		ep.Pod = e.TargetRef.Name
	}
	if h := e.Hints; h != nil {
		for _, z := range h.ForZones {
			ep.ZoneHints = append(ep.ZoneHints, z.Name)
		}
		for _, n := range h.ForNodes {
			ep.NodeHints = append(ep.NodeHints, n.Name)
		}
	}
	return ep
}

func sortStrings(s []string) { slices.Sort(s) }

func slicesSortEndpoints(l []*Endpoint) {
	slices.SortFunc(l, func(a, b *Endpoint) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
}

func endpointsEqual(a, b []*Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].equal(b[i]) {
			return false
		}
	}
	return true
}

// ParseAddrSloppy parses an address as kube-proxy does
// (netutils.ParseIPSloppy): like netip.ParseAddr, but an IPv4 octet may
// have leading zeros, read as decimal ("172.30.0.041" is 172.30.0.41).
// Objects an API server accepted before Kubernetes 1.33's stricter
// validation can hold such addresses.
func ParseAddrSloppy(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err == nil || strings.Contains(s, ":") {
		return a, err
	}
	if t, ok := trimOctets(s); ok {
		return netip.ParseAddr(t)
	}
	return a, err
}

// ParsePrefixSloppy is netip.ParsePrefix with ParseAddrSloppy's octets and a
// prefix length that may have leading zeros ("203.0.113.000/025").
func ParsePrefixSloppy(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err == nil {
		return p, nil
	}
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return p, err
	}
	a, aerr := ParseAddrSloppy(addr)
	if aerr != nil {
		return p, err
	}
	if t := strings.TrimLeft(bits, "0"); t != bits {
		if t == "" {
			t = "0"
		}
		bits = t
	}
	return netip.ParsePrefix(a.String() + "/" + bits)
}

// trimOctets drops the leading zeros of each of four dotted decimal octets.
func trimOctets(s string) (string, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return "", false
	}
	for i, p := range parts {
		if p == "" || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return "", false
		}
		if t := strings.TrimLeft(p, "0"); t == "" {
			parts[i] = "0"
		} else {
			parts[i] = t
		}
	}
	return strings.Join(parts, "."), true
}
