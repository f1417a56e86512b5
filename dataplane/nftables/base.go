package nftables

// The table's fixed part: base chains at their hooks and priorities, the
// jumps from them, the dispatch, no-endpoint, firewall and masquerade chains,
// and the shared maps and sets. It depends only on the configuration, and is
// rewritten on every full sync (kube-proxy's setupNFTables).

import (
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"
)

// baseRecord is the fixed part of the table for this configuration.
type baseRecord struct {
	chains []*chainRec
	objs   []*objDef
	elems  []sharedElem // static elements (nodeport-ips)
}

func (r *Renderer) baseRecord() *baseRecord {
	b := &baseRecord{}
	if r.cfg.Layout == LayoutKubeProxy {
		r.kubeProxyBase(b)
		return b
	}
	h := r.baseChains(b)
	r.baseRules(b, h)
	r.baseObjects(b)
	return b
}

// hookChains are the base chains of the table.
type hookChains struct {
	pre, in, fwd, out, outPost *chainRec
	prePost                    *chainRec // fast layout only
	natPre, natOut, natPost    *chainRec
}

// base adds a base chain at a hook and priority.
func (b *baseRecord) base(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority) *chainRec {
	c := &chainRec{name: name, base: &baseChain{typ: typ, hook: hook, priority: prio}}
	b.chains = append(b.chains, c)
	return c
}

// chain adds a regular chain.
func (b *baseRecord) chain(name, comment string) *chainRec {
	c := &chainRec{name: name, comment: comment}
	b.chains = append(b.chains, c)
	return c
}

// topChains adds the regular chains the base chains jump to, in
// kube-proxy's order: nodeport-endpoints-check, service-endpoints-check,
// firewall-check, services, masquerading, cluster-ips-check.
func (b *baseRecord) topChains() (nodePortCheck, svcCheck, fw, services, masq, clusterIPsCheck *chainRec) {
	return b.chain(ChainNodePortEndpointsCheck, ""), b.chain(ChainServiceEndpointsCheck, ""), b.chain(ChainFirewallCheck, ""),
		b.chain(ChainServices, ""), b.chain(ChainMasquerading, ""), b.chain(ChainClusterIPsCheck, "")
}

