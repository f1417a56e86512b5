package iptables

// The renderer is kube-proxy's syncProxyRules cut into rule families: each
// family is a small function that returns lines, and Render only decides
// which families to call for which service port and where their lines go
// (written, or only counted when a partial sync skips an unchanged service
// port).

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Renderer renders one node's ruleset and remembers the chains and sets of
// the last ruleset the kernel took (see Commit), so that a partial render
// knows what became stale. It is not safe for concurrent use.
type Renderer struct {
	cfg  Config
	mark string
	cat  dataplane.Categorizer
	// probs caches the probability strings, as kube-proxy's
	// precomputedProbabilities does.
	probs []string
	// memory implements the keep-deleted-endpoint fault.
	memory *dataplane.EndpointMemory
	// cache holds, per service port, what the last render produced for
	// it, so that a partial render does not recompute unchanged ones.
	cache map[cluster.ServicePortName]*svcOut
	// buffers are reused from render to render.
	buf       sections
	committed bool
	// committedOuts is, per service port, what the kernel holds: the
	// chains and sets stale detection compares against.
	committedOuts map[cluster.ServicePortName]*svcOut
}

// NewRenderer returns a renderer for cfg's node. It fails on a bad config.
func NewRenderer(cfg Config) (*Renderer, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("could not configure the iptables renderer: %w", err)
	}
	r := &Renderer{
		cfg: cfg,
		// kube-proxy formats the mark with %#08x (0x00004000); its tests,
		// and iptables-save, print 0x4000. The kernel holds the same value.
		mark: fmt.Sprintf("%#x", uint32(1)<<cfg.MasqueradeBit),
		cat:  dataplane.Categorizer{Node: cfg.NodeName, PreferSameNode: cfg.PreferSameNode, Faults: cfg.Faults},
	}
	if cfg.Faults.Has(dataplane.FaultKeepDeletedEndpoint) {
		r.memory = dataplane.NewEndpointMemory()
	}
	return r, nil
}

// Config returns the renderer's configuration, defaults filled.
func (r *Renderer) Config() Config { return r.cfg }

// Commit records that the kernel now holds rs: its chains and sets are what
// the next render compares against to find stale ones. Call it only after
// iptables-restore (and ipset restore) succeeded; after a failure, do not
// commit and make the next render a full one.
func (r *Renderer) Commit(rs *Ruleset) {
	r.committed = true
	r.committedOuts = rs.outs
}

// Reset forgets what was committed: the next render is a full one and deletes
// nothing.
func (r *Renderer) Reset() {
	r.committed = false
	r.committedOuts = nil
	r.cache = nil
}

// svc is one service port as the renderer sees it during a render.
type svc struct {
	spn     cluster.ServicePortName
	sp      *cluster.ServicePort
	name    string // "ns/name:port"
	proto   string // lower case
	cat     dataplane.Categorized
	svcName string // KUBE-SVC-...
	svlName string // KUBE-SVL-...
	extName string // KUBE-EXT-...

	hasEndpoints, hasInternal, hasExternal         bool
	usesClusterChain, usesLocalChain, usesExtChain bool
	internalChain, externalChain                   string
	// eps holds each reachable endpoint's key, chain and affinity set.
	eps map[*cluster.Endpoint]epRef
	// large drops per-endpoint comments (kube-proxy's largeClusterMode).
	large bool
}

// epRef is what the rules need of an endpoint.
type epRef struct {
	key string // "ip:port"
	sep string // KUBE-SEP-...
	set string // KUBE-AFF-..., "" unless the ipset affinity option is used
}

// svcOut is what one service port contributes to a render. The top-level
// lines are written on every render; the rest is what a partial render
// reuses for a service port that did not change.
type svcOut struct {
	natTop, filterTop   string // lines for KUBE-SERVICES, KUBE-NODEPORTS, ...
	nNatTop, nFilterTop int
	nChains, nRules     int      // the service port's own chains and rules
	chains              []string // its active nat chains
	sets                []string // its affinity sets
	refs                []namedRef
	services            []string // ChainMap.Services keys
	spn                 cluster.ServicePortName
	noLocalInternal     bool
	noLocalExternal     bool
}

type namedRef struct {
	name string
	ref  ChainRef
}

// lines collects restore lines, or only counts them when discard is set.
type lines struct {
	discard bool
	n       int
	b       bytes.Buffer
}

