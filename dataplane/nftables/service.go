package nftables

// Rule families of one service port. Each small function writes one family
// (dispatch elements, masquerade, external destinations, endpoint selection,
// endpoint chains, affinity) into the service port's record; buildRecord
// decides which families apply, as kube-proxy's syncProxyRules does.

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// view is one service port as a render sees it.
type view struct {
	spn   cluster.ServicePortName
	sp    *cluster.ServicePort
	name  string // "ns/name:port"
	proto string // lower case
	cat   proxy.Categorized

	clusterChain, localChain, extChain, fwChain string
	// usesFW: kube-proxy's usesFWChain, load-balancer IPs with source
	// ranges (unlike iptables mode, whether or not there are endpoints).
	usesFW bool

	// Roles are kube-proxy's role flags of the service port.
	proxy.Roles
	internalChain, externalPolicyChain string

	// bases caches EndpointBase per endpoint: the hash is the costliest
	// part of rendering a service port.
	bases map[*cluster.Endpoint]string
}

// epBase is EndpointBase(v.spn, ep), cached.
func (v *view) epBase(ep *cluster.Endpoint) string {
	if b, ok := v.bases[ep]; ok {
		return b
	}
	b := endpointBase(v.spn, ep.IP.String(), strconv.Itoa(int(ep.Port)))
	if v.bases == nil {
		v.bases = make(map[*cluster.Endpoint]string, len(v.cat.AllReachable))
	}
	v.bases[ep] = b
	return b
}

func (v *view) endpointChain(ep *cluster.Endpoint) string { return PrefixEndpoint + v.epBase(ep) }
func (v *view) affinitySet(ep *cluster.Endpoint) string   { return PrefixAffinity + v.epBase(ep) }

func newView(spn cluster.ServicePortName, sp *cluster.ServicePort, cat proxy.Categorized) *view {
	base := ServicePortBase(spn) // one hash for the four chains
	v := &view{
		spn: spn, sp: sp, name: spn.String(), proto: protocol(spn), cat: cat,
		clusterChain: PrefixService + base, localChain: PrefixLocal + base, extChain: PrefixExternal + base, fwChain: PrefixFirewall + base,
	}
	v.Roles = cat.Roles(sp)
	v.usesFW = len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0
	v.internalChain, v.externalPolicyChain = v.clusterChain, v.clusterChain
	if v.InternalLocal {
		v.internalChain = v.localChain
	}
	if v.ExternalToLocal {
		v.externalPolicyChain = v.localChain
	}
	return v
}

// buildRecord renders one service port.
func (r *Renderer) buildRecord(v *view) *svcRecord {
	rec := &svcRecord{spn: v.spn}
	rec.noLocalInternal, rec.noLocalExternal = v.NoLocalInternal, v.NoLocalExternal
	switch {
	case r.cfg.Layout == LayoutKubeProxy:
		r.kubeProxyRecord(rec, v)
		return rec
	case !r.cascade(v):
		r.fastMapRecord(rec, v)
		return rec
	}
	// The fast layout's cascade mode: kube-proxy v1.31's per-service-port
	// chains without endpoint chains (see fastCascadeRules).
	r.dispatchElements(rec, v, "goto "+v.internalChain, "goto "+v.extChain)
	r.policyChains(rec, v)
	if v.HasInternal {
		r.masqueradeRules(rec.ensureChain(v.internalChain), v)
	}
	if v.UsesExtChain {
		r.externalRules(rec.ensureChain(v.extChain), v)
	}
	if v.usesFW {
		r.firewallRules(rec.ensureChain(v.fwChain), v)
	}
	r.affinitySets(rec, v)
	if v.UsesClusterChain {
		r.fastCascadeRules(rec.chain(v.clusterChain), v, v.cat.Cluster)
	}
	if v.UsesLocalChain {
		r.fastCascadeRules(rec.chain(v.localChain), v, v.cat.Local)
	}
	r.hairpinElements(rec, v)
	return rec
}