// kubeProxyBase is kube-proxy v1.37's setupNFTables (feature gate
// KubeProxyNFTablesLocalhostNodePorts off, its default): base chains, the
// jumps from them (nftablesJumpChains order), then the fixed chains, sets
// and maps in the order it writes them.
func (r *Renderer) kubeProxyBase(b *baseRecord) {
	pre := b.base(ChainFilterPreroutingPreDNAT, knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority+"-10")
	outPre := b.base(ChainFilterOutputPreDNAT, knftables.FilterType, knftables.OutputHook, knftables.DNATPriority+"-10")
	in := b.base(ChainFilterInput, knftables.FilterType, knftables.InputHook, knftables.FilterPriority)
	fwd := b.base(ChainFilterForward, knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority)
	out := b.base(ChainFilterOutput, knftables.FilterType, knftables.OutputHook, knftables.FilterPriority)
	natPre := b.base(ChainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority)
	natOut := b.base(ChainNATOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority)
	natPost := b.base(ChainNATPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority)

	nodePortCheck, svcCheck, fw, services, masq, clusterIPsCheck := b.topChains()
	in.addRule("ct state new jump "+nodePortCheck.name, "")
	in.addRule("ct state new jump "+svcCheck.name, "")
	fwd.addRule("ct state new jump "+svcCheck.name, "")
	out.addRule("ct state new jump "+svcCheck.name, "")
	pre.addRule("ct state new jump "+fw.name, "")
	outPre.addRule("ct state new jump "+fw.name, "")
	natOut.addRule("jump "+services.name, "")
	natPre.addRule("jump "+services.name, "")
	natPost.addRule("jump "+masq.name, "")
	fwd.addRule("ct state new jump "+clusterIPsCheck.name, "")
	out.addRule("ct state new jump "+clusterIPsCheck.name, "")

	obj := func(name string, isMap bool, typ, comment string) {
		b.objs = append(b.objs, &objDef{name: name, isMap: isMap, typ: typ, comment: comment})
	}
	obj(SetHairpinConnections, false, "ipv4_addr . ipv4_addr . inet_proto . inet_service", "service hairpin connections")
	masq.addRule(fmt.Sprintf("mark and %s != 0 mark set mark xor %s masquerade fully-random", r.mark, r.mark), "")
	masq.addRule("ct status dnat ip saddr . ip daddr . meta l4proto . th dport @"+SetHairpinConnections+" masquerade fully-random", "")
	obj(SetClusterIPs, false, "ipv4_addr", "Active ClusterIPs")
	r.clusterIPsCheckRules(clusterIPsCheck)

	nodePortMatch := "fib daddr type local ip daddr != 127.0.0.0/8"
	if len(r.cfg.NodeIPs) > 0 {
		nodePortMatch = "ip daddr @" + SetNodePortIPs
		obj(SetNodePortIPs, false, "ipv4_addr", "IPs that accept NodePort traffic")
		for _, a := range r.cfg.NodeIPs {
			if !a.IsLoopback() {
				b.elems = append(b.elems, sharedElem{container: SetNodePortIPs, elem: elem{key: []string{a.String()}}})
			}
		}
	}
	obj(MapNoEndpointServices, true, "ipv4_addr . inet_proto . inet_service : verdict", "vmap to drop or reject packets to services with no endpoints")
	obj(MapNoEndpointNodePorts, true, "inet_proto . inet_service : verdict", "vmap to drop or reject packets to service nodeports with no endpoints")
	reject := b.chain(ChainReject, "helper for @no-endpoint-services / @no-endpoint-nodeports")
	reject.addRule("reject", "")
	svcCheck.addRule("ip daddr . meta l4proto . th dport vmap @"+MapNoEndpointServices, "")
	if len(r.cfg.NodeIPs) > 0 {
		nodePortCheck.addRule(nodePortMatch+" meta l4proto . th dport vmap @"+MapNoEndpointNodePorts, "")
	} else {
		nodePortCheck.addRule("ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @"+MapNoEndpointNodePorts, "")
	}
	obj(MapFirewallIPs, true, "ipv4_addr . inet_proto . inet_service : verdict", "destinations that are subject to LoadBalancerSourceRanges")
	fw.addRule("ip daddr . meta l4proto . th dport vmap @"+MapFirewallIPs, "")
	obj(MapServiceIPs, true, "ipv4_addr . inet_proto . inet_service : verdict", "ClusterIP, ExternalIP and LoadBalancer IP traffic")
	obj(MapServiceNodePorts, true, "inet_proto . inet_service : verdict", "NodePort traffic")
	switch {
	case r.cfg.MasqueradeAll:
		services.addRule("ip daddr @"+SetClusterIPs+" "+r.markRule(), "masquerade all clusterIP traffic")
	case r.cfg.ClusterCIDR.IsValid():
		services.addRule(fmt.Sprintf("ip daddr @%s ip saddr != %s %s", SetClusterIPs, r.cfg.ClusterCIDR.Masked(), r.markRule()), "masquerade clusterIP traffic from outside cluster")
	}
	services.addRule("ip daddr . meta l4proto . th dport vmap @"+MapServiceIPs, "")
	services.addRule(nodePortMatch+" meta l4proto . th dport vmap @"+MapServiceNodePorts, "")
}

// markRule is kube-proxy v1.37's masqueradeRule: set the masquerade mark
// in place (no mark-for-masquerade chain).
func (r *Renderer) markRule() string { return "mark set mark or " + r.mark }

// clusterIPsCheckRules reject traffic to a cluster IP's other ports and drop
// traffic to the service ranges' unallocated addresses.
func (r *Renderer) clusterIPsCheckRules(c *chainRec) {
	c.addRule("ip daddr @"+SetClusterIPs+" reject", "Reject traffic to invalid ports of ClusterIPs")
	if len(r.cfg.ServiceCIDRs) > 0 {
		cidrs := make([]string, len(r.cfg.ServiceCIDRs))
		for i, p := range r.cfg.ServiceCIDRs {
			cidrs[i] = p.Masked().String()
		}
		c.addRule("ip daddr { "+strings.Join(cidrs, ", ")+" } drop", "Drop traffic to unallocated ClusterIPs")
	}
}

// baseChains adds the fast layout's base chains at their hooks and
// priorities (kube-proxy v1.31's).
func (r *Renderer) baseChains(b *baseRecord) *hookChains {
	h := &hookChains{}
	h.pre = b.base(ChainFilterPrerouting, knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority+"-10")
	h.in = b.base(ChainFilterInput, knftables.FilterType, knftables.InputHook, knftables.DNATPriority+"-10")
	h.fwd = b.base(ChainFilterForward, knftables.FilterType, knftables.ForwardHook, knftables.DNATPriority+"-10")
	h.out = b.base(ChainFilterOutput, knftables.FilterType, knftables.OutputHook, knftables.DNATPriority+"-10")
	h.outPost = b.base(ChainFilterOutputPostDNAT, knftables.FilterType, knftables.OutputHook, knftables.DNATPriority+"+10")
	if r.cfg.Layout == LayoutFast {
		h.prePost = b.base(ChainFilterPreroutingPostDNAT, knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority+"+10")
	}
	h.natPre = b.base(ChainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority)
	h.natOut = b.base(ChainNATOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority)
	h.natPost = b.base(ChainNATPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority)
	return h
}