func (l *lines) add(ls ...string) {
	l.n += len(ls)
	if l.discard {
		return
	}
	for _, s := range ls {
		l.b.WriteString(s)
		l.b.WriteByte('\n')
	}
}

// line writes one line made of parts.
func (l *lines) line(parts ...string) {
	l.n++
	if l.discard {
		return
	}
	for _, p := range parts {
		l.b.WriteString(p)
	}
	l.b.WriteByte('\n')
}

func (l *lines) reset(discard bool) {
	l.n = 0
	l.discard = discard
	l.b.Reset()
}

// sections of one render: chain declarations and rules, per table.
type sections struct {
	filterChains, filterRules lines
	natChains, natRules       lines
	// skippedChains and skippedRules count what a partial render leaves
	// out.
	skippedChains, skippedRules int
	// top collects one service port's top-level lines.
	natTop, filterTop lines
	ipsetCreate       lines
}

// Render renders the ruleset of st for the configured node. changed names the
// service ports whose Service or endpoints changed since the last committed
// render; full forces a full render (the first render after NewRenderer or
// Reset is always full). A partial render rewrites only the chains of changed
// service ports plus the top-level chains (KUBE-SERVICES, KUBE-NODEPORTS,
// KUBE-EXTERNAL-SERVICES, ...), and deletes the service chains that are no
// longer used. Changes of node labels (topology) need a full render, and so
// does the first render after a failed restore.
func (r *Renderer) Render(st *cluster.State, changed []cluster.ServicePortName, full bool) (*Ruleset, error) {
	if st == nil {
		return nil, fmt.Errorf("could not render iptables rules: no cluster state")
	}
	full = full || !r.committed || r.cache == nil
	cat := r.cat
	if n := st.Nodes[r.cfg.NodeName]; n != nil {
		cat.Zone = n.Zone
	}
	chg := make(map[cluster.ServicePortName]bool, len(changed))
	for _, n := range changed {
		chg[n] = true
	}
	total := 0
	for _, eps := range st.Endpoints {
		total += len(eps)
	}
	large := r.cfg.LargeClusterThreshold >= 0 && total > r.cfg.LargeClusterThreshold

	rs := &Ruleset{
		Full:             full,
		NoLocalEndpoints: map[string]int{"internal": 0, "external": 0},
	}
	s := &r.buf
	for _, l := range []*lines{&s.filterChains, &s.filterRules, &s.natChains, &s.natRules, &s.ipsetCreate} {
		l.reset(false)
	}
	s.skippedChains, s.skippedRules = 0, 0
	r.topLevelChains(s)
	s.natRules.add(r.postroutingRules()...)
	s.natRules.add(r.markMasqRules()...)
	s.filterRules.add(r.forwardRules()...)
	s.filterRules.add(r.kubeletFirewallRules()...)

	cache := make(map[cluster.ServicePortName]*svcOut, len(st.Services))
	for _, spn := range st.SortedServicePorts() {
		sp := st.Services[spn]
		if sp == nil || sp.Headless || !sp.ClusterIP.IsValid() {
			continue
		}
		write := full || chg[spn]
		out := r.cache[spn]
		fresh, written := false, false
		if write || out == nil {
			eps := st.Endpoints[spn]
			if r.memory != nil {
				eps = r.memory.Merge(spn, eps)
			}
			v := r.newSvc(spn, sp, cat.Categorize(eps, sp))
			v.large = large
			out = r.renderService(v, s, write)
			fresh, written = true, write
		}
		cache[spn] = out
		r.use(rs, s, out, fresh, written)
	}
	r.cache = cache
	rs.outs = cache
	rs.Chains = &ChainMap{outs: cache}
	// Finally the jump to KUBE-NODEPORTS, which must be the last rule of
	// KUBE-SERVICES.
	s.natRules.add(r.nodePortsJumpRule())

	// Stale chains: declare (which flushes) then delete.
	var ipsetDestroy lines
	rs.Stale, rs.StaleSets = r.stale(cache)
	for _, c := range rs.Stale {
		s.natChains.add(chainLine(c))
		s.natRules.add("-X " + c)
	}
	for _, set := range rs.StaleSets {
		ipsetDestroy.add("destroy " + set)
	}

	var b strings.Builder
	b.Grow(s.filterChains.b.Len() + s.filterRules.b.Len() + s.natChains.b.Len() + s.natRules.b.Len() + 32)
	b.WriteString("*filter\n")
	b.Write(s.filterChains.b.Bytes())
	b.Write(s.filterRules.b.Bytes())
	b.WriteString("COMMIT\n*nat\n")
	b.Write(s.natChains.b.Bytes())
	b.Write(s.natRules.b.Bytes())
	b.WriteString("COMMIT\n")
	rs.Restore = b.String()
	rs.Lines = s.filterChains.n + s.filterRules.n + s.natChains.n + s.natRules.n + 4
	rs.IPSetRestore = s.ipsetCreate.b.String()
	rs.IPSetDestroy = ipsetDestroy.b.String()
	rs.FilterChains = s.filterChains.n
	rs.FilterRules = s.filterRules.n
	rs.NATChains = s.natChains.n + s.skippedChains - len(rs.Stale)
	rs.NATRules = s.natRules.n + s.skippedRules - len(rs.Stale)
	rs.Jumps = r.jumpRestore()
	return rs, nil
}

