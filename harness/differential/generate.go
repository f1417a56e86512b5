package differential

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// GenConfig is the cluster the random scenarios are drawn for.
type GenConfig struct {
	// Node is the compared node (endpoints on it are local); Zone its zone.
	Node, Zone string
	// Others are other nodes, by name, with their zones; endpoints are
	// spread over Node and these. Node objects are not generated: kube-proxy
	// reads only its own.
	Others map[string]string
	// ServiceCIDR holds every ClusterIP; a scenario takes 16 addresses of
	// it from its seed (ipCycle blocks of them; the first block is left to
	// the apiserver's own kubernetes Service, the last to the ballast).
	ServiceCIDR netip.Prefix
	// PodCIDR holds every endpoint address; a scenario takes a /20 of it
	// from its seed.
	PodCIDR netip.Prefix
}

// DefaultGenConfig is the cluster the differential test uses: node
// "diff-node" in zone-a, two other nodes (zone-a, zone-b), services in
// 10.96.0.0/16, pods in 10.128.0.0/9.
func DefaultGenConfig() GenConfig {
	return GenConfig{
		Node: "diff-node", Zone: "zone-a",
		Others:      map[string]string{"node-b": "zone-a", "node-c": "zone-b"},
		ServiceCIDR: netip.MustParsePrefix("10.96.0.0/16"),
		PodCIDR:     netip.MustParsePrefix("10.128.0.0/9"),
	}
}

// MaxSeeds bounds the seeds that may share one API at once: their
// ClusterIPs, pod blocks and node ports are disjoint when the seeds are
// distinct modulo MaxSeeds.
const MaxSeeds = 230

// node ports: each scenario owns portsPerSeed ports from nodePortBase (the
// apiserver's default range, 30000-32767, holds MaxSeeds of them): three
// per Service, its first two ports' node ports and its health check port.
const (
	nodePortBase = 30000
	portsPerSeed = 12
)

// Scenario is one seeded random scenario: the objects of its namespace after
// each step and the writes that lead there.
type Scenario struct {
	Seed      uint64
	Namespace string
	// Node is the compared node the scenario was drawn for.
	Node  string
	Steps []Step
	// IPs are the scenario's ClusterIPs and endpoint addresses, to tell
	// which scenario a differing rule belongs to.
	IPs map[netip.Addr]bool
}

// Step is one event of a scenario. Step 0 creates the objects.
type Step struct {
	// What names the actions of the step, e.g. "create", "ready-flip s1".
	What []string
	// Services and Slices are created or updated (Upsert); the rest deleted.
	Services       []*corev1.Service
	Slices         []*discoveryv1.EndpointSlice
	DeleteServices []types.NamespacedName
	DeleteSlices   []types.NamespacedName
	// Endpoints is the number of endpoints after the step as kube-proxy
	// counts them for its large-cluster threshold: per service port (a
	// slice's endpoints once for each of its ports), over every slice of
	// every Service of the scenario.
	Endpoints int
	// Peak bounds the scenario's endpoints at any moment of the step,
	// whatever order its writes reach a proxy in: per slice present before
	// or after it, the larger of its two sizes.
	Peak int
}

// Writes is the number of API writes of the step.
func (s *Step) Writes() int {
	return len(s.Services) + len(s.Slices) + len(s.DeleteServices) + len(s.DeleteSlices)
}

// gen is the state of one scenario being drawn.
type gen struct {
	cfg   GenConfig
	r     *rand.Rand
	seed  uint64
	ns    string
	svcs  []*svcModel // by index; nil once deleted
	ips   map[netip.Addr]bool
	nextP uint32 // offset of the next pod address in the scenario's block
}

// svcModel is one Service and its slices as the generator keeps them.
type svcModel struct {
	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
	// hints is how its endpoints are hinted: "", "zone", "node", "partial".
	hints string
}

