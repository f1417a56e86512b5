package scenario

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels and values the expansion writes, as Kubernetes does.
const (
	LabelZone          = "topology.kubernetes.io/zone"
	LabelHostname      = "kubernetes.io/hostname"
	managedBy          = "endpointslice-controller.k8s.io"
	generatedByLabel   = "kpsim.dev/generated"
	firstServiceOffset = 10 // generated ClusterIPs start at .10 of the CIDR
)

// Expanded is a scenario turned into ordinary Kubernetes objects. Expand
// fills the object lists; ExpandTo streams the objects to a sink instead (at
// 30,000 Services a second copy of every object would double the memory),
// and keeps only the nodes and the counts. The order is deterministic.
type Expanded struct {
	Scenario *Scenario
	File     string
	Seed     uint64
	Nodes    []*corev1.Node
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	Pods     []*corev1.Pod
	// Counts of what was emitted (both modes).
	ServiceCount, SliceCount, PodCount, HeadlessCount int
	// Generated counts what the generator produced, for reports and tests.
	Generated *GeneratedCounts
}

// GeneratedCounts summarises the generator's output.
type GeneratedCounts struct {
	Services                   int `json:"services"`
	ServicePorts               int `json:"servicePorts"`
	Endpoints                  int `json:"endpoints"`
	EndpointSlices             int `json:"endpointSlices"`
	SessionAffinity            int `json:"sessionAffinity"`
	InternalTrafficPolicyLocal int `json:"internalTrafficPolicyLocal"`
	ExternalTrafficPolicyLocal int `json:"externalTrafficPolicyLocal"`
	NamedPorts                 int `json:"namedPorts"`
	UDPPorts                   int `json:"udpPorts"`
	NotReadyEndpoints          int `json:"notReadyEndpoints"`
	TerminatingEndpoints       int `json:"terminatingEndpoints"`
	MinEndpoints               int `json:"minEndpointsPerService"`
	MaxEndpoints               int `json:"maxEndpointsPerService"`
}

// Random streams, one per purpose, so that adding a draw in one place does
// not change the others.
const (
	streamNodes = iota + 1
	streamCounts
	streamPlacement
	streamChoices
	streamNames
)

// NewRand returns the scenario's random source for one stream.
func NewRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15^stream))
}

// Expand turns a loaded scenario into objects. seedOverride, when non-nil,
// replaces the scenario's seed. Errors are ErrorLists (the scenario asks for
// more than its address ranges hold).
func Expand(l *Loaded, seedOverride *uint64) (*Expanded, error) {
	var out *Expanded
	collect := func(o runtime.Object) error {
		switch x := o.(type) {
		case *corev1.Service:
			out.Services = append(out.Services, x)
		case *discoveryv1.EndpointSlice:
			out.Slices = append(out.Slices, x)
		case *corev1.Pod:
			out.Pods = append(out.Pods, x)
		}
		return nil
	}
	return expandTo(l, seedOverride, collect, func(e *Expanded) { out = e })
}

// ExpandTo expands a scenario and hands every Service, EndpointSlice and Pod
// to sink as it is made (nodes are kept in Expanded.Nodes). A sink error
// stops the expansion and is returned as is.
func ExpandTo(l *Loaded, seedOverride *uint64, sink func(runtime.Object) error) (*Expanded, error) {
	return expandTo(l, seedOverride, sink, nil)
}

func expandTo(l *Loaded, seedOverride *uint64, sink func(runtime.Object) error, started func(*Expanded)) (*Expanded, error) {
	sc := l.Scenario
	seed := *sc.Seed
	if seedOverride != nil {
		seed = *seedOverride
	}
	e := &expander{
		r:    reporter{file: l.File, pos: l.pos},
		sc:   sc,
		out:  &Expanded{Scenario: sc, File: l.File, Seed: seed},
		sink: sink,
	}
	if started != nil {
		started(e.out)
	}
	e.nodePorts = newNodePortAllocator(sc.Objects)
	e.nodes()
	e.services()
	e.slicesAndPods()
	if sc.Generate != nil && len(e.r.errs) == 0 {
		e.generate()
	}
	if e.sinkErr != nil {
		return nil, e.sinkErr
	}
	if len(e.r.errs) > 0 {
		e.r.errs.Sort()
		return nil, e.r.errs
	}
	return e.out, nil
}