// renderService renders one service port: its top-level lines into out, its
// own chains into the sections when write is set (else only counted).
func (r *Renderer) renderService(v *svc, s *sections, write bool) *svcOut {
	out := &svcOut{spn: v.spn}
	s.natTop.reset(false)
	s.filterTop.reset(false)
	s.natTop.add(r.clusterIPRules(v)...)
	s.filterTop.add(r.clusterIPFilterRules(v)...)
	nat, filter := r.nodePortRules(v)
	s.natTop.add(nat...)
	s.filterTop.add(filter...)
	out.natTop, out.nNatTop = s.natTop.b.String(), s.natTop.n
	out.filterTop, out.nFilterTop = s.filterTop.b.String(), s.filterTop.n
	// The top-level lines go first, as in kube-proxy's output.
	s.writeTop(out)

	chains, rules := &s.natChains, &s.natRules
	if !write {
		chains, rules = &lines{discard: true}, &lines{discard: true}
	}
	c0, r0 := chains.n, rules.n
	out.chains = r.serviceChains(v, chains, rules)
	out.nChains, out.nRules = chains.n-c0, rules.n-r0
	if write {
		s.ipsetCreate.add(r.ipsetCreateLines(v)...)
	}
	for _, ep := range v.cat.AllReachable {
		if e := v.eps[ep]; e.set != "" {
			out.sets = append(out.sets, e.set)
		}
	}
	out.refs, out.services = r.mapService(v)
	out.noLocalInternal = v.hasEndpoints && !v.hasInternal
	out.noLocalExternal = v.hasEndpoints && dataplane.ExternallyAccessible(v.sp) && !v.hasExternal
	return out
}

func (s *sections) writeTop(out *svcOut) {
	s.natRules.b.WriteString(out.natTop)
	s.natRules.n += out.nNatTop
	s.filterRules.b.WriteString(out.filterTop)
	s.filterRules.n += out.nFilterTop
}

// use adds one service port's contribution to the render. fresh reports that
// renderService produced it in this render (and wrote its top-level lines);
// written that its own chains were written too.
func (r *Renderer) use(rs *Ruleset, s *sections, out *svcOut, fresh, written bool) {
	if !fresh {
		s.writeTop(out)
	}
	if !written {
		s.skippedChains += out.nChains
		s.skippedRules += out.nRules
	}
	if out.noLocalInternal {
		rs.NoLocalEndpoints["internal"]++
	}
	if out.noLocalExternal {
		rs.NoLocalEndpoints["external"]++
	}
}

// newSvc decides, as syncProxyRules does, which chains a service port uses and
// where its traffic goes.
func (r *Renderer) newSvc(spn cluster.ServicePortName, sp *cluster.ServicePort, cat dataplane.Categorized) *svc {
	v := &svc{
		spn: spn, sp: sp, name: spn.String(), proto: protocol(spn), cat: cat,
		svcName: ServiceChain(spn), svlName: LocalChain(spn), extName: ExternalChain(spn),
		eps: make(map[*cluster.Endpoint]epRef, len(cat.AllReachable)),
	}
	hashPrefix := v.name + v.proto
	for _, ep := range cat.AllReachable {
		k := ep.String()
		v.eps[ep] = epRef{key: k, sep: PrefixSEP + hash16(hashPrefix+k), set: r.affinitySet(v, k)}
	}
	v.hasEndpoints = cat.HasAny
	v.hasInternal = v.hasEndpoints
	v.internalChain = v.svcName
	if dataplane.InternalPolicyLocal(sp) {
		v.internalChain = v.svlName
		if len(cat.Local) == 0 {
			v.hasInternal = false
		}
	}
	v.hasExternal = v.hasEndpoints
	v.externalChain = v.svcName
	if dataplane.ExternalPolicyLocal(sp) {
		v.externalChain = v.svlName
		if len(cat.Local) == 0 {
			v.hasExternal = false
		}
	}
	v.usesClusterChain = len(cat.Cluster) > 0 && dataplane.UsesClusterEndpoints(sp)
	v.usesLocalChain = len(cat.Local) > 0 && dataplane.UsesLocalEndpoints(sp)
	v.usesExtChain = v.hasEndpoints && dataplane.ExternallyAccessible(sp)
	return v
}

