package scenario

// A cluster dump is what kubectl prints for a real cluster, unchanged:
// `kubectl get nodes,pods,svc,endpointslices -A -o yaml` (a v1 List), the
// same for one kind, a single object, or several YAML documents. Load reads
// such a file as a scenario: its objects become the objects section, and the
// rest of the scenario (cluster ranges, proxy settings, traffic, checks) is
// inferred here, each inference named in a warning. `sim import` writes the
// same scenario to a file (Imported).

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Defaults of a scenario made from a dump.
const (
	// ImportConnections is the traffic section's total: enough for a
	// distribution check at the default α, MDE and power on a handful of
	// endpoints, small enough that sim run of a dump takes seconds.
	ImportConnections = 100000
	// importMinBits is how far an inferred range is widened (if that
	// overlaps no other range): what kind and kubeadm use for the service
	// and pod ranges, and room around the nodes' addresses.
	importMinBits = 16
)

// isDump reports whether a document's root is a Kubernetes object or List
// rather than a Scenario: it has a kind that is not Scenario and an
// apiVersion outside kpsim.dev.
func isDump(root *yaml.Node) bool {
	if root.Kind != yaml.MappingNode {
		return false
	}
	av, okAV := scalarField(root, "apiVersion")
	kd, okK := scalarField(root, "kind")
	if !okAV || !okK || kd.Value == "" || kd.Value == Kind {
		return false
	}
	return !strings.HasPrefix(av.Value, "kpsim.dev/")
}

// decodeDump reads a cluster dump's documents as the objects of a scenario
// and infers the rest. Object paths are items[i] for a single List (what
// kubectl prints), documents[d] (documents[d].items[i]) otherwise.
func decodeDump(file string, docs []*yaml.Node) (*Loaded, error) {
	w := &walker{rep: reporter{file: file, pos: map[string]Pos{}}}
	w.rep.pos[""] = Pos{docs[0].Line, docs[0].Column}
	if len(docs) == 1 && isList(docs[0]) {
		w.list(docs[0], "")
	} else {
		for i, d := range docs {
			w.object(d, fmt.Sprintf("documents[%d]", i))
		}
	}
	sc := &Scenario{
		APIVersion: APIVersion,
		Kind:       Kind,
		Metadata:   Metadata{Name: NameFromFile(file), Description: "imported from " + filepath.Base(file)},
		Objects:    w.objects,
	}
	l := &Loaded{File: file, Scenario: sc, pos: w.rep.pos, structural: w.rep.errs, Warnings: w.warns}
	if len(w.rep.errs) == 0 {
		imp := inferImport(sc.Objects)
		imp.apply(sc)
		l.Warnings = append(l.Warnings, imp.warnings(file, w.rep.pos[""])...)
	}
	return l, nil
}

// isList says whether n is kubectl's List (kind List, apiVersion v1 or
// none): the one rule for a dump's top level and for an item of objects, so
// that what sim import accepts loads again as a scenario.
func isList(n *yaml.Node) bool {
	kd, ok := scalarField(n, "kind")
	av, avScalar := scalarField(n, "apiVersion")
	return ok && kd.Value == "List" && (av == nil || avScalar && (av.Value == "v1" || av.Value == ""))
}

// NameFromFile makes a scenario name (a DNS subdomain) from a file name:
// kind-dump.yaml gives kind-dump.
func NameFromFile(file string) string {
	base := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(file), ".yaml"), ".yml")
	var b strings.Builder
	for _, r := range strings.ToLower(base) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-.")
	if len(name) > 63 {
		name = strings.Trim(name[:63], "-.")
	}
	if name == "" {
		name = "imported"
	}
	return name
}

// imported is what a dump's objects say about the cluster around them.
type imported struct {
	serviceCIDR, podCIDR, nodeNetwork netip.Prefix
	// counts behind each inference, for the warnings
	nClusterIPs, nPodAddrs, nNodeAddrs int
	nodes                              []NodeSpec // nodes named by endpoints when the dump has no Node
	checks                             []Check
}

// dumpAddrs is what a dump's objects use of the IPv4 address space.
type dumpAddrs struct {
	svcIPs, podAddrs, nodeAddrs []netip.Addr
	podBlocks                   []netip.Prefix          // the Nodes' pod blocks
	nodeIP                      map[netip.Addr]bool     // the Nodes' InternalIPs
	hasNodes                    bool                    // the dump holds a Node object
	byNode                      map[string][]netip.Addr // pod and endpoint addresses per node name
}