// Generate draws the scenario of seed: 1-4 Services in namespace d-<seed>,
// then 1-4 further steps of changes (fewer when every Service is gone and
// no other fits). The same seed and config give the same
// objects and steps.
func Generate(seed uint64, cfg GenConfig) *Scenario {
	g := &gen{cfg: cfg, r: rand.New(rand.NewPCG(seed, 0x6b707369)), seed: seed, ns: fmt.Sprintf("d-%d", seed), ips: map[netip.Addr]bool{}}
	sc := &Scenario{Seed: seed, Namespace: g.ns, Node: cfg.Node, IPs: g.ips}
	first := Step{What: []string{"create"}}
	n := 1 + g.r.IntN(4)
	for i := range n {
		m := g.newService(i)
		g.svcs = append(g.svcs, m)
		first.Services = append(first.Services, m.svc)
		first.Slices = append(first.Slices, m.slices...)
	}
	first.Endpoints = g.endpoints()
	first.Peak = first.Endpoints
	sc.Steps = append(sc.Steps, first)
	steps := 1 + g.r.IntN(4)
	for range steps {
		before := g.sliceSizes()
		st := g.step()
		if len(st.What) == 0 {
			break // every Service deleted and no room for another
		}
		st.Endpoints = g.endpoints()
		st.Peak = peak(before, g.sliceSizes())
		sc.Steps = append(sc.Steps, st)
	}
	return sc
}

func (g *gen) endpoints() int {
	n := 0
	for _, v := range g.sliceSizes() {
		n += v
	}
	return n
}

// sliceSizes is the endpoints of each slice of the live Services, by name,
// once per port (as Step.Endpoints counts them).
func (g *gen) sliceSizes() map[string]int {
	out := map[string]int{}
	for _, m := range g.svcs {
		if m == nil {
			continue
		}
		for _, s := range m.slices {
			out[s.Name] = len(s.Endpoints) * len(s.Ports)
		}
	}
	return out
}

// peak sums, over the slices of before and after, the larger size.
func peak(before, after map[string]int) int {
	n := 0
	for k, v := range before {
		n += max(v, after[k])
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			n += v
		}
	}
	return n
}

// Peak is the most endpoints the scenario has at any moment (Step.Peak of
// its steps).
func (sc *Scenario) Peak() int {
	n := 0
	for _, st := range sc.Steps {
		n = max(n, st.Peak)
	}
	return n
}

// clusterIP is the i-th ClusterIP of the scenario, in its seed's block of
// 16 (ipCycle).
func (g *gen) clusterIP(i int) netip.Addr {
	a := g.cfg.ServiceCIDR.Masked().Addr().As4()
	v := be32(a) + 16 + uint32(g.seed%ipCycle(g.cfg.ServiceCIDR))*16 + uint32(i)
	ip := from32(v)
	g.ips[ip] = true
	return ip
}

// ipCycle is how many seeds in a row take distinct ClusterIP blocks: the
// largest multiple of MaxSeeds (so that seeds distinct modulo MaxSeeds stay
// disjoint) whose blocks fit the service CIDR between its first block (the
// apiserver's kubernetes Service) and its last (the ballast), 3,910 in a
// /16. Seeds that share one API batch after batch then never take an
// address an earlier batch's Service held: with blocks cycling every
// MaxSeeds, seed 341 creating 10.96.7.2 after seed 111's Services had been
// deleted, some batches earlier, failed with "provided IP is already
// allocated" (once, in a fresh-clone run: kube-apiserver still held the
// address).
func ipCycle(cidr netip.Prefix) uint64 {
	blocks := uint64(1)<<(32-cidr.Bits())/16 - 2
	if c := blocks / MaxSeeds * MaxSeeds; c > 0 {
		return c
	}
	return MaxSeeds
}

// podIP is the next endpoint address of the scenario: from a random offset
// onwards, so that a scenario's addresses cross a decimal length (x.x.x.9
// to x.x.x.10), where kube-proxy's string order and a numeric one differ.
func (g *gen) podIP() netip.Addr {
	if g.nextP == 0 {
		g.nextP = 2 + uint32(g.r.IntN(12))
	}
	a := g.cfg.PodCIDR.Masked().Addr().As4()
	v := be32(a) + uint32(g.seed%MaxSeeds)<<12 + g.nextP
	g.nextP++
	if g.nextP%256 == 0 || g.nextP%256 == 255 {
		g.nextP += 2
	}
	ip := from32(v)
	g.ips[ip] = true
	return ip
}

func be32(a [4]byte) uint32 {
	return uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}

func from32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// nodePort is the k-th node port of service i: k 0 and 1 for its ports,
// 2 for its health check.
func (g *gen) nodePort(i, k int) int32 {
	return int32(nodePortBase + int(g.seed%MaxSeeds)*portsPerSeed + i*3 + k)
}

// pick returns one of vs by weight: weights[i] for vs[i].
func pick[T any](r *rand.Rand, vs []T, weights []int) T {
	total := 0
	for _, w := range weights {
		total += w
	}
	x := r.IntN(total)
	for i, w := range weights {
		if x < w {
			return vs[i]
		}
		x -= w
	}
	return vs[len(vs)-1]
}

var protocols = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}