// serviceChains writes the service port's own chains (SVC, SVL, EXT, SEP) and
// returns their names.
func (r *Renderer) serviceChains(v *svc, chains, rules *lines) []string {
	var names []string
	if v.hasInternal {
		rules.add(r.masqueradeRules(v)...)
	}
	if v.usesExtChain {
		chains.add(chainLine(v.extName))
		names = append(names, v.extName)
		rules.add(r.externalChainRules(v)...)
	}
	if v.usesClusterChain {
		chains.add(chainLine(v.svcName))
		names = append(names, v.svcName)
		r.affinityRules(rules, v, v.svcName, v.cat.Cluster)
		r.cascadeRules(rules, v, v.svcName, v.cat.Cluster)
	}
	if v.usesLocalChain {
		chains.add(chainLine(v.svlName))
		names = append(names, v.svlName)
		r.affinityRules(rules, v, v.svlName, v.cat.Local)
		r.cascadeRules(rules, v, v.svlName, v.cat.Local)
	}
	for _, ep := range v.cat.AllReachable {
		sep := v.eps[ep].sep
		chains.add(chainLine(sep))
		names = append(names, sep)
		r.endpointRules(rules, v, ep)
	}
	return names
}

// stale lists the chains and sets the kernel holds (as committed) that the
// render in cur no longer uses, sorted. A service port whose output was
// reused holds exactly what it held.
func (r *Renderer) stale(cur map[cluster.ServicePortName]*svcOut) (chains, sets []string) {
	for spn, old := range r.committedOuts {
		now := cur[spn]
		if now == old {
			continue
		}
		var keepC, keepS []string
		if now != nil {
			keepC, keepS = now.chains, now.sets
		}
		chains = appendMissing(chains, old.chains, keepC)
		sets = appendMissing(sets, old.sets, keepS)
	}
	slices.Sort(chains)
	slices.Sort(sets)
	return chains, sets
}

// appendMissing appends to out the names of old that are not in keep.
func appendMissing(out, old, keep []string) []string {
	if len(old) == 0 {
		return out
	}
	if len(keep) > 16 {
		in := make(map[string]bool, len(keep))
		for _, k := range keep {
			in[k] = true
		}
		for _, o := range old {
			if !in[o] {
				out = append(out, o)
			}
		}
		return out
	}
	for _, o := range old {
		if !slices.Contains(keep, o) {
			out = append(out, o)
		}
	}
	return out
}

// mapService lists the service port's chains, sets and destinations for the
// ruleset's ChainMap, for counters.
func (r *Renderer) mapService(v *svc) (refs []namedRef, services []string) {
	refs = make([]namedRef, 0, 3+2*len(v.eps))
	refs = append(refs,
		namedRef{v.svcName, ChainRef{ServicePort: v.spn, Kind: PrefixSVC}},
		namedRef{v.svlName, ChainRef{ServicePort: v.spn, Kind: PrefixSVL}},
		namedRef{v.extName, ChainRef{ServicePort: v.spn, Kind: PrefixEXT}},
	)
	for _, ep := range v.cat.AllReachable {
		e := v.eps[ep]
		refs = append(refs, namedRef{e.sep, ChainRef{ServicePort: v.spn, Endpoint: e.key, Kind: PrefixSEP}})
		if e.set != "" {
			refs = append(refs, namedRef{e.set, ChainRef{ServicePort: v.spn, Endpoint: e.key, Kind: PrefixAFF}})
		}
	}
	services = append(services, ServiceKey(v.proto, v.sp.ClusterIP.String(), int(v.sp.Port)))
	if dataplane.ExternallyAccessible(v.sp) {
		services = append(services, ServiceKey(v.proto, "", int(v.sp.NodePort)))
	}
	return refs, services
}