// inferImport derives the cluster ranges that cover what the objects use,
// the nodes when the dump holds no Node object, and the default checks.
func inferImport(objs []Object) *imported {
	a := collectAddrs(objs)
	imp := &imported{nClusterIPs: len(a.svcIPs), nPodAddrs: len(a.podAddrs), nNodeAddrs: len(a.nodeAddrs)}
	if !a.hasNodes {
		imp.nodes, a.podBlocks = nodesFromEndpoints(a.byNode, a.podBlocks)
	}
	imp.serviceCIDR, imp.podCIDR, imp.nodeNetwork = importRanges(a)
	imp.checks = defaultChecks(objs, a.nodeIP, imp.podCIDR)
	return imp
}

// collectAddrs reads the Nodes' addresses and pod blocks, then the
// ClusterIPs and the pod and endpoint addresses that are not a Node's own.
func collectAddrs(objs []Object) *dumpAddrs {
	a := &dumpAddrs{nodeIP: map[netip.Addr]bool{}, byNode: map[string][]netip.Addr{}}
	for _, o := range objs {
		if n, ok := o.Object.(*corev1.Node); ok {
			a.hasNodes = true
			if ip, ok := NodeIPv4(n); ok {
				a.nodeAddrs = append(a.nodeAddrs, ip)
				a.nodeIP[ip] = true
			}
			if p, ok := nodePodCIDRv4(n); ok {
				a.podBlocks = append(a.podBlocks, p)
			}
		}
	}
	seenSvc := map[netip.Addr]bool{}
	for _, o := range objs {
		switch x := o.Object.(type) {
		case *corev1.Service:
			for _, s := range append([]string{x.Spec.ClusterIP}, x.Spec.ClusterIPs...) {
				if ip, err := netip.ParseAddr(s); err == nil && ip.Is4() && !seenSvc[ip] {
					seenSvc[ip] = true
					a.svcIPs = append(a.svcIPs, ip)
				}
			}
		case *corev1.Pod:
			if x.Spec.HostNetwork {
				continue
			}
			if ip, ok := PodIPv4(x); ok && !a.nodeIP[ip] {
				a.podAddrs = append(a.podAddrs, ip)
				a.byNode[x.Spec.NodeName] = append(a.byNode[x.Spec.NodeName], ip)
			}
		case *discoveryv1.EndpointSlice:
			if x.AddressType != discoveryv1.AddressTypeIPv4 {
				continue
			}
			for _, e := range x.Endpoints {
				if e.NodeName == nil || *e.NodeName == "" || len(e.Addresses) == 0 {
					continue // default/kubernetes: the API server's addresses
				}
				if ip, err := netip.ParseAddr(e.Addresses[0]); err == nil && ip.Is4() && !a.nodeIP[ip] {
					a.podAddrs = append(a.podAddrs, ip)
					a.byNode[*e.NodeName] = append(a.byNode[*e.NodeName], ip)
				}
			}
		}
	}
	return a
}