// policyChains creates the service port's Cluster, Local and external
// chains that it uses, in kube-proxy's order.
func (r *Renderer) policyChains(rec *svcRecord, v *view) {
	if v.UsesClusterChain {
		rec.ensureChain(v.clusterChain)
	}
	if v.UsesLocalChain {
		rec.ensureChain(v.localChain)
	}
	if v.UsesExtChain {
		rec.ensureChain(v.extChain)
	}
}

// kubeProxyRecord is kube-proxy v1.37's syncProxyRules for one service
// port: endpoint chains only with ClientIP affinity, this node's endpoints
// in hairpin-connections, the policy and external chains, the dispatch
// elements, then the rules: external chain, affinity sets, endpoint
// selection (an inline numgen DNAT map, or affinity checks and a numgen
// vmap over the endpoint chains), endpoint chains.
func (r *Renderer) kubeProxyRecord(rec *svcRecord, v *view) {
	aff := v.sp.ClientIPAffinity
	for _, ep := range v.cat.AllReachable {
		if aff {
			rec.ensureChain(v.endpointChain(ep))
		}
		if ep.NodeName != "" && ep.NodeName == r.cfg.NodeName && !r.cfg.Faults.Has(proxy.FaultHairpinNoMasquerade) {
			ip := ep.IP.String()
			rec.addShared(SetHairpinConnections, false, []string{ip, ip, v.proto, strconv.Itoa(int(ep.Port))}, nil, "")
		}
	}
	r.policyChains(rec, v)
	r.dispatchElements(rec, v, "goto "+v.internalChain, "goto "+v.extChain)
	if v.usesFW {
		rec.ensureChain(v.fwChain)
	}
	if v.UsesExtChain {
		r.kubeProxyExternalRules(rec.chain(v.extChain), v)
	}
	if v.usesFW {
		r.firewallRules(rec.chain(v.fwChain), v)
	}
	r.affinitySets(rec, v)
	policy := r.kubeProxyDNATRules
	if aff {
		policy = r.kubeProxyJumpRules
	}
	if v.UsesClusterChain {
		policy(rec.chain(v.clusterChain), v, v.cat.Cluster)
	}
	if v.UsesLocalChain {
		policy(rec.chain(v.localChain), v, v.cat.Local)
	}
	if aff {
		for _, ep := range v.cat.AllReachable {
			r.endpointRules(rec.chain(v.endpointChain(ep)), v, ep)
		}
	}
}

// kubeProxyExternalRules fill kube-proxy v1.37's external chain: the
// masquerade mark for externalTrafficPolicy Cluster; for Local, pod and
// host traffic short-circuited to the Cluster chain (host traffic
// masqueraded); then the external policy chain.
func (r *Renderer) kubeProxyExternalRules(c *chainRec, v *view) {
	if !v.ExternalLocal || r.cfg.Faults.Has(proxy.FaultLocalMasquerade) {
		c.addRule(r.markRule(), "masquerade")
	}
	if v.ExternalLocal {
		if r.cfg.ClusterCIDR.IsValid() {
			c.addRule(fmt.Sprintf("ip saddr %s goto %s", r.cfg.ClusterCIDR.Masked(), v.clusterChain), "short-circuit pod traffic")
		}
		c.addRule("fib saddr type local "+r.markRule(), "masquerade local traffic")
		c.addRule("fib saddr type local goto "+v.clusterChain, "short-circuit local traffic")
	}
	if v.HasExternal {
		c.addRule("goto "+v.externalPolicyChain, "")
	}
}

