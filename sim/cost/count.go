package cost

// What a node programs, counted from its service ports: kube-proxy
// v1.37.2's layout in each mode (pkg/proxy/{iptables,nftables,ipvs}/
// proxier.go), which dataplane/ renders rule for rule. render_test.go
// holds every count against those renderers' output, external Services
// included.

import (
	"iter"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Counts are the objects one node programs.
type Counts struct {
	Mode cluster.Mode `json:"mode"`
	// iptables: rules per table and chains.
	NatRules    int `json:"natRules,omitempty"`
	FilterRules int `json:"filterRules,omitempty"`
	Chains      int `json:"chains,omitempty"`
	// nftables: chains, rules, map and set elements, named sets (ClientIP
	// affinity's, besides the fixed ones), and anonymous sets and maps
	// (kube-proxy layout: a service port's inline numgen DNAT map when it
	// has two or more endpoints, its numgen verdict map under affinity, a
	// firewall chain's set of two or more source ranges).
	NFTChains   int `json:"nftChains,omitempty"`
	NFTRules    int `json:"nftRules,omitempty"`
	MapElements int `json:"mapElements,omitempty"`
	Sets        int `json:"sets,omitempty"`
	AnonSets    int `json:"anonSets,omitempty"`
	// ipvs: virtual servers, real servers, ipset entries, iptables rules.
	VirtualServers int `json:"virtualServers,omitempty"`
	RealServers    int `json:"realServers,omitempty"`
	IPSetEntries   int `json:"ipsetEntries,omitempty"`
	IPVSRules      int `json:"ipvsIptablesRules,omitempty"`
	// Objects is the size measure sync time is interpolated on: rules for
	// iptables, rules plus elements for nftables, real servers plus ipset
	// entries for IPVS.
	Objects int `json:"objects"`
	// Bytes is the size of a full restore / transaction.
	Bytes int `json:"bytes"`
}

// nftFixedSets are kube-proxy v1.37's named sets and maps of the table
// (cluster-ips, nodeport-ips, hairpin-connections, service-ips,
// service-nodeports, no-endpoint-services, no-endpoint-nodeports,
// firewall-ips); ClientIP affinity adds one per endpoint (Counts.Sets).
const nftFixedSets = 8

// Per-line sizes of kube-proxy's text, measured on rendered rules
// (render_test.go holds the totals within 10 % of dataplane/'s output).
const (
	bytesSvcRule      = 150 // -A KUBE-SERVICES ... cluster IP ... -j KUBE-SVC-...
	bytesMasqRule     = 160
	bytesProbRule     = 170
	bytesSepRule      = 110
	bytesAffinityRule = 190
	bytesNFTElement   = 90
	bytesNFTRule      = 120
	// bytesNFTInlineEndpoint is one "N : ip . port ," entry of an inline
	// DNAT map.
	bytesNFTInlineEndpoint = 24
	// bytesExtRule is a rule of a KUBE-EXT- or KUBE-FW- chain (comment,
	// a source match, the jump).
	bytesExtRule = 150
	// bytesIPVSObject is one netlink message or ipset entry.
	bytesIPVSObject = 64
)

// ServicePortInput is what the counting needs of one service port on a node.
type ServicePortInput struct {
	Name      cluster.ServicePortName
	Endpoints int // endpoints in the chain cluster-IP traffic goes to on this node (after policy)
	// Reachable are the endpoints with a chain of their own (iptables
	// KUBE-SEP-; nftables endpoint chains under affinity): those of every
	// policy chain the service port writes, all locally reachable.
	Reachable int
	// Local are the service port's endpoints on this node, whatever their
	// readiness: IPVS mode's KUBE-LOOP-BACK entries (kube-proxy walks the
	// whole endpoints map for hairpin masquerading). The rendering does not
	// know the node's endpoints; the caller sets it per node.
	Local    int
	Affinity bool // ClientIP
	Reject   bool // no usable endpoint anywhere: REJECT
	Drop     bool // internalTrafficPolicy Local without local endpoints: cluster-IP traffic dropped
	// External are its destinations for traffic from outside the cluster
	// (the zero value for a service port with none; engine.AddExternal
	// fills it).
	External External
}

// External is what a service port offers traffic from outside the cluster
// on one node: kube-proxy's node-port, external-IP, load-balancer and
// health-check objects.
type External struct {
	NodePort bool // spec.ports[].nodePort is set
	// HealthCheckNodePort: the Service has one (type LoadBalancer with
	// externalTrafficPolicy Local).
	HealthCheckNodePort bool
	ExternalIPs         int
	LoadBalancerIPs     int
	// SourceRanges are loadBalancerSourceRanges: with load-balancer IPs, a
	// firewall chain (iptables, nftables) or the KUBE-LOAD-BALANCER-FW and
	// -SOURCE-CIDR ipsets (IPVS).
	SourceRanges int
	// FromNode: a source range holds the node's address, so the
	// load-balancer IPs themselves are allowed sources too.
	FromNode bool
	// Local is externalTrafficPolicy Local.
	Local bool
	// Endpoints are the endpoints external traffic that is not
	// short-circuited reaches on this node: the external policy chain's
	// (0 under Local without a local endpoint: it is dropped); IPVS: each
	// external virtual server's real servers (syncEndpoint falls back to
	// the cluster's endpoints).
	Endpoints int
	// SameChain: external traffic goes to the policy chain cluster-IP
	// traffic goes to (both traffic policies Cluster, or both Local).
	SameChain bool
	// OtherChain are the endpoints of the policy chain the service port
	// writes besides the one cluster-IP traffic goes to (iptables
	// KUBE-SVC-/KUBE-SVL-, nftables service-/local-): the Local chain of
	// externalTrafficPolicy Local, or the Cluster chain that external
	// traffic or its short-circuits use under internalTrafficPolicy Local;
	// 0 for none.
	OtherChain int
	// NodeIPs are the node's addresses that take node ports (kube-proxy's
	// --nodeport-addresses, primary by default): IPVS writes a virtual
	// server on each. 0 counts as 1.
	NodeIPs int
}

// accessible reports a destination from outside (kube-proxy's
// ExternallyAccessible): a node port, an external IP or a load-balancer IP.
func (x *External) accessible() bool {
	return x.NodePort || x.ExternalIPs > 0 || x.LoadBalancerIPs > 0
}

func (x *External) nodeIPs() int { return max(x.NodeIPs, 1) }

// hasInternal: cluster-IP traffic has a policy chain to go to.
func (s *ServicePortInput) hasInternal() bool { return !s.Reject && !s.Drop }

// hasExternal: external traffic has endpoints to go to (kube-proxy's
// hasExternalEndpoints); without, it is rejected or dropped.
func (s *ServicePortInput) hasExternal() bool {
	return !s.Reject && (!s.External.Local || s.External.Endpoints > 0)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// LocalPort is a service port with endpoints on a node: its index in the
// inputs and how many (ServicePortInput.Local).
type LocalPort struct{ Port, N int32 }

// Locals indexes endpoints by node: for each of nodes, the service ports
// of eps (one endpoint list per input, in input order) with IPv4
// endpoints there, whatever their readiness, as dataplane/ipvs writes
// KUBE-LOOP-BACK. It is linear in the endpoints.
func Locals(nodes []string, eps [][]*cluster.Endpoint) [][]LocalPort {
	at := make(map[string]int, len(nodes))
	for i, n := range nodes {
		at[n] = i
	}
	out := make([][]LocalPort, len(nodes))
	for p, list := range eps {
		for _, e := range list {
			ni, ok := at[e.NodeName]
			if !ok || !e.IP.Is4() {
				continue
			}
			l := out[ni]
			if k := len(l) - 1; k >= 0 && l[k].Port == int32(p) {
				l[k].N++
				continue
			}
			out[ni] = append(l, LocalPort{Port: int32(p), N: 1})
		}
	}
	return out
}

// CountOn is Count on one node: in with the node's Locals set, and reset
// to zero when it returns, so one input slice serves every node.
func CountOn(mode cluster.Mode, in []ServicePortInput, local []LocalPort, masquerade bool) Counts {
	for _, l := range local {
		in[l.Port].Local = int(l.N)
	}
	c := Count(mode, in, masquerade)
	for _, l := range local {
		in[l.Port].Local = 0
	}
	return c
}

// Count computes a node's objects in one mode. masquerade says that a pod
// CIDR is known (kube-proxy's local-traffic detector): the per-Service
// masquerade rule is written, and the external chains short-circuit pod
// traffic.
func Count(mode cluster.Mode, in []ServicePortInput, masquerade bool) Counts {
	return count(mode, func(yield func(*ServicePortInput) bool) {
		for i := range in {
			if !yield(&in[i]) {
				return
			}
		}
	}, masquerade)
}

// countRepeated is Count over n copies of s, without n copies in memory
// (a calibration point's synthetic cluster has up to 30,000).
func countRepeated(mode cluster.Mode, s ServicePortInput, n int, masquerade bool) Counts {
	return count(mode, func(yield func(*ServicePortInput) bool) {
		for range n {
			if !yield(&s) {
				return
			}
		}
	}, masquerade)
}

// count is Count over the service ports in.
func count(mode cluster.Mode, in iter.Seq[*ServicePortInput], masquerade bool) Counts {
	switch mode {
	case cluster.ModeIPTables:
		return countIPTables(in, masquerade)
	case cluster.ModeNFTables:
		return countNFTables(in, masquerade)
	case cluster.ModeIPVS:
		return countIPVS(in)
	}
	return Counts{Mode: mode}
}

// countIPTables counts kube-proxy's iptables layout. The fixed part: nat
// KUBE-SERVICES, -NODEPORTS, -POSTROUTING and -MARK-MASQ with the three
// postrouting rules, the mark rule and KUBE-SERVICES' last rule (the jump to
// KUBE-NODEPORTS); filter KUBE-SERVICES, -EXTERNAL-SERVICES, -FORWARD,
// -NODEPORTS, -PROXY-FIREWALL and -FIREWALL with KUBE-FORWARD's three rules
// and the localnet DROP. Objects are the restore's lines without its table
// headers and COMMITs; the jumps from the built-in chains are not in it.
func countIPTables(in iter.Seq[*ServicePortInput], masquerade bool) Counts {
	c := Counts{Mode: cluster.ModeIPTables, Chains: 10, NatRules: 5, FilterRules: 4}
	for s := range in {
		c.iptablesPort(s, masquerade)
	}
	c.Objects = c.NatRules + c.FilterRules + c.Chains // restore lines
	return c
}

func (c *Counts) iptablesPort(s *ServicePortInput, masquerade bool) {
	c.Bytes += bytesSvcRule // the cluster IP's rule, nat or filter
	if s.hasInternal() {
		c.NatRules++ // KUBE-SERVICES
		if masquerade {
			c.NatRules++
			c.Bytes += bytesMasqRule
		}
		c.iptablesChain(s.Endpoints, s.Affinity)
	} else {
		c.FilterRules++ // filter KUBE-SERVICES: REJECT or DROP
	}
	c.iptablesChain(s.External.OtherChain, s.Affinity)
	c.Chains += s.Reachable // KUBE-SEP-: hairpin masquerade, DNAT
	c.NatRules += 2 * s.Reachable
	c.Bytes += 2 * s.Reachable * bytesSepRule
	if x := &s.External; x.accessible() || x.HealthCheckNodePort {
		c.iptablesExternal(s, masquerade)
	}
}

// iptablesChain is a policy chain of n endpoints: the statistic cascade,
// and one recent match per endpoint under affinity.
func (c *Counts) iptablesChain(n int, affinity bool) {
	if n == 0 {
		return
	}
	c.Chains++
	c.NatRules += n
	c.Bytes += n * bytesProbRule
	if affinity {
		c.NatRules += n
		c.Bytes += n * bytesAffinityRule
	}
}

// iptablesExternal counts kube-proxy's "Capture externalIPs",
// "load-balancer ingress", "nodeports" and "healthCheckNodePorts", the
// KUBE-EXT- chain and the KUBE-FW- chain of loadBalancerSourceRanges. The
// node port has two nat rules: kube-proxy's 127.0.0.0/8 one through the
// localhost_nps_accepted_pkts nfacct counter (written when the kernel has
// nfnetlink_acct, as this project's reference kernel does) and the port's.
func (c *Counts) iptablesExternal(s *ServicePortInput, podCIDR bool) {
	x := &s.External
	dests := x.ExternalIPs + x.LoadBalancerIPs
	lines := func(n *int, k, bytes int) {
		*n += k
		c.Bytes += k * bytes
	}
	if !s.Reject {
		lines(&c.NatRules, dests, bytesSvcRule) // KUBE-SERVICES
		if x.NodePort {
			lines(&c.NatRules, 2, bytesSvcRule) // KUBE-NODEPORTS
		}
	}
	if !s.hasExternal() {
		// filter KUBE-EXTERNAL-SERVICES: REJECT or DROP.
		lines(&c.FilterRules, dests+b2i(x.NodePort), bytesSvcRule)
	}
	if x.HealthCheckNodePort {
		lines(&c.FilterRules, 1, bytesSvcRule) // filter KUBE-NODEPORTS ACCEPT
	}
	if !s.Reject && x.accessible() {
		c.Chains++ // KUBE-EXT-
		lines(&c.NatRules, extChainRules(s, podCIDR), bytesExtRule)
	}
	if !s.Reject && x.LoadBalancerIPs > 0 && x.SourceRanges > 0 {
		c.Chains++ // KUBE-FW-: a rule per range (and per address from the node), then a comment
		lines(&c.NatRules, x.SourceRanges+b2i(x.FromNode)*x.LoadBalancerIPs+1, bytesExtRule)
		lines(&c.FilterRules, x.LoadBalancerIPs, bytesSvcRule) // KUBE-PROXY-FIREWALL DROP
	}
}

// extChainRules are the external chain's rules (iptables and nftables
// alike): for externalTrafficPolicy Cluster the masquerade mark; for Local
// the pod short-circuit (with a pod CIDR), the host's masquerade and its
// short-circuit; then the jump to the external policy chain when it has
// endpoints.
func extChainRules(s *ServicePortInput, podCIDR bool) int {
	if !s.External.Local {
		return 1 + b2i(s.hasExternal())
	}
	return b2i(podCIDR) + 2 + b2i(s.hasExternal())
}

// countNFTables counts kube-proxy's nftables layout. The fixed part (v1.37):
// 8 base chains and 7 regular ones (services, masquerading, reject-chain
// and the four checks) with their 21 rules (the service CIDR drop rule
// included); masquerading off-cluster traffic is one rule in services, not
// one per Service. Elements of nodeport-ips (the node's addresses) and
// hairpin-connections (the node's endpoints) are not counted.
func countNFTables(in iter.Seq[*ServicePortInput], masquerade bool) Counts {
	c := Counts{Mode: cluster.ModeNFTables, NFTChains: 15, NFTRules: 21}
	if masquerade {
		c.NFTRules++
	}
	for s := range in {
		c.nftablesPort(s, masquerade)
	}
	c.Objects = c.NFTRules + c.MapElements + c.NFTChains + c.Sets
	return c
}

func (c *Counts) nftablesPort(s *ServicePortInput, podCIDR bool) {
	c.MapElements += 2 // cluster-ips; service-ips or no-endpoint-services
	c.Bytes += 2 * bytesNFTElement
	if s.hasInternal() {
		c.nftablesChain(s.Endpoints, s.Affinity)
	}
	c.nftablesChain(s.External.OtherChain, s.Affinity)
	if s.Affinity && !s.Reject {
		// An endpoint chain (update, DNAT) and a set per endpoint.
		c.NFTChains += s.Reachable
		c.Sets += s.Reachable
		c.NFTRules += 2 * s.Reachable
		c.Bytes += 2 * s.Reachable * bytesNFTRule
	}
	if x := &s.External; x.accessible() {
		c.nftablesExternal(s, podCIDR)
	}
}

// nftablesChain is a policy chain of n endpoints. Without affinity: one
// DNAT rule, the endpoints inline in its numgen map: an anonymous map whose
// elements the kernel inserts one by one, as it does a named set's (one
// endpoint is a plain `dnat to`, no map: kube-proxy since PR #140723).
// Under ClientIP affinity: a lookup per endpoint and the numgen vmap
// (anonymous, even over one endpoint).
func (c *Counts) nftablesChain(n int, affinity bool) {
	if n == 0 {
		return
	}
	c.NFTChains++
	if !affinity {
		c.NFTRules++
		c.MapElements += n
		c.Bytes += bytesNFTRule + n*bytesNFTInlineEndpoint
		if n >= 2 {
			c.AnonSets++
		}
		return
	}
	c.AnonSets++
	c.NFTRules += 1 + n
	c.Bytes += (1 + n) * bytesNFTRule
}

// nftablesExternal counts a service port's elements in service-ips,
// service-nodeports, the no-endpoint maps and firewall-ips, its external
// chain and its firewall chain: one rule, `ip saddr != { ranges } drop`,
// whose set is anonymous when it has two or more entries (nft 1.0.6 turns
// a one-element set into a plain comparison: measured, `nft --debug=netlink`).
// kube-proxy writes the firewall chain whether or not there are endpoints.
func (c *Counts) nftablesExternal(s *ServicePortInput, podCIDR bool) {
	x := &s.External
	dests := x.ExternalIPs + x.LoadBalancerIPs
	elems := 0
	if !s.Reject {
		elems += dests + b2i(x.NodePort) // service-ips, service-nodeports
		c.NFTChains++                    // external-
		rules := extChainRules(s, podCIDR)
		c.NFTRules += rules
		c.Bytes += rules * bytesNFTRule
	}
	if !s.hasExternal() {
		elems += dests + b2i(x.NodePort) // no-endpoint-services, -nodeports
	}
	if x.LoadBalancerIPs > 0 && x.SourceRanges > 0 {
		elems += x.LoadBalancerIPs // firewall-ips
		c.NFTChains++              // firewall-
		c.NFTRules++
		c.Bytes += bytesNFTRule
		if srcs := x.SourceRanges + b2i(x.FromNode)*x.LoadBalancerIPs; srcs >= 2 {
			c.AnonSets++
			c.MapElements += srcs
			c.Bytes += srcs * bytesNFTInlineEndpoint
		}
	}
	c.MapElements += elems
	c.Bytes += elems * bytesNFTElement
}

// countIPVS counts kube-proxy's IPVS mode: a virtual server per cluster IP,
// external IP, load-balancer IP and node address of a node port, each with
// its real servers; the ipset entries (KUBE-IPVS-IPS, the addresses on
// kube-ipvs0, is not counted: Services share them); and the iptables rules,
// a fixed set whose rules for a set are written only when the set is not
// empty (ipvsLayout).
func countIPVS(in iter.Seq[*ServicePortInput]) Counts {
	c := Counts{Mode: cluster.ModeIPVS}
	var l ipvsLayout
	for s := range in {
		l.note(s)
		c.VirtualServers++
		c.RealServers += s.Endpoints
		c.IPSetEntries += 1 + s.Local // KUBE-CLUSTER-IP, KUBE-LOOP-BACK
		if x := &s.External; x.accessible() || x.HealthCheckNodePort {
			c.ipvsExternal(s)
		}
	}
	c.IPVSRules = l.rules()
	c.Objects = c.RealServers + c.VirtualServers + c.IPSetEntries
	c.Bytes = c.Objects * bytesIPVSObject // netlink messages
	return c
}

// ipvsExternal counts a service port's external virtual servers and ipset
// entries. Bitmap entries of a port shared by several service ports (a
// Service's health-check node port) are counted once per service port.
func (c *Counts) ipvsExternal(s *ServicePortInput) {
	x := &s.External
	vs := x.ExternalIPs + x.LoadBalancerIPs
	if x.NodePort {
		vs += x.nodeIPs()
	}
	c.VirtualServers += vs
	c.RealServers += vs * x.Endpoints
	lb := x.LoadBalancerIPs
	e := x.ExternalIPs + lb // KUBE-EXTERNAL-IP(-LOCAL), KUBE-LOAD-BALANCER
	if x.Local {
		e += lb // KUBE-LOAD-BALANCER-LOCAL
	}
	if lb > 0 && x.SourceRanges > 0 {
		e += lb * (1 + x.SourceRanges) // -FW, -SOURCE-CIDR
		e += lb * b2i(x.FromNode)      // -SOURCE-IP
	}
	if x.NodePort {
		n := 1 // a bitmap:port entry; SCTP's hash:ip,port has one per node address
		if s.Name.Protocol == corev1.ProtocolSCTP {
			n = x.nodeIPs()
		}
		e += n * (1 + b2i(x.Local)) // KUBE-NODE-PORT-<proto>(-LOCAL)
	}
	e += b2i(x.HealthCheckNodePort)
	c.IPSetEntries += e
}