// nodesFromEndpoints makes the nodes of a dump without Node objects
// (kubectl get svc,endpointslices): the ones the endpoints name, each with
// the smallest /24 or wider block that holds its endpoints when that
// overlaps no other block; node-1 when they name none. It returns the
// blocks with the new ones added.
func nodesFromEndpoints(byNode map[string][]netip.Addr, podBlocks []netip.Prefix) ([]NodeSpec, []netip.Prefix) {
	names := make([]string, 0, len(byNode))
	for n := range byNode {
		if n != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var nodes []NodeSpec
	for _, n := range names {
		ns := NodeSpec{Name: n}
		if p, ok := cover(byNode[n], nil); ok {
			if p.Bits() > 24 {
				p = netip.PrefixFrom(p.Addr(), 24).Masked()
			}
			if !overlapsAny(p, podBlocks) {
				podBlocks = append(podBlocks, p)
				ns.PodCIDR = p.String()
			}
		}
		nodes = append(nodes, ns)
	}
	if len(nodes) == 0 {
		// kubectl get svc: no node at all; one to run the clients on.
		nodes = []NodeSpec{{Name: "node-1"}}
	}
	return nodes, podBlocks
}

// importRanges are the service, pod and node ranges: each the smallest
// prefix that covers what the dump uses (the default when it uses none),
// widened towards importMinBits as far as it overlaps neither other.
func importRanges(a *dumpAddrs) (svc, pod, node netip.Prefix) {
	svc, okS := cover(a.svcIPs, nil)
	pod, okP := cover(a.podAddrs, a.podBlocks)
	node, okN := cover(a.nodeAddrs, nil)
	if !okS {
		svc = netip.MustParsePrefix(DefaultServiceCIDR)
	}
	if !okP {
		pod = netip.MustParsePrefix(DefaultPodCIDR)
	}
	if !okN {
		node = netip.MustParsePrefix(DefaultNodeNetwork)
	}
	ranges := []*netip.Prefix{&svc, &pod, &node}
	for i, r := range ranges {
		var others []netip.Prefix
		for j, o := range ranges {
			if j != i {
				others = append(others, *o)
			}
		}
		*r = widen(*r, importMinBits, others)
	}
	return svc, pod, node
}

// apply writes the inferred sections into a scenario made from a dump.
func (imp *imported) apply(sc *Scenario) {
	sc.Cluster.ServiceCIDR = imp.serviceCIDR.String()
	sc.Cluster.PodCIDR = imp.podCIDR.String()
	sc.Cluster.NodeNetwork = imp.nodeNetwork.String()
	sc.Cluster.NodeCIDRMaskSize = max(DefaultNodeCIDRMaskSize, imp.podCIDR.Bits())
	sc.Cluster.Nodes = imp.nodes
	sc.Traffic = &Traffic{Clients: []Client{{Name: "probe"}}, Connections: ImportConnections}
	sc.Checks = imp.checks
}

// warnings say what was inferred, at the dump's first line.
func (imp *imported) warnings(file string, at Pos) ErrorList {
	w := func(field, format string, args ...any) *FieldError {
		return &FieldError{File: file, Pos: at, Field: field, Message: fmt.Sprintf(format, args...)}
	}
	out := ErrorList{
		w("cluster.serviceCIDR", "inferred as %s, covering the dump's %d IPv4 ClusterIPs", imp.serviceCIDR, imp.nClusterIPs),
		w("cluster.podCIDR", "inferred as %s, covering the nodes' pod blocks and %d pod and endpoint addresses", imp.podCIDR, imp.nPodAddrs),
		w("cluster.nodeNetwork", "inferred as %s, covering %d node InternalIPs", imp.nodeNetwork, imp.nNodeAddrs),
		w("traffic", "one client on every node, %d connections to every Service (default proxy settings: iptables mode)", ImportConnections),
	}
	if len(imp.nodes) > 0 {
		names := make([]string, len(imp.nodes))
		for i, n := range imp.nodes {
			names[i] = n.Name
		}
		out = append(out, w("cluster.nodes", "the dump has no Node object: nodes %s are the ones its endpoints name (node-1 when they name none)", strings.Join(names, ", ")))
	}
	if len(imp.checks) == 0 {
		out = append(out, w("checks", "no Service port has ready endpoints in pod networks: no check"))
	} else {
		out = append(out, w("checks", "%d checks: distribution (affinity, internal-traffic-local) on every TCP or UDP Service port whose ready endpoints are all in pod networks", len(imp.checks)))
	}
	return out
}

// NodeIPv4 is a Node's first IPv4 InternalIP, as kube-proxy picks its node
// address in an IPv4 cluster.
func NodeIPv4(n *corev1.Node) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// nodePodCIDRv4 is a Node's IPv4 pod block: spec.podCIDR, or the IPv4
// entry of spec.podCIDRs on a dual-stack node whose primary family is IPv6.
func nodePodCIDRv4(n *corev1.Node) (netip.Prefix, bool) {
	for _, s := range append([]string{n.Spec.PodCIDR}, n.Spec.PodCIDRs...) {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// PodIPv4 is a Pod's IPv4 address (status.podIP, or the IPv4 entry of
// status.podIPs).
func PodIPv4(p *corev1.Pod) (netip.Addr, bool) {
	cands := []string{p.Status.PodIP}
	for _, x := range p.Status.PodIPs {
		cands = append(cands, x.IP)
	}
	for _, s := range cands {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// cover is the smallest prefix that holds every address and prefix given.
func cover(addrs []netip.Addr, prefixes []netip.Prefix) (netip.Prefix, bool) {
	var lo, hi uint32
	first := true
	add := func(a, b uint32) {
		if first || a < lo {
			lo = a
		}
		if first || b > hi {
			hi = b
		}
		first = false
	}
	for _, a := range addrs {
		v := u32(a)
		add(v, v)
	}
	for _, p := range prefixes {
		p = p.Masked()
		v := u32(p.Addr())
		add(v, v|uint32((uint64(1)<<(32-p.Bits()))-1))
	}
	if first {
		return netip.Prefix{}, false
	}
	bits := 32
	for bits > 0 && lo>>(32-bits) != hi>>(32-bits) {
		bits--
	}
	return netip.PrefixFrom(a4(lo), bits).Masked(), true
}

// widen shortens p's prefix up to minBits as long as it overlaps none of
// others.
func widen(p netip.Prefix, minBits int, others []netip.Prefix) netip.Prefix {
	for p.Bits() > minBits {
		q := netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
		if overlapsAny(q, others) {
			break
		}
		p = q
	}
	return p
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func a4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// checkPort is one Service port as defaultChecks sees it.
type checkPort struct {
	name  string
	ready int
	bad   bool // SCTP, or a ready endpoint outside the pod networks
}

// checkService is one Service as defaultChecks sees it.
type checkService struct {
	key             string // namespace/name
	affinity, local bool
	ports           []*checkPort
}

// defaultChecks are the checks a scenario made from a dump runs: per
// Service port that kube-proxy load-balances (an IPv4 ClusterIP, TCP or
// UDP: the probes of sim conform are TCP and UDP) and whose ready
// endpoints are all pod addresses (not a node's own address, not outside
// the pod range: sim conform counts at pod namespaces), an affinity check
// for a ClientIP Service, an internal-traffic-local check for an
// internalTrafficPolicy Local one, a distribution check otherwise.
func defaultChecks(objs []Object, nodeIP map[netip.Addr]bool, pods netip.Prefix) []Check {
	order, svcs := checkServices(objs)
	countReady(objs, svcs, nodeIP, pods)
	var out []Check
	for _, si := range order {
		for _, p := range si.ports {
			if p.bad || p.ready == 0 {
				continue
			}
			c := Check{Type: CheckDistribution, Service: si.key}
			switch {
			case si.local:
				c.Type = CheckInternalTrafficLocal
			case si.affinity:
				c.Type = CheckAffinity
			}
			if len(si.ports) > 1 {
				c.Port = p.name
			}
			out = append(out, c)
		}
	}
	return out
}

// checkServices lists the Services with an IPv4 ClusterIP (not
// ExternalName) in the dump's order, the first of two of one name, and
// indexes them by namespace/name.
func checkServices(objs []Object) ([]*checkService, map[string]*checkService) {
	var order []*checkService
	svcs := map[string]*checkService{}
	for _, o := range objs {
		s, ok := o.Object.(*corev1.Service)
		if !ok || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		a, err := netip.ParseAddr(s.Spec.ClusterIP)
		if err != nil || !a.Is4() {
			continue
		}
		ns := s.Namespace
		if ns == "" {
			ns = "default"
		}
		si := &checkService{key: ns + "/" + s.Name, affinity: s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP,
			local: s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal}
		for _, p := range s.Spec.Ports {
			si.ports = append(si.ports, &checkPort{name: p.Name, bad: p.Protocol == corev1.ProtocolSCTP})
		}
		if _, dup := svcs[si.key]; !dup {
			svcs[si.key] = si
			order = append(order, si)
		}
	}
	return order, svcs
}

// countReady counts each Service port's ready endpoints in the IPv4
// EndpointSlices and marks the port bad when one of them is not a pod
// address (unparsable, a node's own address, or outside pods).
func countReady(objs []Object, svcs map[string]*checkService, nodeIP map[netip.Addr]bool, pods netip.Prefix) {
	for _, o := range objs {
		sl, ok := o.Object.(*discoveryv1.EndpointSlice)
		if !ok || sl.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		ns := sl.Namespace
		if ns == "" {
			ns = "default"
		}
		si := svcs[ns+"/"+sl.Labels[discoveryv1.LabelServiceName]]
		if si == nil {
			continue
		}
		for _, sp := range sl.Ports {
			name := ""
			if sp.Name != nil {
				name = *sp.Name
			}
			var pi *checkPort
			for _, p := range si.ports {
				if p.name == name {
					pi = p
				}
			}
			if pi == nil {
				continue
			}
			for _, e := range sl.Endpoints {
				if e.Conditions.Ready != nil && !*e.Conditions.Ready || len(e.Addresses) == 0 {
					continue
				}
				a, err := netip.ParseAddr(e.Addresses[0])
				if err != nil || !a.Is4() || nodeIP[a] || !pods.Contains(a) {
					pi.bad = true
					continue
				}
				pi.ready++
			}
		}
	}
}