// dispatchElements are the service port's elements in the shared maps:
// its cluster IP in cluster-ips; the cluster IP in service-ips (with the
// internal verdict) or in no-endpoint-services (reject or drop); the node
// port in service-nodeports (with the node-port verdict) and
// no-endpoint-nodeports likewise.
func (r *Renderer) dispatchElements(rec *svcRecord, v *view, internal, nodePort string) {
	ip, port := v.sp.ClusterIP.String(), strconv.Itoa(int(v.sp.Port))
	add := func(container string, isMap bool, key, value []string, comment string) {
		rec.addShared(container, isMap, key, value, comment)
	}
	add(SetClusterIPs, false, []string{ip}, nil, "")
	internalVerdict, externalVerdict := noEndpointVerdictReject, noEndpointVerdictReject
	if v.HasEndpoints {
		internalVerdict, externalVerdict = noEndpointVerdictDrop, noEndpointVerdictDrop
	}
	if v.HasInternal {
		add(MapServiceIPs, true, []string{ip, v.proto, port}, []string{internal}, "")
	} else {
		add(MapNoEndpointServices, true, []string{ip, v.proto, port}, []string{internalVerdict}, v.name)
	}
	// External IPs, then load-balancer IPs, as kube-proxy's "Capture
	// externalIPs" and "Capture load-balancer ingress".
	for _, a := range v.sp.ExternalIPs {
		key := []string{a.String(), v.proto, port}
		if v.HasEndpoints {
			add(MapServiceIPs, true, key, []string{nodePort}, "")
		}
		if !v.HasExternal {
			add(MapNoEndpointServices, true, key, []string{externalVerdict}, v.name)
		}
	}
	for _, a := range v.sp.LoadBalancerIPs {
		key := []string{a.String(), v.proto, port}
		if v.HasEndpoints {
			add(MapServiceIPs, true, key, []string{nodePort}, "")
		}
		if v.usesFW {
			add(MapFirewallIPs, true, key, []string{"goto " + v.fwChain}, "")
		}
	}
	if !v.HasExternal {
		for _, a := range v.sp.LoadBalancerIPs {
			add(MapNoEndpointServices, true, []string{a.String(), v.proto, port}, []string{externalVerdict}, v.name)
		}
	}
	if v.sp.NodePort != 0 {
		np := strconv.Itoa(int(v.sp.NodePort))
		if v.HasEndpoints {
			add(MapServiceNodePorts, true, []string{v.proto, np}, []string{nodePort}, "")
		}
		if !v.HasExternal {
			add(MapNoEndpointNodePorts, true, []string{v.proto, np}, []string{externalVerdict}, v.name)
		}
	}
}

// firewallRules fill the firewall chain of loadBalancerSourceRanges: drop
// what comes from outside every range (and, when a range holds the node's
// address, from outside the load-balancer IPs too: a VIP-like balancer's
// address is local, so the node reaches it from there). Under the
// source-ranges-open fault the chain is empty.
func (r *Renderer) firewallRules(c *chainRec, v *view) {
	if r.cfg.Faults.Has(proxy.FaultSourceRangesOpen) {
		return
	}
	var nodeIP netip.Addr
	if len(r.cfg.NodeIPs) > 0 {
		nodeIP = r.cfg.NodeIPs[0]
	}
	var srcs []string
	allowFromNode := false
	for _, p := range v.sp.SourceRanges {
		srcs = append(srcs, p.String())
		allowFromNode = allowFromNode || p.Contains(nodeIP)
	}
	if allowFromNode {
		for _, a := range v.sp.LoadBalancerIPs {
			srcs = append(srcs, a.String())
		}
	}
	c.addRule("ip saddr != { "+strings.Join(srcs, " , ")+" } drop", "")
}

// masqueradeRules mark traffic to the cluster IP from outside the pod range
// (or all of it, with masqueradeAll).
func (r *Renderer) masqueradeRules(c *chainRec, v *view) {
	base := fmt.Sprintf("ip daddr %s %s dport %d", v.sp.ClusterIP, v.proto, v.sp.Port)
	switch {
	case r.cfg.MasqueradeAll:
		c.addRule(base+" jump "+ChainMarkForMasquerade, "")
	case r.cfg.ClusterCIDR.IsValid():
		c.addRule(fmt.Sprintf("%s ip saddr != %s jump %s", base, r.cfg.ClusterCIDR.Masked(), ChainMarkForMasquerade), "")
	}
}