// baseRules adds the regular chains of the fixed part and the rules of
// every fixed chain, the jumps from the base chains first.
func (r *Renderer) baseRules(b *baseRecord, h *hookChains) {
	// Jumps, in kube-proxy's nftablesJumpChains order. REJECT is only
	// allowed in prerouting since kernel 5.9, hence the endpoint checks in
	// input, forward and output.
	nodePortCheck, svcCheck, fw, services, masq, clusterIPsCheck := b.topChains()
	h.in.addRule("ct state new jump "+nodePortCheck.name, "")
	h.in.addRule("ct state new jump "+svcCheck.name, "")
	h.fwd.addRule("ct state new jump "+svcCheck.name, "")
	// The node's own traffic is checked after its DNAT, as kube-proxy
	// v1.37 checks it (filter-output at priority 0): before it, traffic the
	// external chain short-circuits (the host to an external IP of a Local
	// Service without a local endpoint) would still carry the external
	// destination and meet its drop.
	h.outPost.addRule("ct state new jump "+svcCheck.name, "")
	h.pre.addRule("ct state new jump "+fw.name, "")
	h.out.addRule("ct state new jump "+fw.name, "")
	h.natOut.addRule("jump "+services.name, "")
	h.natPre.addRule("jump "+services.name, "")
	h.natPost.addRule("jump "+masq.name, "")
	h.fwd.addRule("ct state new jump "+clusterIPsCheck.name, "")
	h.outPost.addRule("ct state new jump "+clusterIPsCheck.name, "")

	markMasq := b.chain(ChainMarkForMasquerade, "")
	markMasq.addRule("mark set mark or "+r.mark, "")
	masq.addRule(fmt.Sprintf("mark and %s == 0 return", r.mark), "")
	masq.addRule("mark set mark xor "+r.mark, "")
	masq.addRule("masquerade fully-random", "")

	r.clusterIPsCheckRules(clusterIPsCheck)

	reject := b.chain(ChainReject, "helper for @no-endpoint-services / @no-endpoint-nodeports")
	reject.addRule("reject", "")
	svcCheck.addRule("ip daddr . meta l4proto . th dport vmap @"+MapNoEndpointServices, "")
	nodePortCheck.addRule("ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @"+MapNoEndpointNodePorts, "")
	fw.addRule("ip daddr . meta l4proto . th dport vmap @"+MapFirewallIPs, "")
	services.addRule("ip daddr . meta l4proto . th dport vmap @"+MapServiceIPs, "")
	services.addRule("fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @"+MapServiceNodePorts, "")

	if h.prePost != nil {
		// Hairpin masquerade after DNAT, without endpoint chains: the
		// packet's source and (translated) destination are one endpoint.
		hairpin := fmt.Sprintf("ct state new ct status dnat ip saddr . ip daddr @%s jump %s", SetHairpinEndpoints, ChainMarkForMasquerade)
		h.prePost.addRule(hairpin, "")
		h.outPost.addRule(hairpin, "")
	}
}

// baseObjects adds the shared maps and sets.
func (r *Renderer) baseObjects(b *baseRecord) {
	counter := ""
	if !r.cfg.NoCounters {
		// See endpointMapType: the set's `counter` statement rides on
		// the type. Every element then counts its matches.
		counter = " ; counter"
	}
	obj := func(name string, isMap bool, typ, comment string) {
		b.objs = append(b.objs, &objDef{name: name, isMap: isMap, typ: typ, comment: comment})
	}
	obj(SetClusterIPs, false, "ipv4_addr", "Active ClusterIPs")
	obj(MapNoEndpointServices, true, "ipv4_addr . inet_proto . inet_service : verdict"+counter, "vmap to drop or reject packets to services with no endpoints")
	obj(MapNoEndpointNodePorts, true, "inet_proto . inet_service : verdict"+counter, "vmap to drop or reject packets to service nodeports with no endpoints")
	obj(MapFirewallIPs, true, "ipv4_addr . inet_proto . inet_service : verdict", "destinations that are subject to LoadBalancerSourceRanges")
	obj(MapServiceIPs, true, "ipv4_addr . inet_proto . inet_service : verdict", "ClusterIP, ExternalIP and LoadBalancer IP traffic")
	obj(MapServiceNodePorts, true, "inet_proto . inet_service : verdict", "NodePort traffic")
	if r.cfg.Layout == LayoutFast {
		obj(SetHairpinEndpoints, false, "ipv4_addr . ipv4_addr", "endpoint pairs (source . destination) that need hairpin masquerade")
		for _, proto := range []string{"tcp", "udp", "sctp"} {
			for _, kind := range []string{kindClusterIP, kindNodePort, kindNodePortCluster} {
				b.objs = append(b.objs, &objDef{name: EndpointMap(kind, proto), isMap: true, typeOf: endpointMapType(kind, proto, !r.cfg.NoCounters)})
			}
		}
	}
}