func chainLine(c string) string { return ":" + c + " - [0:0]" }

// topLevelChains declares the chains rewritten on every render, as kube-proxy
// does (a declaration with --noflush flushes the chain).
func (r *Renderer) topLevelChains(s *sections) {
	for _, c := range []string{ChainServices, ChainExternalServices, ChainForward, ChainNodePorts, ChainProxyFirewall, ChainKubeletFirewall} {
		s.filterChains.add(chainLine(c))
	}
	for _, c := range []string{ChainServices, ChainNodePorts, ChainPostrouting, ChainMarkMasq} {
		s.natChains.add(chainLine(c))
	}
}

// postroutingRules masquerade what KUBE-MARK-MASQ marked, clearing the mark
// first so that a packet that goes round again is not masqueraded twice.
func (r *Renderer) postroutingRules() []string {
	return []string{
		fmt.Sprintf("-A %s -m mark ! --mark %s/%s -j RETURN", ChainPostrouting, r.mark, r.mark),
		fmt.Sprintf("-A %s -j MARK --xor-mark %s", ChainPostrouting, r.mark),
		fmt.Sprintf(`-A %s -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`, ChainPostrouting),
	}
}

// markMasqRules is the single rule of KUBE-MARK-MASQ.
func (r *Renderer) markMasqRules() []string {
	return []string{fmt.Sprintf("-A %s -j MARK --or-mark %s", ChainMarkMasq, r.mark)}
}

// forwardRules accept marked and established traffic in FORWARD, whatever the
// chain's policy, and drop INVALID packets (unless conntrack is liberal).
func (r *Renderer) forwardRules() []string {
	var out []string
	if !r.cfg.ConntrackTCPLiberal {
		out = append(out, fmt.Sprintf("-A %s -m conntrack --ctstate INVALID -j DROP", ChainForward))
	}
	return append(out,
		fmt.Sprintf(`-A %s -m comment --comment "kubernetes forwarding rules" -m mark --mark %s/%s -j ACCEPT`, ChainForward, r.mark, r.mark),
		fmt.Sprintf(`-A %s -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`, ChainForward),
	)
}

// kubeletFirewallRules is the anti-martian rule kube-proxy writes (copying
// kubelet's) when localhost node ports are allowed, its default.
func (r *Renderer) kubeletFirewallRules() []string {
	return []string{fmt.Sprintf(`-A %s -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`, ChainKubeletFirewall)}
}

// nodePortsJumpRule is KUBE-SERVICES' last rule.
func (r *Renderer) nodePortsJumpRule() string {
	return fmt.Sprintf(`-A %s -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j %s`, ChainServices, ChainNodePorts)
}

// clusterIPRules sends traffic for the cluster IP to the internal policy
// chain, when it has endpoints.
func (r *Renderer) clusterIPRules(v *svc) []string {
	if !v.hasInternal {
		return nil
	}
	return []string{fmt.Sprintf(`-A %s -m comment --comment "%s cluster IP" -m %s -p %s -d %s --dport %d -j %s`,
		ChainServices, v.name, v.proto, v.proto, v.sp.ClusterIP, v.sp.Port, v.internalChain)}
}

// clusterIPFilterRules REJECT traffic for a service port without endpoints,
// and DROP it for internalTrafficPolicy Local without local endpoints.
func (r *Renderer) clusterIPFilterRules(v *svc) []string {
	if v.hasInternal {
		return nil
	}
	target, comment := "REJECT", v.name+" has no endpoints"
	if v.hasEndpoints {
		target, comment = "DROP", v.name+" has no local endpoints"
	}
	return []string{fmt.Sprintf(`-A %s -m comment --comment "%s" -m %s -p %s -d %s --dport %d -j %s`,
		ChainServices, comment, v.proto, v.proto, v.sp.ClusterIP, v.sp.Port, target)}
}