// externalRules fill the external chain: masquerade and go to the Cluster
// chain for externalTrafficPolicy Cluster; for Local, short-circuit pod and
// host traffic to the Cluster chain (masquerading host traffic) and send the
// rest to the Local chain.
func (r *Renderer) externalRules(c *chainRec, v *view) {
	if !v.ExternalLocal || r.cfg.Faults.Has(proxy.FaultLocalMasquerade) {
		c.addRule("jump "+ChainMarkForMasquerade, "")
	}
	if v.ExternalLocal {
		if r.cfg.ClusterCIDR.IsValid() {
			c.addRule(fmt.Sprintf("ip saddr %s goto %s", r.cfg.ClusterCIDR.Masked(), v.clusterChain), "short-circuit pod traffic")
		}
		c.addRule("fib saddr type local jump "+ChainMarkForMasquerade, "masquerade local traffic")
		c.addRule("fib saddr type local goto "+v.clusterChain, "short-circuit local traffic")
	}
	if v.HasExternal {
		c.addRule("goto "+v.externalPolicyChain, "")
	}
}

// affinitySets are the per-endpoint ClientIP affinity sets (both layouts):
// a client address is kept for the timeout after its last new connection.
func (r *Renderer) affinitySets(rec *svcRecord, v *view) {
	if !v.sp.ClientIPAffinity {
		return
	}
	for _, ep := range v.cat.AllReachable {
		d := &objDef{name: v.affinitySet(ep), typ: "ipv4_addr"}
		if r.cfg.Faults.Has(proxy.FaultAffinityNoTimeout) {
			// The fault: entries never expire.
			d.flags = []knftables.SetFlag{knftables.DynamicFlag}
		} else {
			// "dynamic" as kube-proxy sets it (see its comment on RHEL8).
			d.flags = []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}
			d.timeout = time.Duration(v.sp.AffinityTimeout) * time.Second
		}
		rec.objs = append(rec.objs, d)
	}
}

// selection is the list of endpoints new connections are spread over, after
// the drop-last-endpoint fault.
func (r *Renderer) selection(eps []*cluster.Endpoint) []*cluster.Endpoint {
	if r.cfg.Faults.Has(proxy.FaultDropLastEndpoint) && len(eps) > 0 {
		return eps[:len(eps)-1]
	}
	return eps
}

// kubeProxyDNATRules are kube-proxy v1.37's writeServiceToEndpointDNATs:
// one endpoint is a plain `dnat to`; more are one inline numgen DNAT map,
// `dnat ip addr . port to numgen random mod N map { 0 : ip . port , ... }`.
func (r *Renderer) kubeProxyDNATRules(c *chainRec, v *view, eps []*cluster.Endpoint) {
	sel := r.selection(eps)
	if len(sel) == 0 {
		return
	}
	mod, buckets := r.buckets(len(sel))
	if mod == 1 {
		c.addRule(fmt.Sprintf("meta l4proto %s dnat to %s", v.proto, sel[0]), "")
		return
	}
	var b []byte
	for i, ep := range sel {
		if i > 0 {
			b = append(b, " , "...)
		}
		b = append(b, buckets[i]...)
		b = append(b, " : "...)
		b = append(b, ep.IP.String()...)
		b = append(b, " . "...)
		b = strconv.AppendInt(b, int64(ep.Port), 10)
	}
	c.addRule(fmt.Sprintf("meta l4proto %s dnat ip addr . port to numgen random mod %d map { %s }", v.proto, mod, b), "")
}

// kubeProxyJumpRules are kube-proxy's writeServiceToEndpointJumps (ClientIP
// affinity): one affinity check per endpoint, then one numgen verdict map
// over the endpoint chains.
func (r *Renderer) kubeProxyJumpRules(c *chainRec, v *view, eps []*cluster.Endpoint) {
	for _, ep := range eps {
		c.addRule(fmt.Sprintf("%sip saddr @%s goto %s", r.leakMatch(), v.affinitySet(ep), v.endpointChain(ep)), "")
	}
	sel := r.selection(eps)
	if len(sel) == 0 {
		return
	}
	mod, buckets := r.buckets(len(sel))
	var b []byte
	for i, ep := range sel {
		if i > 0 {
			b = append(b, " , "...)
		}
		b = append(b, buckets[i]...)
		b = append(b, " : goto "...)
		b = append(b, v.endpointChain(ep)...)
	}
	c.addRule(fmt.Sprintf("numgen random mod %d vmap { %s }", mod, b), "")
}