// newService draws Service i with its slices.
func (g *gen) newService(i int) *svcModel {
	name := fmt.Sprintf("s%d", i)
	typ := pick(g.r, []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}, []int{6, 2, 1})
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: g.ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:      typ,
			ClusterIP: g.clusterIP(i).String(),
		},
	}
	nports := pick(g.r, []int{1, 2, 3}, []int{6, 3, 1})
	if typ != corev1.ServiceTypeClusterIP {
		nports = min(nports, 2)
	}
	for p := range nports {
		sp := corev1.ServicePort{
			Protocol: pick(g.r, protocols, []int{7, 2, 1}),
			Port:     int32(80 + p*1000 + g.r.IntN(900)),
		}
		if nports > 1 || g.r.IntN(2) == 0 {
			sp.Name = fmt.Sprintf("p%d", p)
		}
		if sp.Name != "" && g.r.IntN(3) == 0 {
			sp.TargetPort = intstr.FromString("t" + sp.Name) // a named target port
		} else {
			sp.TargetPort = intstr.FromInt32(8000 + int32(p))
		}
		if typ != corev1.ServiceTypeClusterIP {
			sp.NodePort = g.nodePort(i, p)
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	g.externals(svc, i)
	g.policies(svc, i)
	m := &svcModel{svc: svc}
	m.hints = pick(g.r, []string{"", "zone", "node", "partial"}, []int{5, 2, 2, 1})
	switch m.hints {
	case "zone":
		svc.Spec.TrafficDistribution = ptr.To(pick(g.r, []string{corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone}, []int{1, 1}))
	case "node":
		svc.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)
	}
	g.newSlices(m)
	return m
}

// policies draws the affinity and traffic policies of svc (service index i).
func (g *gen) policies(svc *corev1.Service, i int) {
	if g.r.IntN(4) == 0 {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		if g.r.IntN(2) == 0 {
			svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{
				TimeoutSeconds: ptr.To(pick(g.r, []int32{1, 60, 300, 10800, 86400}, []int{1, 2, 2, 1, 1})),
			}}
		}
	}
	if g.r.IntN(4) == 0 {
		svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	}
	if externallyAccessible(svc) && g.r.IntN(2) == 0 {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			svc.Spec.HealthCheckNodePort = g.nodePort(i, 2)
		}
	}
}

// externallyAccessible is apiservice.ExternallyAccessible.
func externallyAccessible(s *corev1.Service) bool {
	return s.Spec.Type != corev1.ServiceTypeClusterIP || len(s.Spec.ExternalIPs) > 0
}

// externalAddr is the k-th external address of service i of the scenario
// (external IPs k 0-1, load-balancer ingress k 2-4): 100.64.0.0/10 (RFC
// 6598, outside every cluster range of the comparison), one /24 per seed
// modulo MaxSeeds.
func (g *gen) externalAddr(i, k int) netip.Addr {
	ip := netip.AddrFrom4([4]byte{100, 64 + byte(g.seed%MaxSeeds/256), byte(g.seed % MaxSeeds % 256), byte(1 + i*8 + k)})
	g.ips[ip] = true
	return ip
}

// sourceRanges are the loadBalancerSourceRanges drawn from: one with the
// spaces the API allows, one holding the compared node's address (kube-
// proxy then lets the node reach its load-balancer IPs), the pod range, and
// the zero CIDR (allow any, the same as none).
var sourceRanges = []string{" 203.0.113.0/25", "198.51.100.0/24", "198.18.0.0/15", "10.128.0.0/9", "0.0.0.0/0"}

// externals draws service i's external destinations: external IPs (any
// type), and for a LoadBalancer its ingress (as a controller writes it to
// the status: VIP-mode, Proxy-mode or hostname-only entries) and source
// ranges.
func (g *gen) externals(svc *corev1.Service, i int) {
	if g.r.IntN(4) == 0 {
		for k := range 1 + g.r.IntN(2) {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, g.externalAddr(i, k).String())
		}
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return
	}
	if g.r.IntN(4) != 0 {
		svc.Status.LoadBalancer.Ingress = g.ingress(i)
	}
	if g.r.IntN(2) == 0 {
		svc.Spec.LoadBalancerSourceRanges = g.ranges()
	}
}