// nodePortRules send node-port traffic to the KUBE-EXT chain (nat), and
// REJECT or DROP it when there is nowhere to send it (filter).
func (r *Renderer) nodePortRules(v *svc) (nat, filter []string) {
	if !dataplane.ExternallyAccessible(v.sp) {
		return nil, nil
	}
	if v.hasEndpoints {
		nat = append(nat, fmt.Sprintf(`-A %s -m comment --comment %s -m %s -p %s --dport %d -j %s`,
			ChainNodePorts, v.name, v.proto, v.proto, v.sp.NodePort, v.extName))
	}
	if !v.hasExternal {
		target, comment := "REJECT", v.name+" has no endpoints"
		if v.hasEndpoints {
			target, comment = "DROP", v.name+" has no local endpoints"
		}
		filter = append(filter, fmt.Sprintf(`-A %s -m comment --comment "%s" -m addrtype --dst-type LOCAL -m %s -p %s --dport %d -j %s`,
			ChainExternalServices, comment, v.proto, v.proto, v.sp.NodePort, target))
	}
	return nat, filter
}

// masqueradeRules mark traffic to the cluster IP from outside the pod range
// (or all of it, with masqueradeAll), in the internal policy chain.
func (r *Renderer) masqueradeRules(v *svc) []string {
	base := fmt.Sprintf(`-A %s -m comment --comment "%s cluster IP" -m %s -p %s -d %s --dport %d`,
		v.internalChain, v.name, v.proto, v.proto, v.sp.ClusterIP, v.sp.Port)
	switch {
	case r.cfg.MasqueradeAll:
		return []string{base + " -j " + ChainMarkMasq}
	case r.cfg.ClusterCIDR.IsValid():
		return []string{fmt.Sprintf("%s ! -s %s -j %s", base, r.cfg.ClusterCIDR.Masked(), ChainMarkMasq)}
	}
	return nil
}

// externalChainRules fill KUBE-EXT: masquerade and go to the Cluster chain for
// externalTrafficPolicy Cluster; for Local, short-circuit pod and host traffic
// to the Cluster chain (masquerading host traffic) and send the rest to the
// Local chain.
func (r *Renderer) externalChainRules(v *svc) []string {
	var out []string
	if !dataplane.ExternalPolicyLocal(v.sp) {
		out = append(out, fmt.Sprintf(`-A %s -m comment --comment "masquerade traffic for %s external destinations" -j %s`, v.extName, v.name, ChainMarkMasq))
	} else {
		if r.cfg.ClusterCIDR.IsValid() {
			out = append(out, fmt.Sprintf(`-A %s -m comment --comment "pod traffic for %s external destinations" -s %s -j %s`, v.extName, v.name, r.cfg.ClusterCIDR.Masked(), v.svcName))
		}
		out = append(out,
			fmt.Sprintf(`-A %s -m comment --comment "masquerade LOCAL traffic for %s external destinations" -m addrtype --src-type LOCAL -j %s`, v.extName, v.name, ChainMarkMasq),
			fmt.Sprintf(`-A %s -m comment --comment "route LOCAL traffic for %s external destinations" -m addrtype --src-type LOCAL -j %s`, v.extName, v.name, v.svcName),
		)
	}
	if v.hasExternal {
		out = append(out, fmt.Sprintf("-A %s -j %s", v.extName, v.externalChain))
	}
	return out
}

// comment is kube-proxy's appendServiceCommentLocked: left out in large
// clusters.
func (r *Renderer) comment(large bool, text string) string {
	if large {
		return ""
	}
	if strings.ContainsAny(text, " \t") {
		return ` -m comment --comment "` + text + `"`
	}
	return " -m comment --comment " + text
}

// The per-endpoint families below write straight into the line buffer, in
// pieces: building a string per rule and a slice per family cost a quarter of
// a full render at 5000 Services x 10 endpoints.

// epComment appends the per-endpoint comment `"svc -> ip:port"` in pieces.
func epComment(parts []string, v *svc, key string) []string {
	if v.large {
		return parts
	}
	return append(parts, ` -m comment --comment "`, v.name, " -> ", key, `"`)
}

// affinityRules send a client with a live affinity entry for an endpoint
// straight to that endpoint's chain, before the cascade.
func (r *Renderer) affinityRules(w *lines, v *svc, chain string, eps []*cluster.Endpoint) {
	if !v.sp.ClientIPAffinity {
		return
	}
	var buf [16]string
	seconds := strconv.Itoa(int(v.sp.AffinityTimeout))
	for _, ep := range eps {
		e := v.eps[ep]
		parts := epComment(append(buf[:0], "-A ", chain), v, e.key)
		switch {
		case e.set != "":
			parts = append(parts, " -m set --match-set ", e.set, " src")
		case r.cfg.Faults.Has(dataplane.FaultAffinityNoTimeout):
			// --reap needs --seconds, so both go.
			parts = append(parts, " -m recent --name ", e.sep, " --rcheck")
		default:
			parts = append(parts, " -m recent --name ", e.sep, " --rcheck --seconds ", seconds, " --reap")
		}
		w.line(append(parts, " -j ", e.sep)...)
	}
}