// endpointRules fill a kube-proxy endpoint chain (ClientIP affinity only):
// the affinity refresh and the DNAT.
func (r *Renderer) endpointRules(c *chainRec, v *view, ep *cluster.Endpoint) {
	for _, u := range r.updates(v, ep) {
		c.addRule(u.match+strings.TrimPrefix(u.update, " "), "")
	}
	c.addRule(fmt.Sprintf("meta l4proto %s dnat to %s", v.proto, ep), "")
}

func (r *Renderer) counter() string {
	if r.cfg.NoCounters {
		return ""
	}
	return "counter "
}

// cascade reports whether the fast layout renders a service port with
// per-service-port chains and one rule per endpoint (fastCascadeRules)
// rather than through the shared endpoint maps (fastMapRecord): with
// ClientIP affinity, whose per-endpoint sets need per-endpoint rules, and
// under the faults that change the spread (a cascade is how they are
// written in iptables, and they are test-only).
func (r *Renderer) cascade(v *view) bool {
	// External and load-balancer IPs reach the service port on its own
	// port, not the node port the shared external maps are keyed by.
	return v.sp.ClientIPAffinity || len(v.sp.ExternalIPs) > 0 || len(v.sp.LoadBalancerIPs) > 0 || r.cfg.Faults.Has(proxy.FaultUniformProbability) || r.cfg.Faults.Has(proxy.FaultDropLastEndpoint) ||
		r.cfg.Faults.Has(proxy.FaultSkewAtMDE)
}

// fastCascadeRules are the fast layout's per-service-port endpoint
// selection, without endpoint chains. With affinity, a client found in an
// endpoint's set goes to that endpoint. Otherwise a cascade of
// `numgen random mod k == 0` rules (probability 1/k each, the last one
// unconditional) picks one; with affinity each rule refreshes the chosen
// endpoint's set before its DNAT. Every rule counts what it sends. Under
// the affinity-overstay fault each rule that refreshes a set is written
// twice, once per half of the clients (see updates).
func (r *Renderer) fastCascadeRules(c *chainRec, v *view, eps []*cluster.Endpoint) {
	cnt := r.counter()
	if v.sp.ClientIPAffinity {
		for _, ep := range eps {
			set := v.affinitySet(ep)
			for _, u := range r.updates(v, ep) {
				c.addRule(fmt.Sprintf("%s%sip saddr @%s meta l4proto %s%s %sdnat to %s", r.leakMatch(), u.match, set, v.proto, u.update, cnt, ep), "")
			}
		}
	}
	sel := r.selection(eps)
	n := len(sel)
	for i, ep := range sel {
		stat := ""
		if i < n-1 {
			p := n - i
			if r.cfg.Faults.Has(proxy.FaultUniformProbability) {
				p = n
			}
			stat = fmt.Sprintf(" numgen random mod %d == 0", p)
			if i == 0 && r.skew() {
				stat = skewMatch(n)
			}
		}
		for _, u := range r.updates(v, ep) {
			c.addRule(fmt.Sprintf("%smeta l4proto %s%s%s %sdnat to %s", u.match, v.proto, stat, u.update, cnt, ep), "")
		}
	}
}

// skewMatch is the first cascade rule's match under skew-at-mde: the first
// endpoint's weight out of the total (proxy.MDESkewWeights), reduced
// (11 values out of 10n), as `numgen random mod M < W`; the later rules keep
// 1/(n-i), which splits the rest evenly.
func skewMatch(n int) string {
	w := proxy.MDESkewWeights(n)
	var sum uint64
	for _, x := range w {
		sum += x
	}
	g := w[0]
	for b := sum; b != 0; {
		g, b = b, g%b
	}
	return fmt.Sprintf(" numgen random mod %d < %d", sum/g, w[0]/g)
}