// emit hands one object to the sink and counts it.
func (e *expander) emit(o runtime.Object) {
	if e.sinkErr != nil {
		return
	}
	switch x := o.(type) {
	case *corev1.Service:
		e.out.ServiceCount++
		if x.Spec.ClusterIP == corev1.ClusterIPNone {
			e.out.HeadlessCount++
		}
	case *discoveryv1.EndpointSlice:
		e.out.SliceCount++
	case *corev1.Pod:
		e.out.PodCount++
	}
	e.sinkErr = e.sink(o)
}

type expander struct {
	r   reporter
	sc  *Scenario
	out *Expanded

	nodeIdx     map[string]int
	nodeIP      []netip.Addr // each node's IPv4 InternalIP
	nodeCIDR    []netip.Prefix
	nodeNext    []netip.Addr // next free address in the node's pod block
	nodeUsed    []map[netip.Addr]bool
	svcByName   map[string]*corev1.Service
	objServices []*corev1.Service
	objPods     []*corev1.Pod
	sink        func(runtime.Object) error
	sinkErr     error
	usedIPs     map[netip.Addr]bool
	nextIP      netip.Addr
	nodePorts   *nodePortAllocator
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func (e *expander) nodes() {
	c := &e.sc.Cluster
	type spec struct {
		path string
		n    *corev1.Node
	}
	var specs []spec
	for i, ns := range c.Nodes {
		labels := map[string]string{LabelHostname: ns.Name}
		for k, v := range ns.Labels {
			labels[k] = v
		}
		if ns.Zone != "" {
			labels[LabelZone] = ns.Zone
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, Labels: labels}, Spec: corev1.NodeSpec{PodCIDR: ns.PodCIDR}}
		if ns.IP != "" {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ns.IP}}
		}
		specs = append(specs, spec{fmt.Sprintf("cluster.nodes[%d]", i), n})
	}
	for i := 1; i <= c.NodeCount; i++ {
		name := NodeName(c.NodeNamePattern, i)
		labels := map[string]string{LabelHostname: name}
		if len(c.Zones) > 0 {
			labels[LabelZone] = c.Zones[(i-1)%len(c.Zones)]
		}
		specs = append(specs, spec{"cluster.nodeCount", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}})
	}
	for _, o := range e.sc.Objects {
		if n, ok := o.Object.(*corev1.Node); ok {
			specs = append(specs, spec{o.Path, n.DeepCopy()})
		}
	}
	podCIDR := mustPrefix(c.PodCIDR)
	nodeNet := mustPrefix(c.NodeNetwork)
	taken := []netip.Prefix{}
	for _, s := range specs {
		if s.n.Spec.PodCIDR != "" {
			taken = append(taken, mustPrefix(s.n.Spec.PodCIDR))
		}
	}
	// Allocate the remaining node blocks lowest first, skipping taken ones.
	blockSize := uint64(1) << (32 - c.NodeCIDRMaskSize)
	nblocks := uint64(1) << (c.NodeCIDRMaskSize - podCIDR.Bits())
	next := uint64(0)
	usedNodeIPs := map[netip.Addr]bool{}
	for _, s := range specs {
		if a, ok := NodeIPv4(s.n); ok {
			usedNodeIPs[a] = true
		}
	}
	nodeIP := nodeNet.Addr().Next()
	e.nodeIdx = map[string]int{}
	for i, s := range specs {
		if s.n.Spec.PodCIDR == "" {
			for {
				if next >= nblocks {
					e.r.at(s.path, "the cluster's podCIDR %s holds only %d node blocks of /%d; widen it or lower nodeCIDRMaskSize", podCIDR, nblocks, c.NodeCIDRMaskSize)
					return
				}
				p := netip.PrefixFrom(addAddr(podCIDR.Addr(), next*blockSize), c.NodeCIDRMaskSize)
				next++
				if !overlapsAny(p, taken) {
					s.n.Spec.PodCIDR = p.String()
					break
				}
			}
		}
		s.n.Spec.PodCIDRs = []string{s.n.Spec.PodCIDR}
		if _, ok := NodeIPv4(s.n); !ok {
			for usedNodeIPs[nodeIP] {
				nodeIP = nodeIP.Next()
			}
			if !nodeNet.Contains(nodeIP) {
				e.r.at(s.path, "cluster.nodeNetwork %s has no address left for node %s", nodeNet, s.n.Name)
				return
			}
			s.n.Status.Addresses = append([]corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP.String()}}, s.n.Status.Addresses...)
			nodeIP = nodeIP.Next()
		}
		s.n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		e.nodeIdx[s.n.Name] = i
		ip, _ := NodeIPv4(s.n)
		e.nodeIP = append(e.nodeIP, ip)
		p := mustPrefix(s.n.Spec.PodCIDR)
		e.nodeCIDR = append(e.nodeCIDR, p)
		// .1 of each block is the node's gateway address in the dataplane.
		e.nodeNext = append(e.nodeNext, p.Addr().Next().Next())
		e.nodeUsed = append(e.nodeUsed, map[netip.Addr]bool{})
		e.out.Nodes = append(e.out.Nodes, s.n)
	}
}

