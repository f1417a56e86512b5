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
}

func (r *Renderer) baseRecord() *baseRecord {
	b := &baseRecord{}
	mark := r.mark
	base := func(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority) *chainRec {
		c := &chainRec{name: name, base: &baseChain{typ: typ, hook: hook, priority: prio}}
		b.chains = append(b.chains, c)
		return c
	}
	pre := base(ChainFilterPrerouting, knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority+"-10")
	in := base(ChainFilterInput, knftables.FilterType, knftables.InputHook, knftables.DNATPriority+"-10")
	fwd := base(ChainFilterForward, knftables.FilterType, knftables.ForwardHook, knftables.DNATPriority+"-10")
	out := base(ChainFilterOutput, knftables.FilterType, knftables.OutputHook, knftables.DNATPriority+"-10")
	outPost := base(ChainFilterOutputPostDNAT, knftables.FilterType, knftables.OutputHook, knftables.DNATPriority+"+10")
	var prePost *chainRec
	if r.cfg.Layout == LayoutFast {
		prePost = base(ChainFilterPreroutingPostDNAT, knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority+"+10")
	}
	natPre := base(ChainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority)
	natOut := base(ChainNATOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority)
	natPost := base(ChainNATPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority)

	chain := func(name, comment string) *chainRec {
		c := &chainRec{name: name, comment: comment}
		b.chains = append(b.chains, c)
		return c
	}
	// Jumps, in kube-proxy's nftablesJumpChains order. REJECT is only
	// allowed in prerouting since kernel 5.9, hence the endpoint checks in
	// input, forward and output.
	nodePortCheck := chain(ChainNodePortEndpointsCheck, "")
	svcCheck := chain(ChainServiceEndpointsCheck, "")
	fw := chain(ChainFirewallCheck, "")
	services := chain(ChainServices, "")
	masq := chain(ChainMasquerading, "")
	clusterIPsCheck := chain(ChainClusterIPsCheck, "")
	in.addRule("ct state new jump "+nodePortCheck.name, "")
	in.addRule("ct state new jump "+svcCheck.name, "")
	fwd.addRule("ct state new jump "+svcCheck.name, "")
	out.addRule("ct state new jump "+svcCheck.name, "")
	pre.addRule("ct state new jump "+fw.name, "")
	out.addRule("ct state new jump "+fw.name, "")
	natOut.addRule("jump "+services.name, "")
	natPre.addRule("jump "+services.name, "")
	natPost.addRule("jump "+masq.name, "")
	fwd.addRule("ct state new jump "+clusterIPsCheck.name, "")
	outPost.addRule("ct state new jump "+clusterIPsCheck.name, "")

	markMasq := chain(ChainMarkForMasquerade, "")
	markMasq.addRule("mark set mark or "+mark, "")
	masq.addRule(fmt.Sprintf("mark and %s == 0 return", mark), "")
	masq.addRule("mark set mark xor "+mark, "")
	masq.addRule("masquerade fully-random", "")

	clusterIPsCheck.addRule("ip daddr @"+SetClusterIPs+" reject", "Reject traffic to invalid ports of ClusterIPs")
	if len(r.cfg.ServiceCIDRs) > 0 {
		cidrs := make([]string, len(r.cfg.ServiceCIDRs))
		for i, p := range r.cfg.ServiceCIDRs {
			cidrs[i] = p.Masked().String()
		}
		clusterIPsCheck.addRule("ip daddr { "+strings.Join(cidrs, ", ")+" } drop", "Drop traffic to unallocated ClusterIPs")
	}

	reject := chain(ChainReject, "helper for @no-endpoint-services / @no-endpoint-nodeports")
	reject.addRule("reject", "")
	svcCheck.addRule("ip daddr . meta l4proto . th dport vmap @"+MapNoEndpointServices, "")
	nodePortCheck.addRule("ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @"+MapNoEndpointNodePorts, "")
	fw.addRule("ip daddr . meta l4proto . th dport vmap @"+MapFirewallIPs, "")
	services.addRule("ip daddr . meta l4proto . th dport vmap @"+MapServiceIPs, "")
	services.addRule("fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @"+MapServiceNodePorts, "")

	if prePost != nil {
		// Hairpin masquerade after DNAT, without endpoint chains: the
		// packet's source and (translated) destination are one endpoint.
		hairpin := fmt.Sprintf("ct state new ct status dnat ip saddr . ip daddr @%s jump %s", SetHairpinEndpoints, ChainMarkForMasquerade)
		prePost.addRule(hairpin, "")
		outPost.addRule(hairpin, "")
	}

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
	return b
}