// skew reports the skew-at-mde fault (the uniform-probability fault, which
// also reshapes the cascade, wins when both are set).
func (r *Renderer) skew() bool {
	return r.cfg.Faults.Has(proxy.FaultSkewAtMDE) && !r.cfg.Faults.Has(proxy.FaultUniformProbability)
}

// leakMatch is the prefix of an affinity check under the affinity-leak
// fault: only clients outside bucket 0 of proxy.LeakBuckets (the same
// kernel hash as iptables' cluster match, proxy.ClientBucket) are
// checked; the others fall through to a fresh choice.
func (r *Renderer) leakMatch() string {
	if !r.cfg.Faults.Has(proxy.FaultAffinityLeak) {
		return ""
	}
	return fmt.Sprintf("jhash ip saddr mod %d seed %#x != 0 ", proxy.LeakBuckets, proxy.ClientHashSeed)
}

// affUpdate is one way a rule records the client in an affinity set: match is
// a prefix for the rule ("" or a jhash match and a space), update the
// statement with a leading space ("" without affinity).
type affUpdate struct{ match, update string }

// updates are the ways to record the client in ep's affinity set: one
// `update @set { ip saddr }` (the set's timeout), or under the
// affinity-overstay fault two, for the clients in bucket 0 of
// proxy.OverstayBuckets (timeout twice the Service's) and the others.
// Without affinity, one empty update.
func (r *Renderer) updates(v *view, ep *cluster.Endpoint) []affUpdate {
	if !v.sp.ClientIPAffinity {
		return []affUpdate{{}}
	}
	set := v.affinitySet(ep)
	plain := fmt.Sprintf(" update @%s { ip saddr }", set)
	if !r.cfg.Faults.Has(proxy.FaultAffinityOverstay) || r.cfg.Faults.Has(proxy.FaultAffinityNoTimeout) {
		return []affUpdate{{update: plain}}
	}
	hash := fmt.Sprintf("jhash ip saddr mod %d seed %#x", proxy.OverstayBuckets, proxy.ClientHashSeed)
	return []affUpdate{
		{match: hash + " == 0 ", update: fmt.Sprintf(" update @%s { ip saddr timeout %ds }", set, 2*v.sp.AffinityTimeout)},
		{match: hash + " != 0 ", update: plain},
	}
}

// Endpoint maps of the fast layout, one per kind and protocol: the map's
// value type must name the protocol (see endpointMapType).
const (
	kindClusterIP       = "cluster-ip"        // cluster IP traffic, internal policy
	kindNodePort        = "node-port"         // node port traffic, externalTrafficPolicy Cluster
	kindNodePortLocal   = "node-port-local"   // node port traffic, externalTrafficPolicy Local
	kindNodePortCluster = "node-port-cluster" // node port traffic short-circuited (pods, host) under Local
)

// EndpointMap names the fast layout's endpoint map of a kind
// ("cluster-ip", "node-port", "node-port-cluster") and protocol.
func EndpointMap(kind, proto string) string {
	if kind == kindNodePortLocal {
		kind = kindNodePort // the same keys: one external list per node port
	}
	return kind + "-endpoints-" + proto
}

// endpointMapType is the typeof of an endpoint map. The key is the packet's
// destination (cluster IP, protocol and port, or protocol and node port)
// and a numgen bucket; the value an address and port. The value's port
// type names the protocol: with "th dport", nft 1.0.6 accepts the map and a
// rule using it in one transaction but refuses the rule ("conflicting
// protocols specified: tcp vs. th") once the map is in the kernel.
func endpointMapType(kind, proto string, counters bool) string {
	key := "ip daddr . meta l4proto . th dport"
	if kind != kindClusterIP {
		key = "meta l4proto . th dport"
	}
	t := fmt.Sprintf("%s . numgen random mod 1 : ip daddr . %s dport", key, proto)
	if counters {
		// knftables has no field for a set's stateful statements: the
		// `counter` declaration rides on the type, which knftables
		// writes as "typeof ... ; counter ;" (valid nft syntax). Every
		// element then counts the connections it sent.
		t += " ; counter"
	}
	return t
}