func addAddr(a netip.Addr, n uint64) netip.Addr {
	b := a.As4()
	v := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	v += n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func overlapsAny(p netip.Prefix, l []netip.Prefix) bool {
	for _, q := range l {
		if p.Overlaps(q) {
			return true
		}
	}
	return false
}

func (e *expander) services() {
	e.svcByName = map[string]*corev1.Service{}
	e.usedIPs = map[netip.Addr]bool{}
	for _, o := range e.sc.Objects {
		if s, ok := o.Object.(*corev1.Service); ok {
			if a, err := netip.ParseAddr(s.Spec.ClusterIP); err == nil {
				e.usedIPs[a] = true
			}
		}
	}
	cidr := mustPrefix(e.sc.Cluster.ServiceCIDR)
	e.nextIP = addAddr(cidr.Addr(), firstServiceOffset)
	for _, o := range e.sc.Objects {
		s, ok := o.Object.(*corev1.Service)
		if !ok {
			continue
		}
		s = s.DeepCopy()
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			// no cluster IP, no node port, no rules
			e.svcByName[s.Namespace+"/"+s.Name] = s
			e.objServices = append(e.objServices, s)
			e.emit(s)
			continue
		}
		if s.Spec.ClusterIP == "" {
			ip, ok := e.allocIP()
			if !ok {
				e.r.at(o.Path, "cluster.serviceCIDR %s has no address left", cidr)
				return
			}
			s.Spec.ClusterIP = ip.String()
		}
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
		}
		if !e.nodePorts.assign(s) {
			e.r.at(o.Path+".spec.ports", "no node port left in %d-%d for this Service", NodePortMin, NodePortMax)
			return
		}
		e.svcByName[s.Namespace+"/"+s.Name] = s
		e.objServices = append(e.objServices, s)
		e.emit(s)
	}
}

func (e *expander) allocIP() (netip.Addr, bool) {
	cidr := mustPrefix(e.sc.Cluster.ServiceCIDR)
	for e.usedIPs[e.nextIP] {
		e.nextIP = e.nextIP.Next()
	}
	ip := e.nextIP
	// The last address of the range is its broadcast address; keep it free.
	if !cidr.Contains(ip) || !cidr.Contains(ip.Next()) {
		return netip.Addr{}, false
	}
	e.usedIPs[ip] = true
	e.nextIP = ip.Next()
	return ip, true
}