// ingress draws 1-3 load-balancer ingress entries of service i.
func (g *gen) ingress(i int) []corev1.LoadBalancerIngress {
	var out []corev1.LoadBalancerIngress
	for k := range 1 + g.r.IntN(3) {
		in := corev1.LoadBalancerIngress{IP: g.externalAddr(i, 2+k).String()}
		switch pick(g.r, []string{"vip", "nil", "proxy", "hostname"}, []int{4, 3, 2, 1}) {
		case "vip":
			in.IPMode = ptr.To(corev1.LoadBalancerIPModeVIP)
		case "proxy":
			in.IPMode = ptr.To(corev1.LoadBalancerIPModeProxy)
		case "hostname":
			in = corev1.LoadBalancerIngress{Hostname: fmt.Sprintf("lb-%d-%d.example.com", i, k)}
		}
		out = append(out, in)
	}
	return out
}

// ranges draws 1-2 distinct source ranges.
func (g *gen) ranges() []string {
	n := 1 + g.r.IntN(2)
	perm := g.r.Perm(len(sourceRanges))
	var out []string
	for _, j := range perm[:n] {
		out = append(out, sourceRanges[j])
	}
	return out
}

// size draws the number of endpoints of a slice: mostly a few, sometimes
// none, sometimes hundreds (batches then cross kube-proxy's 1,000-endpoint
// large-cluster threshold).
func (g *gen) size() int {
	switch pick(g.r, []int{0, 1, 2}, []int{2, 16, 1}) {
	case 0:
		return 0
	case 1:
		return 1 + g.r.IntN(12)
	}
	return 100 + g.r.IntN(400)
}

// newSlices draws the slices of m: none (a Service without endpoints) or
// one to three.
func (g *gen) newSlices(m *svcModel) {
	n := pick(g.r, []int{0, 1, 2, 3}, []int{1, 6, 2, 1})
	for k := range n {
		m.slices = append(m.slices, g.newSlice(m, k, g.size()))
	}
}

// newSlice draws slice k of m with n endpoints.
func (g *gen) newSlice(m *svcModel, k, n int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: g.ns,
			Name:      m.svc.Name + "-" + strconv.Itoa(k),
			Labels: map[string]string{
				discoveryv1.LabelServiceName: m.svc.Name,
				discoveryv1.LabelManagedBy:   "kpsim-differential",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range m.svc.Spec.Ports {
		port := p.TargetPort.IntVal
		if p.TargetPort.Type == intstr.String {
			port = 9000 + p.Port%100
		}
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(port)})
	}
	for range n {
		s.Endpoints = append(s.Endpoints, g.newEndpoint(m))
	}
	return s
}

// nodes lists the compared node and the others, sorted after it.
func (g *gen) nodes() []string {
	out := []string{g.cfg.Node}
	others := make([]string, 0, len(g.cfg.Others))
	for n := range g.cfg.Others {
		others = append(others, n)
	}
	slices.Sort(others)
	return append(out, others...)
}

func (g *gen) zoneOf(node string) string {
	if node == g.cfg.Node {
		return g.cfg.Zone
	}
	return g.cfg.Others[node]
}

// newEndpoint draws an endpoint of m: its node, conditions and hints.
func (g *gen) newEndpoint(m *svcModel) discoveryv1.Endpoint {
	nodes := g.nodes()
	node := nodes[g.r.IntN(len(nodes))]
	e := discoveryv1.Endpoint{
		Addresses: []string{g.podIP().String()},
		NodeName:  ptr.To(node),
		Zone:      ptr.To(g.zoneOf(node)),
		TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: g.ns, Name: fmt.Sprintf("pod-%d", g.nextP)},
	}
	setConditions(&e, pick(g.r, []string{"ready", "nil", "terminating-serving", "terminating", "not-ready"}, []int{12, 2, 2, 1, 2}))
	g.hint(m, &e)
	return e
}

// setConditions sets an endpoint's conditions by name.
func setConditions(e *discoveryv1.Endpoint, c string) {
	switch c {
	case "ready":
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	case "nil":
		e.Conditions = discoveryv1.EndpointConditions{}
	case "terminating-serving":
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	case "terminating":
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	default:
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	}
}

// hint sets e's hints as the EndpointSlice controller would for m's
// trafficDistribution: zone hints (its own zone), node hints (its own node,
// plus the zone), or, for "partial", hints on some endpoints only (which
// makes kube-proxy ignore them).
func (g *gen) hint(m *svcModel, e *discoveryv1.Endpoint) {
	zone := *e.Zone
	switch m.hints {
	case "zone":
		e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
	case "node":
		e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}, ForNodes: []discoveryv1.ForNode{{Name: *e.NodeName}}}
	case "partial":
		if g.r.IntN(2) == 0 {
			e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
		}
	}
}

func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