// selectChain is the fast layout's shared selection chain for n endpoints
// of one kind and protocol, e.g. "cluster-ip-tcp-3": every service port
// whose traffic of that kind goes to 3 endpoints jumps there. Its one DNAT
// rule looks the packet's destination and `numgen random mod 3` up in the
// kind's endpoint map. Sharing these chains keeps the number of rules bound
// to a map small: the kernel validates each new element of a map against
// every rule bound to it, and each map or set costs a walk of the table's
// set list, so that per-service-port maps, named or anonymous, make a full
// load grow quadratically (README.md).
func (r *Renderer) selectChain(kind, proto string, n int) *chainRec {
	c := &chainRec{name: fmt.Sprintf("%s-%s-%d", kind, proto, n)}
	key := "ip daddr . meta l4proto . th dport"
	switch kind {
	case kindClusterIP:
		// kube-proxy's masquerade rule, without its (redundant) match on
		// the cluster IP and port: only that traffic arrives here.
		switch {
		case r.cfg.MasqueradeAll:
			c.addRule("jump "+ChainMarkForMasquerade, "")
		case r.cfg.ClusterCIDR.IsValid():
			c.addRule(fmt.Sprintf("ip saddr != %s jump %s", r.cfg.ClusterCIDR.Masked(), ChainMarkForMasquerade), "")
		}
	case kindNodePort:
		c.addRule("jump "+ChainMarkForMasquerade, "")
		key = "meta l4proto . th dport"
	default:
		key = "meta l4proto . th dport"
	}
	c.addRule(fmt.Sprintf("meta l4proto %s dnat ip to %s . numgen random mod %d map @%s", proto, key, n, EndpointMap(kind, proto)), "")
	return c
}

// fastMapRecord renders a service port without chains of its own (but the
// external chain of externalTrafficPolicy Local): its destinations point at
// shared selection chains, and its endpoints are elements of the endpoint
// maps, keyed by destination and bucket.
func (r *Renderer) fastMapRecord(rec *svcRecord, v *view) {
	ip, port := v.sp.ClusterIP.String(), strconv.Itoa(int(v.sp.Port))
	np := strconv.Itoa(int(v.sp.NodePort))
	endpoints := func(kind string, key []string, eps []*cluster.Endpoint) string {
		c := r.selectChain(kind, v.proto, len(eps))
		rec.sharedChains = append(rec.sharedChains, c)
		m := EndpointMap(kind, v.proto)
		for i, ep := range eps {
			k := append(slices.Clone(key), strconv.Itoa(i))
			rec.addShared(m, true, k, []string{ep.IP.String(), strconv.Itoa(int(ep.Port))}, "")
		}
		return "goto " + c.name
	}
	internal, nodePort := "", ""
	if v.HasInternal {
		internal = endpoints(kindClusterIP, []string{ip, v.proto, port}, v.cat.Internal(v.sp))
	}
	if v.UsesExtChain {
		if !v.ExternalLocal {
			nodePort = endpoints(kindNodePort, []string{v.proto, np}, v.cat.Cluster)
		} else {
			// kube-proxy's external chain, with the policy chains
			// replaced by selection chains keyed by node port.
			c := &chainRec{name: v.extChain}
			rec.chains = append(rec.chains, c)
			if r.cfg.Faults.Has(proxy.FaultLocalMasquerade) {
				c.addRule("jump "+ChainMarkForMasquerade, "")
			}
			short := endpoints(kindNodePortCluster, []string{v.proto, np}, v.cat.Cluster)
			if r.cfg.ClusterCIDR.IsValid() {
				c.addRule(fmt.Sprintf("ip saddr %s %s", r.cfg.ClusterCIDR.Masked(), short), "short-circuit pod traffic")
			}
			c.addRule("fib saddr type local jump "+ChainMarkForMasquerade, "masquerade local traffic")
			c.addRule("fib saddr type local "+short, "short-circuit local traffic")
			if v.HasExternal {
				c.addRule(endpoints(kindNodePortLocal, []string{v.proto, np}, v.cat.External(v.sp)), "")
			}
			nodePort = "goto " + c.name
		}
	}
	r.dispatchElements(rec, v, internal, nodePort)
	r.hairpinElements(rec, v)
}