func (e *expander) slicesAndPods() {
	haveSlices := map[string]bool{}
	for _, o := range e.sc.Objects {
		switch x := o.Object.(type) {
		case *discoveryv1.EndpointSlice:
			x = x.DeepCopy()
			haveSlices[x.Namespace+"/"+x.Labels[discoveryv1.LabelServiceName]] = true
			for i, ep := range x.Endpoints {
				e.reserve(ep.Addresses, ep.NodeName)
				e.inNodeBlock(fmt.Sprintf("%s.endpoints[%d].addresses[0]", o.Path, i), ep.Addresses, ep.NodeName)
			}
			e.emit(x)
		case *corev1.Pod:
			x = x.DeepCopy()
			if x.Status.PodIP != "" && !x.Spec.HostNetwork && !e.isNodeIP(x.Status.PodIP) {
				n := x.Spec.NodeName
				e.reserve([]string{x.Status.PodIP}, &n)
				e.inNodeBlock(o.Path+".status.podIP", []string{x.Status.PodIP}, &n)
			}
			e.objPods = append(e.objPods, x)
			e.emit(x)
		}
	}
	// Services with a selector and no EndpointSlice get slices derived from
	// the Pods they select, as the EndpointSlice controller would write them.
	for _, s := range e.objServices {
		if len(s.Spec.Selector) == 0 || haveSlices[s.Namespace+"/"+s.Name] || s.Spec.ClusterIP == corev1.ClusterIPNone || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		var eps []discoveryv1.Endpoint
		for _, p := range e.objPods {
			if p.Namespace != s.Namespace || p.Status.PodIP == "" || !selects(s.Spec.Selector, p.Labels) {
				continue
			}
			eps = append(eps, podEndpoint(p, e.zoneOf(p.Spec.NodeName)))
		}
		setHints(s, eps)
		for _, sl := range splitSlices(s, eps, servicePortsFor(s, e.objPods), nil) {
			e.emit(sl)
		}
	}
}

func (e *expander) zoneOf(node string) string {
	if i, ok := e.nodeIdx[node]; ok {
		return e.out.Nodes[i].Labels[LabelZone]
	}
	return ""
}

func (e *expander) reserve(addrs []string, node *string) {
	if node == nil {
		return
	}
	i, ok := e.nodeIdx[*node]
	if !ok {
		return
	}
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			e.nodeUsed[i][ip] = true
		}
	}
}

// inNodeBlock checks that an address lies in its node's pod block (the
// blocks are only known once allocated here).
func (e *expander) inNodeBlock(path string, addrs []string, node *string) {
	if node == nil || len(addrs) == 0 {
		return
	}
	i, ok := e.nodeIdx[*node]
	if !ok {
		return
	}
	if a, err := netip.ParseAddr(addrs[0]); err == nil && !e.nodeCIDR[i].Contains(a) && a != e.nodeIP[i] {
		e.r.at(path, "%s is not inside node %s's podCIDR %s", a, *node, e.nodeCIDR[i])
	}
}

// isNodeIP reports whether addr is a node's address (a host-network pod's).
func (e *expander) isNodeIP(addr string) bool {
	a, err := netip.ParseAddr(addr)
	return err == nil && slices.Contains(e.nodeIP, a)
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func podEndpoint(p *corev1.Pod, zone string) discoveryv1.Endpoint {
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	terminating := p.DeletionTimestamp != nil
	serving := ready
	readyCond := ready && !terminating
	node := p.Spec.NodeName
	ep := discoveryv1.Endpoint{
		Addresses:  []string{p.Status.PodIP},
		Conditions: discoveryv1.EndpointConditions{Ready: &readyCond, Serving: &serving, Terminating: &terminating},
		NodeName:   &node,
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name},
	}
	if zone != "" {
		z := zone
		ep.Zone = &z
	}
	return ep
}