// cascadeRules are the load-balancing rules: rule i of n matches with
// probability 1/(n-i), the last one always, which gives each endpoint 1/n.
func (r *Renderer) cascadeRules(w *lines, v *svc, chain string, eps []*cluster.Endpoint) {
	if r.cfg.Faults.Has(dataplane.FaultDropLastEndpoint) && len(eps) > 0 {
		eps = eps[:len(eps)-1]
	}
	var buf [16]string
	n := len(eps)
	for i, ep := range eps {
		e := v.eps[ep]
		parts := epComment(append(buf[:0], "-A ", chain), v, e.key)
		if i < n-1 {
			p := n - i
			if r.cfg.Faults.Has(dataplane.FaultUniformProbability) {
				p = n
			}
			parts = append(parts, " -m statistic --mode random --probability ", r.probability(p))
		}
		w.line(append(parts, " -j ", e.sep)...)
	}
}

// endpointRules fill a KUBE-SEP chain: masquerade hairpin traffic (the
// endpoint reaching itself through the Service), record the client for
// affinity, and DNAT.
func (r *Renderer) endpointRules(w *lines, v *svc, ep *cluster.Endpoint) {
	e := v.eps[ep]
	var buf [16]string
	head := append(buf[:0], "-A ", e.sep)
	if !v.large {
		head = append(head, " -m comment --comment ", v.name)
	}
	n := len(head)
	w.line(append(head, " -s ", ep.IP.String(), " -j ", ChainMarkMasq)...)
	head = head[:n]
	if v.sp.ClientIPAffinity {
		if e.set != "" {
			parts := append(head, " -j SET --add-set ", e.set, " src --exist")
			if !r.cfg.Faults.Has(dataplane.FaultAffinityNoTimeout) {
				parts = append(parts, " --timeout ", strconv.Itoa(int(v.sp.AffinityTimeout)))
			}
			w.line(parts...)
			head = head[:n]
		} else {
			head = append(head, " -m recent --name ", e.sep, " --set")
		}
	}
	w.line(append(head, " -m ", v.proto, " -p ", v.proto, " -j DNAT --to-destination ", e.key)...)
}

// affinitySet is the ipset of an endpoint ("ip:port") under AffinityIPSet,
// else "".
func (r *Renderer) affinitySet(v *svc, endpoint string) string {
	if r.cfg.Affinity != AffinityIPSet || !v.sp.ClientIPAffinity {
		return ""
	}
	t := int(v.sp.AffinityTimeout)
	if r.cfg.Faults.Has(dataplane.FaultAffinityNoTimeout) {
		t = -1
	}
	return AffinitySet(v.spn, endpoint, t)
}

// ipsetCreateLines create the service port's affinity sets (for
// `ipset restore -exist`, which leaves an identical existing set alone).
func (r *Renderer) ipsetCreateLines(v *svc) []string {
	var out []string
	for _, ep := range v.cat.AllReachable {
		set := v.eps[ep].set
		if set == "" {
			continue
		}
		if r.cfg.Faults.Has(dataplane.FaultAffinityNoTimeout) {
			out = append(out, "create "+set+" hash:ip family inet")
		} else {
			out = append(out, "create "+set+" hash:ip family inet timeout "+strconv.Itoa(int(v.sp.AffinityTimeout)))
		}
	}
	return out
}

// probability is kube-proxy's computeProbability, cached.
func (r *Renderer) probability(n int) string {
	if n < len(r.probs) && r.probs[n] != "" {
		return r.probs[n]
	}
	if n >= len(r.probs) && n <= 1000 {
		r.probs = slices.Grow(r.probs, n+1-len(r.probs))[:n+1]
	}
	s := Probability(n)
	if n < len(r.probs) {
		r.probs[n] = s
	}
	return s
}

// Probability is 1/n printed as kube-proxy prints it, %0.10f.
func Probability(n int) string { return fmt.Sprintf("%0.10f", 1.0/float64(n)) }