// hairpinElements are the fast layout's hairpin pairs: a local endpoint
// reaching itself through a Service is masqueraded after DNAT, when
// `ip saddr . ip daddr` is in hairpin-endpoints. Only endpoints of this node
// (or of no known node) can send such traffic here: another node's pod is
// DNATed by its own node.
func (r *Renderer) hairpinElements(rec *svcRecord, v *view) {
	if r.cfg.Faults.Has(proxy.FaultHairpinNoMasquerade) {
		return
	}
	for _, ep := range v.cat.AllReachable {
		if ep.NodeName != "" && ep.NodeName != r.cfg.NodeName {
			continue
		}
		ip := ep.IP.String()
		rec.addShared(SetHairpinEndpoints, false, []string{ip, ip}, nil, "")
	}
}

// buckets maps n endpoints to numgen values: "0".."n-1" with modulus n, or,
// under the uniform-probability fault, ranges weighted like a cascade whose
// rules all have probability 1/n: endpoint i gets (1/n)(1-1/n)^i and the last
// one (1-1/n)^(n-1) (3 endpoints: 3, 2 and 4 buckets of 9). The weights are
// exact while n^(n-1) fits in 31 bits (n <= 10) and rounded to 2^-31 beyond,
// the resolution of iptables' statistic match.
func (r *Renderer) buckets(n int) (mod uint64, keys []string) {
	if r.skew() && n > 1 {
		return weightedBuckets(proxy.MDESkewWeights(n))
	}
	if !r.cfg.Faults.Has(proxy.FaultUniformProbability) || n <= 2 {
		keys = make([]string, n)
		for i := range keys {
			keys[i] = strconv.Itoa(i)
		}
		return uint64(n), keys
	}
	return weightedBuckets(SkewWeights(n))
}

// weightedBuckets gives endpoint i a range of w[i] numgen values, in order;
// the modulus is the sum. Ranges keep the vmap at one element per endpoint
// (the skew-at-mde fault has 24,500 values for 50 endpoints).
func weightedBuckets(w []uint64) (mod uint64, keys []string) {
	var start uint64
	for _, x := range w {
		mod += x
	}
	for _, x := range w {
		keys = append(keys, fmt.Sprintf("%d-%d", start, start+x-1))
		start += x
	}
	return mod, keys
}

// SkewWeights are the integer bucket weights of the uniform-probability
// fault for n endpoints (see buckets); their sum is the numgen modulus.
func SkewWeights(n int) []uint64 {
	w := make([]uint64, n)
	exact := true
	var total uint64 = 1
	for i := 0; i < n-1; i++ {
		total *= uint64(n)
		if total > 1<<31 {
			exact = false
			break
		}
	}
	if exact {
		// w_i = (n-1)^i n^(n-2-i) for i < n-1, w_{n-1} = (n-1)^(n-1).
		for i := range n {
			x := uint64(1)
			for range min(i, n-1) {
				x *= uint64(n - 1)
			}
			if i < n-1 {
				for range n - 2 - i {
					x *= uint64(n)
				}
			}
			w[i] = x
		}
		return w
	}
	const scale = 1 << 31
	var sum uint64
	p := 1.0
	for i := 0; i < n-1; i++ {
		x := uint64(p/float64(n)*scale + 0.5)
		w[i] = max(x, 1)
		sum += w[i]
		p *= 1 - 1/float64(n)
	}
	w[n-1] = scale - sum
	return w
}