// servicePortsFor resolves each service port's target port against the
// selected pods' container ports (named target ports), as the controller does
// per pod; pods here are assumed to agree.
func servicePortsFor(s *corev1.Service, pods []*corev1.Pod) []discoveryv1.EndpointPort {
	var out []discoveryv1.EndpointPort
	for _, sp := range s.Spec.Ports {
		port := sp.TargetPort.IntVal
		if sp.TargetPort.Type == intstr.String {
			port = 0
			for _, p := range pods {
				if p.Namespace != s.Namespace || !selects(s.Spec.Selector, p.Labels) {
					continue
				}
				for _, c := range p.Spec.Containers {
					for _, cp := range c.Ports {
						if cp.Name == sp.TargetPort.StrVal {
							port = cp.ContainerPort
						}
					}
				}
			}
			if port == 0 {
				continue // the controller leaves the port out
			}
		}
		name, proto, pp := sp.Name, sp.Protocol, port
		out = append(out, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &pp})
	}
	return out
}

const sliceSuffixChars = "bcdfghjklmnpqrstvwxz2456789"

// splitSlices cuts a Service's endpoints into EndpointSlices of at most
// MaxEndpointsPerSlice, named <service>-<5 random characters> as the
// controller's generateName does (deterministically when r is given).
func splitSlices(s *corev1.Service, eps []discoveryv1.Endpoint, ports []discoveryv1.EndpointPort, r *rand.Rand) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for start := 0; start < len(eps) || (start == 0 && len(out) == 0); start += MaxEndpointsPerSlice {
		end := min(start+MaxEndpointsPerSlice, len(eps))
		suffix := make([]byte, 5)
		for i := range suffix {
			if r != nil {
				suffix[i] = sliceSuffixChars[r.IntN(len(sliceSuffixChars))]
			} else {
				suffix[i] = sliceSuffixChars[(len(out)*5+i)%len(sliceSuffixChars)]
			}
		}
		out = append(out, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name:      s.Name + "-" + string(suffix),
				Namespace: s.Namespace,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: s.Name,
					discoveryv1.LabelManagedBy:   managedBy,
				},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps[start:end:end],
			Ports:       ports,
		})
		if len(eps) == 0 {
			break
		}
	}
	return out
}

// drawCount draws one endpoints-per-Service count.
type countDist struct {
	d   Distribution
	cdf []float64 // zipf
}

func newCountDist(d Distribution) *countDist {
	c := &countDist{d: d}
	if d.Kind == "zipf" {
		sum := 0.0
		for k := d.Min; k <= d.Max; k++ {
			sum += math.Pow(float64(max(k, 1)), -d.S)
			c.cdf = append(c.cdf, sum)
		}
		for i := range c.cdf {
			c.cdf[i] /= sum
		}
	}
	return c
}

func (c *countDist) draw(r *rand.Rand) int {
	d := c.d
	switch d.Kind {
	case "fixed":
		return d.Value
	case "uniform":
		return d.Min + r.IntN(d.Max-d.Min+1)
	case "zipf":
		u := r.Float64()
		return d.Min + sort.SearchFloat64s(c.cdf, u)
	case "lognormal":
		v := int(math.Round(math.Exp(d.Mu + d.Sigma*r.NormFloat64())))
		return min(max(v, d.Min), d.Max)
	}
	return 0
}

// pick returns a set of exactly round(f*n) indices out of n, chosen at random.
func pick(r *rand.Rand, n int, f float64) []bool {
	k := int(math.Round(f * float64(n)))
	out := make([]bool, n)
	for _, i := range r.Perm(n)[:k] {
		out[i] = true
	}
	return out
}

// genDraws is what generate draws before it builds any object: which
// Services, ports and endpoints get each property, and how many endpoints
// each Service has. Every fraction is drawn as an exact set (pick), so the
// counts in GeneratedCounts equal the scenario's fractions after rounding.
type genDraws struct {
	place, names                 *rand.Rand
	affinity, itpLocal, etpLocal []bool // per Service
	named, udp                   []bool // per port
	perSvc                       []int  // endpoints per Service
	notReady                     []bool // per endpoint
	termAmong                    []bool // per endpoint that is not not-ready
	epIdx, termIdx               int    // next endpoint in notReady and termAmong
}

// generate builds the scenario's generated Services and EndpointSlices and
// emits them, one Service at a time, then records what it generated. It
// stops at the first Service that does not fit the cluster's ranges,
// having reported why.
func (e *expander) generate() {
	g := e.sc.Generate
	gc := &GeneratedCounts{Services: g.Services, MinEndpoints: math.MaxInt}
	d := e.drawGenerated()
	for i := 0; i < g.Services && e.sinkErr == nil; i++ {
		s, ports, ok := e.generatedService(d, gc, i)
		if !ok {
			return
		}
		k := d.perSvc[i]
		gc.Endpoints += k
		gc.MinEndpoints = min(gc.MinEndpoints, k)
		gc.MaxEndpoints = max(gc.MaxEndpoints, k)
		eps, ok := e.generatedEndpoints(d, gc, k)
		if !ok {
			return
		}
		slices := splitSlices(s, eps, ports, d.names)
		gc.EndpointSlices += len(slices)
		e.emit(s)
		for _, sl := range slices {
			e.emit(sl)
		}
	}
	if gc.MinEndpoints == math.MaxInt {
		gc.MinEndpoints = 0
	}
	e.out.Generated = gc
}

// drawGenerated makes every random choice that does not depend on the
// objects built so far, from the seed's streams, in a fixed order.
func (e *expander) drawGenerated() *genDraws {
	g := e.sc.Generate
	n := g.Services
	counts := NewRand(e.out.Seed, streamCounts)
	choice := NewRand(e.out.Seed, streamChoices)
	d := &genDraws{place: NewRand(e.out.Seed, streamPlacement), names: NewRand(e.out.Seed, streamNames)}
	dist := newCountDist(g.EndpointsPerService)
	d.affinity = pick(choice, n, g.SessionAffinity.Fraction)
	d.itpLocal = pick(choice, n, g.InternalTrafficPolicyLocal)
	d.etpLocal = pick(choice, n, g.ExternalTrafficPolicyLocal)
	nports := n * g.Ports.PerService
	d.named = pick(choice, nports, g.Ports.Named)
	d.udp = pick(choice, nports, g.Ports.UDP)
	d.perSvc = make([]int, n)
	total := 0
	for i := range d.perSvc {
		d.perSvc[i] = dist.draw(counts)
		total += d.perSvc[i]
	}
	d.notReady = pick(choice, total, g.NotReady)
	// Terminating endpoints are drawn among the ones that are not already
	// not-ready, so that the two fractions hold exactly.
	d.termAmong = pick(choice, total-countTrue(d.notReady), safeDiv(g.Terminating*float64(total), float64(total-countTrue(d.notReady))))
	return d
}

// generatedService builds the i-th generated Service with its cluster IP,
// policies, ports and (for externalTrafficPolicy Local) node ports, and the
// EndpointSlice ports that go with them. It reports false, having said
// why, when the service CIDR or the node-port range is exhausted.
func (e *expander) generatedService(d *genDraws, gc *GeneratedCounts, i int) (*corev1.Service, []discoveryv1.EndpointPort, bool) {
	g := e.sc.Generate
	ns, name := GeneratedServiceName(g, i)
	s := &corev1.Service{}
	s.Name, s.Namespace = name, ns
	s.Labels = map[string]string{generatedByLabel: "true"}
	s.Spec.Selector = map[string]string{"app": name}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	ip, ok := e.allocIP()
	if !ok {
		e.r.at("generate.services", "cluster.serviceCIDR %s cannot hold %d more Services; widen it", e.sc.Cluster.ServiceCIDR, g.Services)
		return nil, nil, false
	}
	s.Spec.ClusterIP = ip.String()
	s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	if d.affinity[i] {
		t := g.SessionAffinity.TimeoutSeconds
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
		gc.SessionAffinity++
	}
	itp := corev1.ServiceInternalTrafficPolicyCluster
	if d.itpLocal[i] {
		itp = corev1.ServiceInternalTrafficPolicyLocal
		gc.InternalTrafficPolicyLocal++
	}
	s.Spec.InternalTrafficPolicy = &itp
	if d.etpLocal[i] {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		gc.ExternalTrafficPolicyLocal++
	}
	ports := make([]discoveryv1.EndpointPort, g.Ports.PerService)
	for j := 0; j < g.Ports.PerService; j++ {
		pi := i*g.Ports.PerService + j
		proto := corev1.ProtocolTCP
		if d.udp[pi] {
			proto = corev1.ProtocolUDP
			gc.UDPPorts++
		}
		pname := GeneratedPortName(g, j, d.named[pi])
		if pname != "" {
			gc.NamedPorts++
		}
		sp := corev1.ServicePort{Name: pname, Protocol: proto, Port: g.Ports.Port + int32(j), TargetPort: intstr.FromInt32(g.Ports.TargetPort + int32(j))}
		s.Spec.Ports = append(s.Spec.Ports, sp)
		tp := sp.TargetPort.IntVal
		ports[j] = discoveryv1.EndpointPort{Name: &s.Spec.Ports[j].Name, Protocol: &s.Spec.Ports[j].Protocol, Port: &tp}
	}
	if !e.nodePorts.assign(s) {
		e.r.at("generate.externalTrafficPolicyLocal", "no node port left in %d-%d for the generated NodePort Services", NodePortMin, NodePortMax)
		return nil, nil, false
	}
	gc.ServicePorts += g.Ports.PerService
	return s, ports, true
}

// generatedEndpoints places a Service's k endpoints on nodes (placer),
// gives each the next address of
// its node's pod CIDR and its drawn conditions. It reports false, having
// said why, when a node's pod CIDR is full.
func (e *expander) generatedEndpoints(d *genDraws, gc *GeneratedCounts, k int) ([]discoveryv1.Endpoint, bool) {
	eps := make([]discoveryv1.Endpoint, k)
	conds := make([]bool, 3*k)
	pickNode := e.placer(d)
	for j := 0; j < k; j++ {
		ni := pickNode(j)
		addr, ok := e.nextPodIP(ni)
		if !ok {
			e.r.at("generate.endpointsPerService", "node %s's podCIDR %s is full: the generated endpoints need larger node blocks (cluster.nodeCIDRMaskSize) or more nodes", e.out.Nodes[ni].Name, e.nodeCIDR[ni])
			return nil, false
		}
		ready, serving, terminating := true, true, false
		if d.notReady[d.epIdx] {
			ready, serving = false, false
			gc.NotReadyEndpoints++
		} else {
			if d.termAmong[d.termIdx] {
				ready, terminating = false, true
				gc.TerminatingEndpoints++
			}
			d.termIdx++
		}
		d.epIdx++
		conds[3*j], conds[3*j+1], conds[3*j+2] = ready, serving, terminating
		node := &e.out.Nodes[ni].Name
		eps[j] = discoveryv1.Endpoint{
			Addresses:  []string{addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &conds[3*j], Serving: &conds[3*j+1], Terminating: &conds[3*j+2]},
			NodeName:   node,
			// No targetRef: generated endpoints have no Pod objects, and a
			// reference per endpoint would cost about 75 MB across the
			// clientset's and the informer's copies at 300,000 endpoints.
		}
		if z, ok := e.out.Nodes[ni].Labels[LabelZone]; ok {
			eps[j].Zone = &z
		}
	}
	return eps, true
}

func countTrue(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

func safeDiv(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return math.Min(1, a/b)
}

func (e *expander) nextPodIP(ni int) (netip.Addr, bool) {
	p := e.nodeCIDR[ni]
	a := e.nodeNext[ni]
	for e.nodeUsed[ni][a] {
		a = a.Next()
	}
	// Keep the block's broadcast address free.
	if !p.Contains(a) || !p.Contains(a.Next()) {
		return netip.Addr{}, false
	}
	e.nodeNext[ni] = a.Next()
	return a, true
}

// setHints writes the hints the EndpointSlice controller writes for a
// Service's trafficDistribution (staging/src/k8s.io/endpointslice/
// trafficdist): with PreferClose, PreferSameZone or PreferSameNode every
// ready endpoint gets a zone hint for its own zone (when it has one), and
// with PreferSameNode also a node hint for its own node; endpoints that are
// not ready keep none, and without a trafficDistribution no endpoint has a
// hint. kube-proxy then uses the hints only when every endpoint has one
// (pkg/proxy/topology.go), which the oracle and dataplane/proxy model.
func setHints(s *corev1.Service, eps []discoveryv1.Endpoint) {
	d := s.Spec.TrafficDistribution
	if d == nil {
		return
	}
	sameNode := *d == corev1.ServiceTrafficDistributionPreferSameNode
	switch *d {
	case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone, corev1.ServiceTrafficDistributionPreferSameNode:
	default:
		return
	}
	for i := range eps {
		e := &eps[i]
		if e.Conditions.Ready == nil || !*e.Conditions.Ready {
			continue
		}
		var h discoveryv1.EndpointHints
		if e.Zone != nil {
			h.ForZones = []discoveryv1.ForZone{{Name: *e.Zone}}
		}
		if sameNode && e.NodeName != nil {
			h.ForNodes = []discoveryv1.ForNode{{Name: *e.NodeName}}
		}
		if h.ForZones != nil || h.ForNodes != nil {
			e.Hints = &h
		}
	}
}

// placer returns the node of a Service's j-th endpoint under
// generate.placement: spread (round robin from a node drawn per Service),
// random (uniform), skewed (Zipf weights 1/r^s over the nodes in an order
// drawn per Service) or weighted (smooth weighted round robin over
// nodeWeights, so that k endpoints split as the weights do, exactly when
// k is a multiple of their sum).
func (e *expander) placer(d *genDraws) func(j int) int {
	g := e.sc.Generate
	nnodes := len(e.out.Nodes)
	switch g.Placement {
	case "random":
		return func(int) int { return d.place.IntN(nnodes) }
	case "skewed":
		order := d.place.Perm(nnodes)
		cum := make([]float64, nnodes)
		sum := 0.0
		for r := range order {
			sum += math.Pow(float64(r+1), -g.PlacementSkew)
			cum[r] = sum
		}
		return func(int) int {
			x := d.place.Float64() * sum
			r, _ := slices.BinarySearch(cum, x)
			return order[min(r, nnodes-1)]
		}
	case "weighted":
		w := make([]float64, nnodes)
		total := 0.0
		for i, n := range e.out.Nodes {
			w[i] = g.NodeWeights[n.Name]
			total += w[i]
		}
		cur := make([]float64, nnodes)
		return func(int) int {
			best := -1
			for i := range cur {
				if w[i] == 0 {
					continue
				}
				cur[i] += w[i]
				if best < 0 || cur[i] > cur[best] {
					best = i
				}
			}
			cur[best] -= total
			return best
		}
	}
	offset := d.place.IntN(nnodes)
	return func(j int) int { return (offset + j) % nnodes }
}
