package iptables

// The renderer is kube-proxy's syncProxyRules cut into rule families: each
// family is a small function that appends its lines, and Render only decides
// which families to call for which service port and where their lines go
// (written, or only counted when a partial sync skips an unchanged service
// port).
//
// Rendering cost matters: a full sync is held to 1.1 times a raw
// iptables-restore of the same text. So the families append straight into
// reused byte buffers (no fmt, no string per rule or per argument), chain
// names are kept as fixed-size hashes and turned into strings only where a
// string is handed out (stale chains, the ChainMap, built lazily), and the
// hashes of a service port and of its endpoints are taken from the previous
// render's output for the same service port when there is one. A service
// port whose output is identical to the previous render's keeps the previous
// svcOut, so that a full render of an unchanged cluster allocates little
// besides the text.

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Renderer renders one node's ruleset and remembers the chains and sets of
// the last ruleset the kernel took (see Commit), so that a partial render
// knows what became stale. It is not safe for concurrent use.
type Renderer struct {
	cfg  Config
	mark string
	cat  proxy.Categorizer
	// probs caches the probability strings, as kube-proxy's
	// precomputedProbabilities does.
	probs []string
	// memory implements the keep-deleted-endpoint fault.
	memory *proxy.EndpointMemory
	// cache holds, per service port, what the last render produced for
	// it, so that a partial render does not recompute unchanged ones (and
	// any render reuses its chain-name hashes).
	cache map[cluster.ServicePortName]*svcOut
	// buffers are reused from render to render.
	buf       sections
	committed bool
	// committedOuts is, per service port, what the kernel holds: the
	// chains and sets stale detection compares against.
	committedOuts map[cluster.ServicePortName]*svcOut
	// maybeChains and maybeSets are the chains and sets, with their service
	// port, that renders applied without success since the last commit had
	// and committedOuts has not: the kernel may hold them (see Abort).
	// aborted reports such a render; the next one is full.
	maybeChains, maybeSets map[string]cluster.ServicePortName
	aborted                bool
	// lingering are the stale chains, with their service port, that
	// large-cluster renders left in place (Config.StaleChainPeriod) and the
	// kernel holds, rules and all; lastCleanup is when a render last
	// deleted stale chains.
	lingering   map[string]cluster.ServicePortName
	lastCleanup time.Time

	// Fixed text, made once: the rules of the top-level chains that do not
	// depend on Services, and the jump rules.
	natStatic, filterStatic []string
	jumps                   string
	// cidr is the masked ClusterCIDR as text ("" without one).
	cidr string

	// order is the last render's sorted service ports, reused while the
	// set of service ports stays the same; orderSP their ServicePorts in
	// this render; outs the last render's outputs (cache's values, nil for
	// a service port that was not rendered), parallel to order.
	order   []cluster.ServicePortName
	orderSP []*cluster.ServicePort
	outs    []*svcOut
	// gen counts renders; cacheGen is the render that made cache and
	// committedGen the one that made committedOuts. When they are the same,
	// stale chains can only come from the service ports whose output
	// changed in this render.
	gen, cacheGen, committedGen uint64
	// changed is this render's changed service ports, sorted; moved the
	// service ports whose output differs from the cache's.
	changed []cluster.ServicePortName
	moved   []outPair
	// Scratch space of one service port's render.
	tmp    svcOut
	hashIn []byte
	// nfInvalid and nfLocalhost report that kube-proxy's nfacct counters
	// exist (SetNFAcct): the rules then count into them.
	nfInvalid, nfLocalhost bool
	// Per-render copies of the faults in force.
	fUniform, fDropLast, fNoTimeout bool
	fSkew, fLeak, fOverstay         bool
	fSourceRangesOpen, fLocalMasq   bool
	fHairpinNoMasq                  bool
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
		cat:  cfg.Faults.Categorizer(cfg.NodeName, cfg.PreferSameNode),
	}
	if cfg.Faults.Has(proxy.FaultKeepDeletedEndpoint) {
		r.memory = proxy.NewEndpointMemory()
	}
	if cfg.ClusterCIDR.IsValid() {
		r.cidr = cfg.ClusterCIDR.Masked().String()
	}
	r.natStatic = append(r.postroutingRules(), r.markMasqRules()...)
	r.filterStatic = append(r.forwardRules(), r.kubeletFirewallRules()...)
	r.jumps = r.jumpRestore()
	return r, nil
}

// SetNFAcct says which of kube-proxy's nfacct counters (NFAcctCounters)
// exist in the kernel: the INVALID drop rule and the localhost node-port
// rules match only those. Without a call, none does. The Backend calls it
// before each full render, after creating the counters.
func (r *Renderer) SetNFAcct(have map[string]bool) {
	r.nfInvalid, r.nfLocalhost = have[NFAcctInvalidDropped], have[NFAcctLocalhostNodePorts]
	r.filterStatic = append(r.forwardRules(), r.kubeletFirewallRules()...)
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
	r.committedGen = rs.gen
	r.maybeChains, r.maybeSets, r.aborted = nil, nil, false
	r.lingering = rs.lingering
}

// Abort records that applying rs failed, so that the kernel holds the last
// committed state, rs, or anything in between: iptables-restore commits
// table by table (filter, then nat), ipset restore line by line, and a
// command can fail after its last commit. What was committed stays the
// reference of stale detection, and the chains and sets of rs that it lacks
// are remembered as maybe held. The next render is full: it rewrites every
// chain it uses, and deletes the committed chains and sets and the maybe
// held ones that it does not use. Deleting a chain the kernel does not hold
// is harmless (the render declares it, which creates it, before -X); a set
// is not, so a Backend removes from IPSetDestroy, after a failure, the sets
// the kernel does not list. The kernel's chains and sets stay within the
// committed ones and the maybe held ones whatever failed where, since a
// restore only creates the chains and sets its render names.
func (r *Renderer) Abort(rs *Ruleset) {
	if r.maybeChains == nil {
		r.maybeChains = map[string]cluster.ServicePortName{}
		r.maybeSets = map[string]cluster.ServicePortName{}
	}
	for spn, now := range rs.outs {
		old := r.committedOuts[spn]
		if now == old {
			continue
		}
		chains, sets := now.appendMissing(nil, nil, old)
		for _, c := range chains {
			r.maybeChains[c] = spn
		}
		for _, s := range sets {
			r.maybeSets[s] = spn
		}
	}
	r.aborted = true
}

// Reset forgets what was committed: the next render is a full one and deletes
// nothing. It is for a kernel known to hold no service chains and sets (after
// Backend.Cleanup); after a failed apply, use Abort.
func (r *Renderer) Reset() {
	r.committed = false
	r.committedOuts = nil
	r.cache = nil
	r.committedGen = 0
	r.maybeChains, r.maybeSets, r.aborted = nil, nil, false
	r.lingering, r.lastCleanup = nil, time.Time{}
}

// outPair is a service port's output in the cache (old) and in this render
// (now, nil when it is not rendered any more).
type outPair struct{ old, now *svcOut }

// hashLen is the length of kube-proxy's chain-name hashes.
const hashLen = 16

// hash is a chain-name hash, sha256 then base32, first 16 characters.
type hash [hashLen]byte

// svcInfo is what a service port's rules and chain map depend on, besides
// its endpoints. It is comparable: two svcOuts with equal svcInfo and eps
// are interchangeable.
type svcInfo struct {
	spn   cluster.ServicePortName
	name  string // "ns/name:port"
	proto string // lower case
	// h is the suffix of the SVC, SVL and EXT chains.
	h              hash
	clusterIP      netip.Addr
	port, nodePort int32
	hcNodePort     int32 // healthCheckNodePort, 0 for none
	// extKey stands for the external IPs, load-balancer IPs and source
	// ranges (svcOut's ext), so that svcInfo stays comparable: "" when
	// there are none.
	extKey string
	// usesFW: the KUBE-FW chain is written (load-balancer IPs with source
	// ranges, and endpoints).
	usesFW bool
	// Roles are kube-proxy's role flags of the service port.
	proxy.Roles
	sorted          bool // eps sorted by ip:port, without duplicates
	nChains, nRules int  // the service port's own chains and rules
}

// epOut is one reachable endpoint: its key, chain and affinity set.
type epOut struct {
	ap  netip.AddrPort // the key, "ip:port"
	sep hash           // KUBE-SEP-<sep>
	aff hash           // KUBE-AFF-<aff>, when hasAff
	// affT is the timeout hashed into aff.
	affT   int32
	hasAff bool
}

// svcOut is what one service port contributes to a render. The top-level
// lines are written on every render (from svcInfo); the rest is what a
// partial render reuses for a service port that did not change. A svcOut is
// never modified once made, so renders can share it.
type svcOut struct {
	svcInfo
	// ext are the service port's external destinations (shared with the
	// cluster state, never modified).
	ext extAddrs
	// eps are the reachable endpoints (AllReachable order).
	eps []epOut
}

// extAddrs are a service port's destinations outside the cluster IP and
// its source ranges, as the cluster model carries them.
type extAddrs struct {
	externalIPs, lbIPs []netip.Addr
	ranges             []netip.Prefix
}

// extAddrsOf takes sp's external destinations and their key.
func extAddrsOf(sp *cluster.ServicePort) (extAddrs, string) {
	e := extAddrs{externalIPs: sp.ExternalIPs, lbIPs: sp.LoadBalancerIPs, ranges: sp.SourceRanges}
	if len(e.externalIPs) == 0 && len(e.lbIPs) == 0 && len(e.ranges) == 0 {
		return e, ""
	}
	b := make([]byte, 0, 64)
	for _, a := range e.externalIPs {
		b = append(a.AppendTo(append(b, 'e')), ' ')
	}
	for _, a := range e.lbIPs {
		b = append(a.AppendTo(append(b, 'l')), ' ')
	}
	for _, p := range e.ranges {
		b = append(p.AppendTo(append(b, 's')), ' ')
	}
	return e, string(b)
}

func (o *svcOut) equal(p *svcOut) bool {
	return o.svcInfo == p.svcInfo && slices.Equal(o.eps, p.eps)
}

// find returns the endpoint of o with key ap, or nil. *cur is where the
// search starts: endpoints are usually looked up in o's order.
func (o *svcOut) find(ap netip.AddrPort, cur *int) *epOut {
	if c := *cur; c < len(o.eps) && o.eps[c].ap == ap {
		*cur = c + 1
		return &o.eps[c]
	}
	switch {
	case o.sorted:
		i, ok := slices.BinarySearchFunc(o.eps, ap, func(e epOut, ap netip.AddrPort) int { return e.ap.Compare(ap) })
		if ok {
			*cur = i + 1
			return &o.eps[i]
		}
	case len(o.eps) <= 64:
		for i := range o.eps {
			if o.eps[i].ap == ap {
				*cur = i + 1
				return &o.eps[i]
			}
		}
	}
	return nil
}

// lines collects restore lines in chunks: a line is appended to b, the
// current chunk, and end moves on to a new chunk when b has little room
// left, so that text is never copied to grow a buffer (the nat rules of
// 5000 Services x 10 endpoints are 14 MB). Chunks are kept for the next
// render.
type lines struct {
	n      int
	b      []byte
	chunks [][]byte // full chunks, before b
	spare  [][]byte // chunks of earlier renders, for reuse
	size   int      // the next new chunk's capacity
}

const (
	minChunk = 16 << 10
	maxChunk = 2 << 20
	// lineRoom is the room a chunk keeps for the next line. A longer line
	// is fine: append grows the chunk.
	lineRoom = 2 << 10
)

func (l *lines) add(s string) {
	l.b = append(append(l.b, s...), '\n')
	l.end0()
}

// end ends a line appended to l.b.
func (l *lines) end() {
	l.b = append(l.b, '\n')
	l.end0()
}

func (l *lines) end0() {
	l.n++
	if cap(l.b)-len(l.b) < lineRoom {
		l.next()
	}
}

// next starts a new chunk.
func (l *lines) next() {
	if l.b != nil {
		l.chunks = append(l.chunks, l.b)
	}
	if n := len(l.spare); n > 0 {
		l.b = l.spare[n-1][:0]
		l.spare[n-1] = nil
		l.spare = l.spare[:n-1]
		return
	}
	l.size = min(max(2*l.size, minChunk), maxChunk)
	l.b = make([]byte, 0, l.size)
}

func (l *lines) reset() {
	l.n = 0
	if l.b == nil {
		l.next()
	}
	for i := len(l.chunks) - 1; i >= 0; i-- {
		l.spare = append(l.spare, l.chunks[i][:0])
		l.chunks[i] = nil
	}
	l.chunks = l.chunks[:0]
	l.b = l.b[:0]
}

// len is the length of the text.
func (l *lines) len() int {
	n := len(l.b)
	for _, c := range l.chunks {
		n += len(c)
	}
	return n
}

// writeTo appends the text to b.
func (l *lines) writeTo(b *strings.Builder) {
	for _, c := range l.chunks {
		b.Write(c)
	}
	b.Write(l.b)
}

// String returns the text.
func (l *lines) String() string {
	var b strings.Builder
	b.Grow(l.len())
	l.writeTo(&b)
	return b.String()
}

// sections of one render: chain declarations and rules, per table.
type sections struct {
	filterChains, filterRules lines
	natChains, natRules       lines
	// skippedChains and skippedRules count what a partial render leaves
	// out.
	skippedChains, skippedRules int
	ipsetCreate                 lines
	// discardChains and discardRules take the chains of a service port
	// that is only counted.
	discardChains, discardRules lines
}

// Render renders the ruleset of st for the configured node. changed names the
// service ports whose Service or endpoints changed since the last committed
// render; full forces a full render (the first render after NewRenderer or
// Reset, and after Abort, is always full). A partial render rewrites only the chains of changed
// service ports plus the top-level chains (KUBE-SERVICES, KUBE-NODEPORTS,
// KUBE-EXTERNAL-SERVICES, ...), and deletes the service chains that are no
// longer used. Changes of node labels (topology) need a full render, and so
// does the first render after a failed restore.
func (r *Renderer) Render(st *cluster.State, changed []cluster.ServicePortName, full bool) (*Ruleset, error) {
	if st == nil {
		return nil, fmt.Errorf("could not render iptables rules: no cluster state")
	}
	full = full || !r.committed || r.cache == nil || r.aborted
	cat := r.cat
	if n := st.Nodes[r.cfg.NodeName]; n != nil {
		cat.Zone = n.Zone
	}
	r.readFaults()
	large := r.cfg.LargeClusterThreshold >= 0 && st.ProxiedEndpoints() > r.cfg.LargeClusterThreshold

	rs := &Ruleset{
		Full:             full,
		NoLocalEndpoints: map[string]int{"internal": 0, "external": 0},
	}
	s := r.startSections()
	cache, quickStale := r.renderServices(st, changed, full, cat, large, rs, s)
	rs.outs, rs.gen = cache, r.gen
	rs.Chains = &ChainMap{outs: cache}
	// Finally the jump to KUBE-NODEPORTS, which must be the last rule of
	// KUBE-SERVICES.
	s.natRules.add(nodePortsJumpRule)
	r.deleteStale(rs, s, cache, quickStale, large)
	r.assemble(rs, s)
	return rs, nil
}

// readFaults sets the renderer's fault switches from its config.
func (r *Renderer) readFaults() {
	r.fUniform = r.cfg.Faults.Has(proxy.FaultUniformProbability)
	r.fDropLast = r.cfg.Faults.Has(proxy.FaultDropLastEndpoint)
	r.fNoTimeout = r.cfg.Faults.Has(proxy.FaultAffinityNoTimeout)
	r.fSkew = r.cfg.Faults.Has(proxy.FaultSkewAtMDE)
	r.fLeak = r.cfg.Faults.Has(proxy.FaultAffinityLeak)
	// Without a timeout there is nothing to overstay.
	r.fOverstay = r.cfg.Faults.Has(proxy.FaultAffinityOverstay) && !r.fNoTimeout
	r.fSourceRangesOpen = r.cfg.Faults.Has(proxy.FaultSourceRangesOpen)
	r.fLocalMasq = r.cfg.Faults.Has(proxy.FaultLocalMasquerade)
	r.fHairpinNoMasq = r.cfg.Faults.Has(proxy.FaultHairpinNoMasquerade)
}

// startSections empties the render buffers and writes the top-level chains
// and the static rules.
func (r *Renderer) startSections() *sections {
	s := &r.buf
	for _, l := range []*lines{&s.filterChains, &s.filterRules, &s.natChains, &s.natRules, &s.ipsetCreate} {
		l.reset()
	}
	s.skippedChains, s.skippedRules = 0, 0
	r.topLevelChains(s)
	for _, l := range r.natStatic {
		s.natRules.add(l)
	}
	for _, l := range r.filterStatic {
		s.filterRules.add(l)
	}
	return s
}

// renderServices renders (or reuses) every service port's chains into s,
// in order, and returns the new output cache; quickStale says whether the
// stale chains can be found from the outputs that moved alone.
func (r *Renderer) renderServices(st *cluster.State, changed []cluster.ServicePortName, full bool, cat proxy.Categorizer, large bool,
	rs *Ruleset, s *sections) (_ map[cluster.ServicePortName]*svcOut, quickStale bool) {
	r.gen++
	order, sps, same := r.sortedServicePorts(st)
	// With the same service ports as the last render, its outputs are at
	// the same positions, and its map only needs the changes.
	aligned := same && r.cache != nil
	var cache map[cluster.ServicePortName]*svcOut
	if aligned {
		cache = maps.Clone(r.cache)
	} else {
		cache = make(map[cluster.ServicePortName]*svcOut, len(order))
		r.outs = slices.Grow(r.outs[:0], len(order))[:len(order)]
	}
	quickStale = aligned && r.committedOuts != nil && r.committedGen == r.cacheGen
	r.moved = r.moved[:0]
	// changed, sorted, is walked beside order.
	ch := r.changed[:0]
	if !full {
		ch = append(ch, changed...)
		slices.SortFunc(ch, cluster.CompareNames)
	}
	r.changed = ch
	for i, spn := range order {
		var prev *svcOut
		if aligned {
			prev = r.outs[i]
		} else {
			prev = r.cache[spn]
		}
		sp := sps[i]
		if sp == nil || sp.Headless || !sp.ClusterIP.IsValid() {
			if aligned && prev != nil {
				delete(cache, spn)
				r.moved = append(r.moved, outPair{prev, nil})
			}
			r.outs[i] = nil
			continue
		}
		write := full
		if !full {
			for len(ch) > 0 && cluster.CompareNames(ch[0], spn) < 0 {
				ch = ch[1:]
			}
			write = len(ch) > 0 && ch[0] == spn
		}
		out := prev
		fresh, written := false, false
		if write || out == nil {
			eps := st.Endpoints[spn]
			if r.memory != nil {
				eps = r.memory.Merge(spn, eps)
			}
			out = r.renderService(spn, sp, cat.Categorize(eps, sp), prev, large, s, write)
			fresh, written = true, write
		}
		if !aligned || out != prev {
			cache[spn] = out
			if prev != nil {
				r.moved = append(r.moved, outPair{prev, out})
			}
		}
		r.outs[i] = out
		r.use(rs, s, out, fresh, written)
	}
	clear(sps) // do not keep the state's ServicePorts alive
	r.cache, r.cacheGen = cache, r.gen
	return cache, quickStale
}

// deleteStale finds the chains and sets no service port uses any more, and
// declares (which flushes) then deletes each stale chain. In large-cluster
// mode it does so at most once per StaleChainPeriod, as kube-proxy, and
// otherwise leaves the stale chains as they are (Ruleset.Lingering).
func (r *Renderer) deleteStale(rs *Ruleset, s *sections, cache map[cluster.ServicePortName]*svcOut, quickStale, large bool) {
	stale, sets := r.stale(cache, quickStale)
	now := r.cfg.Now()
	if large && r.cfg.Affinity == AffinityRecent && r.cfg.StaleChainPeriod > 0 && now.Sub(r.lastCleanup) <= r.cfg.StaleChainPeriod {
		rs.lingering = r.staleOwners(stale)
		rs.Lingering = stale
		return
	}
	r.lastCleanup = now
	rs.Stale, rs.StaleSets = stale, sets
	for _, c := range rs.Stale {
		s.natChains.b = appendChainLine(s.natChains.b, c, nil)
		s.natChains.end()
		s.natRules.b = append(append(s.natRules.b, "-X "...), c...)
		s.natRules.end()
	}
	if len(rs.StaleSets) > 0 {
		var b strings.Builder
		for _, set := range rs.StaleSets {
			b.WriteString("destroy " + set + "\n")
		}
		rs.IPSetDestroy = b.String()
	}
}

// assemble writes the restore text of s into rs and counts its lines.
func (r *Renderer) assemble(rs *Ruleset, s *sections) {
	const head, mid, tail = "*filter\n", "COMMIT\n*nat\n", "COMMIT\n"
	var b strings.Builder
	b.Grow(len(head) + s.filterChains.len() + s.filterRules.len() + len(mid) + s.natChains.len() + s.natRules.len() + len(tail))
	b.WriteString(head)
	s.filterChains.writeTo(&b)
	s.filterRules.writeTo(&b)
	b.WriteString(mid)
	s.natChains.writeTo(&b)
	s.natRules.writeTo(&b)
	b.WriteString(tail)
	rs.Restore = b.String()
	rs.Lines = s.filterChains.n + s.filterRules.n + s.natChains.n + s.natRules.n + 4
	rs.IPSetRestore = s.ipsetCreate.String()
	rs.FilterChains = s.filterChains.n
	rs.FilterRules = s.filterRules.n
	rs.NATChains = s.natChains.n + s.skippedChains - len(rs.Stale)
	rs.NATRules = s.natRules.n + s.skippedRules - len(rs.Stale)
	rs.Jumps = r.jumps
}

// sortedServicePorts returns st's service ports in order, and their
// ServicePorts. The order of the last render is reused when st has the same
// service ports (sorting 5000 names costs more than checking them); same
// reports it.
func (r *Renderer) sortedServicePorts(st *cluster.State) (_ []cluster.ServicePortName, _ []*cluster.ServicePort, same bool) {
	sps := r.orderSP[:0]
	if len(r.order) == len(st.Services) {
		same = true
		for _, n := range r.order {
			sp, ok := st.Services[n]
			if !ok {
				same = false
				break
			}
			sps = append(sps, sp)
		}
		if same {
			r.orderSP = sps
			return r.order, sps, true
		}
		clear(sps)
		sps = sps[:0]
	}
	r.order = st.SortedServicePorts()
	for _, n := range r.order {
		sps = append(sps, st.Services[n])
	}
	r.orderSP = sps
	return r.order, sps, false
}

// svc is one service port as the renderer sees it while rendering it.
type svc struct {
	sp  *cluster.ServicePort
	cat proxy.Categorized
	// o is the service port's output being made: o.eps is parallel to
	// cat.AllReachable.
	o *svcOut
	// large drops per-endpoint comments (kube-proxy's largeClusterMode).
	large bool
	// cur is where the next endpoint lookup by pointer starts.
	cur int
}

// ep returns the output of list[i] (an endpoint of the Cluster or Local
// set), found by pointer among the reachable endpoints; nil if it is not
// there (a duplicate ip:port that the union of both sets left out).
func (v *svc) ep(list []*cluster.Endpoint, i int) *epOut {
	all, ep := v.cat.AllReachable, list[i]
	if i < len(all) && all[i] == ep {
		return &v.o.eps[i]
	}
	for j := v.cur; j < len(all); j++ {
		if all[j] == ep {
			v.cur = j + 1
			return &v.o.eps[j]
		}
	}
	for j := 0; j < v.cur && j < len(all); j++ {
		if all[j] == ep {
			v.cur = j + 1
			return &v.o.eps[j]
		}
	}
	return nil
}

// renderService renders one service port: its top-level lines, and its own
// chains into the sections when write is set (else only counted). prev is
// the previous render's output for the service port, if any: its hashes are
// reused, and so is prev itself when nothing changed.
func (r *Renderer) renderService(spn cluster.ServicePortName, sp *cluster.ServicePort, cat proxy.Categorized, prev *svcOut, large bool, s *sections, write bool) *svcOut {
	o := &r.tmp
	o.svcInfo = svcInfo{spn: spn}
	if prev != nil {
		o.name, o.proto, o.h = prev.name, prev.proto, prev.h
	} else {
		o.name, o.proto = portName(spn), protocol(spn)
		r.hashIn = append(append(r.hashIn[:0], o.name...), o.proto...)
		hashTo(&o.h, r.hashIn)
	}
	r.endpoints(o, sp, cat.AllReachable, prev)

	v := &svc{sp: sp, cat: cat, o: o, large: large}
	o.clusterIP, o.port, o.nodePort, o.hcNodePort = sp.ClusterIP, sp.Port, sp.NodePort, sp.HealthCheckNodePort
	o.Roles = cat.Roles(sp)
	o.ext, o.extKey = extAddrsOf(sp)
	// kube-proxy: usesFWChain := hasEndpoints && len(LoadBalancerVIPs) > 0
	// && len(LoadBalancerSourceRanges) > 0.
	// Under the source-ranges-open fault the ranges are ignored: the
	// load-balancer IPs go straight to KUBE-EXT and nothing is dropped.
	o.usesFW = o.HasEndpoints && len(o.ext.lbIPs) > 0 && len(o.ext.ranges) > 0 && !r.fSourceRangesOpen

	// The top-level lines go first, as in kube-proxy's output.
	r.writeTop(s, o)

	chains, rules := &s.natChains, &s.natRules
	if !write {
		s.discardChains.reset()
		s.discardRules.reset()
		chains, rules = &s.discardChains, &s.discardRules
	}
	c0, r0 := chains.n, rules.n
	r.serviceChains(v, chains, rules)
	o.nChains, o.nRules = chains.n-c0, rules.n-r0
	if write {
		r.ipsetCreateLines(v, &s.ipsetCreate)
	}
	if prev != nil && o.equal(prev) {
		return prev
	}
	out := &svcOut{svcInfo: o.svcInfo, ext: o.ext}
	if len(o.eps) > 0 {
		out.eps = slices.Clone(o.eps)
	}
	return out
}

// endpoints fills o.eps for the reachable endpoints: key, chain hash and,
// with the ipset option, affinity set hash, reusing prev's hashes.
func (r *Renderer) endpoints(o *svcOut, sp *cluster.ServicePort, reachable []*cluster.Endpoint, prev *svcOut) {
	useSet := r.cfg.Affinity == AffinityIPSet && sp.ClientIPAffinity
	t := sp.AffinityTimeout
	if r.fNoTimeout {
		t = -1
	}
	eps := o.eps[:0]
	o.sorted = true
	cur := 0
	for i, ep := range reachable {
		e := epOut{ap: netip.AddrPortFrom(ep.IP, uint16(ep.Port))}
		var old *epOut
		if prev != nil {
			old = prev.find(e.ap, &cur)
		}
		if old != nil {
			e.sep = old.sep
		} else {
			r.hashIn = appendAddrPort(append(append(r.hashIn[:0], o.name...), o.proto...), e.ap)
			hashTo(&e.sep, r.hashIn)
		}
		if useSet {
			e.hasAff, e.affT = true, t
			if old != nil && old.hasAff && old.affT == t {
				e.aff = old.aff
			} else {
				r.hashIn = appendAddrPort(append(append(r.hashIn[:0], o.name...), o.proto...), e.ap)
				r.hashIn = strconv.AppendInt(append(r.hashIn, "/timeout="...), int64(t), 10)
				hashTo(&e.aff, r.hashIn)
			}
		}
		if i > 0 && eps[i-1].ap.Compare(e.ap) >= 0 {
			o.sorted = false
		}
		eps = append(eps, e)
	}
	o.eps = eps
}

// use adds one service port's contribution to the render. fresh reports that
// renderService produced it in this render (and wrote its top-level lines);
// written that its own chains were written too.
func (r *Renderer) use(rs *Ruleset, s *sections, out *svcOut, fresh, written bool) {
	if !fresh {
		r.writeTop(s, out)
	}
	if !written {
		s.skippedChains += out.nChains
		s.skippedRules += out.nRules
	}
	if out.NoLocalInternal {
		rs.NoLocalEndpoints["internal"]++
	}
	if out.NoLocalExternal {
		rs.NoLocalEndpoints["external"]++
	}
}

// serviceChains writes the service port's own chains (SVC, SVL, EXT, SEP).
func (r *Renderer) serviceChains(v *svc, chains, rules *lines) {
	o := v.o
	if o.HasInternal {
		r.masqueradeRules(rules, o)
	}
	if o.UsesExtChain {
		chains.b = appendChainLine(chains.b, PrefixEXT, &o.h)
		chains.end()
		r.externalChainRules(rules, v)
	}
	if o.usesFW {
		chains.b = appendChainLine(chains.b, PrefixFW, &o.h)
		chains.end()
		r.firewallChainRules(rules, o)
	}
	if o.UsesClusterChain {
		chains.b = appendChainLine(chains.b, PrefixSVC, &o.h)
		chains.end()
		r.affinityRules(rules, v, PrefixSVC, v.cat.Cluster)
		r.cascadeRules(rules, v, PrefixSVC, v.cat.Cluster)
	}
	if o.UsesLocalChain {
		chains.b = appendChainLine(chains.b, PrefixSVL, &o.h)
		chains.end()
		r.affinityRules(rules, v, PrefixSVL, v.cat.Local)
		r.cascadeRules(rules, v, PrefixSVL, v.cat.Local)
	}
	for i, ep := range v.cat.AllReachable {
		chains.b = appendChainLine(chains.b, PrefixSEP, &o.eps[i].sep)
		chains.end()
		r.endpointRules(rules, v, ep, &o.eps[i])
	}
}

// stale lists the chains and sets the kernel holds (as committed) that the
// render in cur no longer uses, sorted. A service port whose output was
// reused holds exactly what it held. quick reports that the kernel holds
// the cache this render started from: then only the outputs in r.moved
// changed.
func (r *Renderer) stale(cur map[cluster.ServicePortName]*svcOut, quick bool) (chains, sets []string) {
	if quick {
		for _, p := range r.moved {
			chains, sets = p.old.appendMissing(chains, sets, p.now)
		}
	} else {
		for spn, old := range r.committedOuts {
			now := cur[spn]
			if now == old {
				continue
			}
			chains, sets = old.appendMissing(chains, sets, now)
		}
	}
	clear(r.moved)
	// What a failed apply may have left (see Abort), and what large-cluster
	// renders left in place, unless used now.
	for _, m := range []map[string]cluster.ServicePortName{r.maybeChains, r.lingering} {
		for c, spn := range m {
			if now := cur[spn]; now == nil || !now.holds(c, false) {
				chains = append(chains, c)
			}
		}
	}
	for s, spn := range r.maybeSets {
		if now := cur[spn]; now == nil || !now.holds(s, true) {
			sets = append(sets, s)
		}
	}
	slices.Sort(chains)
	slices.Sort(sets)
	return slices.Compact(chains), slices.Compact(sets)
}

// staleOwners maps each stale chain to the service port that had it: from
// the chains left in place or maybe held before, else from the committed
// outputs (one pass over them).
func (r *Renderer) staleOwners(stale []string) map[string]cluster.ServicePortName {
	out := make(map[string]cluster.ServicePortName, len(stale))
	want := make(map[string]bool, len(stale))
	for _, c := range stale {
		if spn, ok := r.lingering[c]; ok {
			out[c] = spn
		} else if spn, ok := r.maybeChains[c]; ok {
			out[c] = spn
		} else {
			want[c] = true
		}
	}
	for spn, o := range r.committedOuts {
		if len(want) == 0 {
			break
		}
		for _, c := range o.chainNames() {
			if want[c] {
				out[c] = spn
				delete(want, c)
			}
		}
	}
	return out
}

// chainNames lists the service port's chains.
func (o *svcOut) chainNames() []string {
	var out []string
	for _, c := range []struct {
		prefix string
		used   bool
	}{{PrefixSVC, o.UsesClusterChain}, {PrefixSVL, o.UsesLocalChain}, {PrefixEXT, o.UsesExtChain}, {PrefixFW, o.usesFW}} {
		if c.used {
			out = append(out, c.prefix+string(o.h[:]))
		}
	}
	for _, e := range o.eps {
		out = append(out, PrefixSEP+string(e.sep[:]))
	}
	return out
}

// holds reports whether the service port's output uses the chain (or, with
// set, the ipset) name.
func (o *svcOut) holds(name string, set bool) bool {
	if set {
		h, ok := strings.CutPrefix(name, PrefixAFF)
		return ok && slices.ContainsFunc(o.eps, func(e epOut) bool { return e.hasAff && string(e.aff[:]) == h })
	}
	if h, ok := strings.CutPrefix(name, PrefixSEP); ok {
		return slices.ContainsFunc(o.eps, func(e epOut) bool { return string(e.sep[:]) == h })
	}
	for _, c := range []struct {
		prefix string
		used   bool
	}{{PrefixSVC, o.UsesClusterChain}, {PrefixSVL, o.UsesLocalChain}, {PrefixEXT, o.UsesExtChain}, {PrefixFW, o.usesFW}} {
		if h, ok := strings.CutPrefix(name, c.prefix); ok {
			return c.used && string(o.h[:]) == h
		}
	}
	return false
}

// appendMissing appends the names of o's chains and sets that now (the same
// service port, or nil) does not have.
func (o *svcOut) appendMissing(chains, sets []string, now *svcOut) ([]string, []string) {
	var keep *svcOut
	if now != nil {
		keep = now
	} else {
		keep = &svcOut{}
	}
	// The SVC, SVL and EXT names only depend on the service port.
	if o.UsesExtChain && !keep.UsesExtChain {
		chains = append(chains, PrefixEXT+string(o.h[:]))
	}
	if o.UsesClusterChain && !keep.UsesClusterChain {
		chains = append(chains, PrefixSVC+string(o.h[:]))
	}
	if o.UsesLocalChain && !keep.UsesLocalChain {
		chains = append(chains, PrefixSVL+string(o.h[:]))
	}
	if o.usesFW && !keep.usesFW {
		chains = append(chains, PrefixFW+string(o.h[:]))
	}
	if len(o.eps) == 0 {
		return chains, sets
	}
	hasSEP := func(h hash) bool {
		return slices.ContainsFunc(keep.eps, func(e epOut) bool { return e.sep == h })
	}
	hasAFF := func(h hash) bool {
		return slices.ContainsFunc(keep.eps, func(e epOut) bool { return e.hasAff && e.aff == h })
	}
	if len(keep.eps) > 16 {
		seps := make(map[hash]bool, len(keep.eps))
		affs := make(map[hash]bool)
		for _, e := range keep.eps {
			seps[e.sep] = true
			if e.hasAff {
				affs[e.aff] = true
			}
		}
		hasSEP = func(h hash) bool { return seps[h] }
		hasAFF = func(h hash) bool { return affs[h] }
	}
	for _, e := range o.eps {
		if !hasSEP(e.sep) {
			chains = append(chains, PrefixSEP+string(e.sep[:]))
		}
		if e.hasAff && !hasAFF(e.aff) {
			sets = append(sets, PrefixAFF+string(e.aff[:]))
		}
	}
	return chains, sets
}

// index adds the service port's chains, sets and destinations to a
// ChainMap's index, for counters.
func (o *svcOut) index(chains map[string]ChainRef, services map[string]cluster.ServicePortName) {
	h := string(o.h[:])
	chains[PrefixSVC+h] = ChainRef{ServicePort: o.spn, Kind: PrefixSVC}
	chains[PrefixSVL+h] = ChainRef{ServicePort: o.spn, Kind: PrefixSVL}
	chains[PrefixEXT+h] = ChainRef{ServicePort: o.spn, Kind: PrefixEXT}
	chains[PrefixFW+h] = ChainRef{ServicePort: o.spn, Kind: PrefixFW}
	for i := range o.eps {
		e := &o.eps[i]
		key := e.key()
		chains[PrefixSEP+string(e.sep[:])] = ChainRef{ServicePort: o.spn, Endpoint: key, Kind: PrefixSEP}
		if e.hasAff {
			chains[PrefixAFF+string(e.aff[:])] = ChainRef{ServicePort: o.spn, Endpoint: key, Kind: PrefixAFF}
		}
	}
	services[ServiceKey(o.proto, o.clusterIP.String(), int(o.port))] = o.spn
	if o.nodePort != 0 {
		services[ServiceKey(o.proto, "", int(o.nodePort))] = o.spn
	}
	for _, l := range [][]netip.Addr{o.ext.externalIPs, o.ext.lbIPs} {
		for _, a := range l {
			services[ServiceKey(o.proto, a.String(), int(o.port))] = o.spn
		}
	}
}

// refs is the number of chain and set names index adds.
func (o *svcOut) refs() int {
	n := 4 + len(o.eps)
	for i := range o.eps {
		if o.eps[i].hasAff {
			n++
		}
	}
	return n
}

// key is the endpoint's "ip:port".
func (e *epOut) key() string { return e.ap.String() }

// appendAddrPort appends ap as AddrPort.String does.
func appendAddrPort(b []byte, ap netip.AddrPort) []byte {
	if !ap.Addr().IsValid() {
		return append(b, ap.String()...)
	}
	return ap.AppendTo(b)
}

// appendAddr appends ip as Addr.String does.
func appendAddr(b []byte, ip netip.Addr) []byte {
	if !ip.IsValid() {
		return append(b, ip.String()...)
	}
	return ip.AppendTo(b)
}

// appendChain appends a chain (or set) name, prefix and hash.
func appendChain(b []byte, prefix string, h *hash) []byte {
	b = append(b, prefix...)
	if h != nil {
		b = append(b, h[:]...)
	}
	return b
}

// appendChainLine appends a chain declaration (without the newline).
func appendChainLine(b []byte, prefix string, h *hash) []byte {
	b = appendChain(append(b, ':'), prefix, h)
	return append(b, " - [0:0]"...)
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
	switch {
	case r.cfg.ConntrackTCPLiberal:
	case r.nfInvalid:
		out = append(out, fmt.Sprintf("-A %s -m conntrack --ctstate INVALID -m nfacct --nfacct-name %s -j DROP", ChainForward, NFAcctInvalidDropped))
	default:
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
const nodePortsJumpRule = `-A ` + ChainServices + ` -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j ` + ChainNodePorts

// writeTop writes a service port's lines in the top-level chains.
func (r *Renderer) writeTop(s *sections, o *svcOut) {
	r.clusterIPRules(&s.natRules, o)
	r.clusterIPFilterRules(&s.filterRules, o)
	r.externalIPRules(&s.natRules, &s.filterRules, o)
	r.loadBalancerRules(&s.natRules, &s.filterRules, o)
	r.nodePortRules(&s.natRules, &s.filterRules, o)
	r.healthCheckRule(&s.filterRules, o)
}

// appendDstMatch appends ` -m <proto> -p <proto> -d <ip> --dport <port>`.
func appendDstMatch(b []byte, o *svcOut, ip netip.Addr) []byte {
	b = appendAddr(append(appendMatch(b, o), " -d "...), ip)
	return strconv.AppendInt(append(b, " --dport "...), int64(o.port), 10)
}

// externalIPRules send traffic for each external IP to the KUBE-EXT chain
// when the service port has endpoints (nat KUBE-SERVICES), and REJECT or DROP
// it when external traffic has nowhere to go (filter
// KUBE-EXTERNAL-SERVICES), as kube-proxy's "Capture externalIPs".
func (r *Renderer) externalIPRules(nat, filter *lines, o *svcOut) {
	for _, ip := range o.ext.externalIPs {
		if o.HasEndpoints {
			b := append(append(nat.b, "-A "+ChainServices+` -m comment --comment "`...), o.name...)
			b = appendDstMatch(append(b, ` external IP"`...), o, ip)
			nat.b = appendChain(append(b, " -j "...), PrefixEXT, &o.h)
			nat.end()
		}
		if !o.HasExternal {
			b, target := appendNoEndpoints(append(filter.b, "-A "+ChainExternalServices...), o)
			filter.b = append(append(appendDstMatch(b, o, ip), " -j "...), target...)
			filter.end()
		}
	}
}

// loadBalancerRules send traffic for each load-balancer IP to the KUBE-FW
// chain (source ranges) or straight to KUBE-EXT (nat KUBE-SERVICES), drop
// what the firewall chain let through without DNAT (filter
// KUBE-PROXY-FIREWALL), and REJECT or DROP when external traffic has nowhere
// to go (filter KUBE-EXTERNAL-SERVICES), as kube-proxy's "Capture
// load-balancer ingress".
func (r *Renderer) loadBalancerRules(nat, filter *lines, o *svcOut) {
	target := PrefixEXT
	if o.usesFW {
		target = PrefixFW
	}
	for _, ip := range o.ext.lbIPs {
		if o.HasEndpoints {
			b := append(append(nat.b, "-A "+ChainServices+` -m comment --comment "`...), o.name...)
			b = appendDstMatch(append(b, ` loadbalancer IP"`...), o, ip)
			nat.b = appendChain(append(b, " -j "...), target, &o.h)
			nat.end()
		}
		if o.usesFW {
			b := append(append(filter.b, "-A "+ChainProxyFirewall+` -m comment --comment "`...), o.name...)
			b = appendChain(append(b, " traffic not accepted by "...), PrefixFW, &o.h)
			filter.b = append(appendDstMatch(append(b, '"'), o, ip), " -j DROP"...)
			filter.end()
		}
	}
	if !o.HasExternal {
		for _, ip := range o.ext.lbIPs {
			b, target := appendNoEndpoints(append(filter.b, "-A "+ChainExternalServices...), o)
			filter.b = append(append(appendDstMatch(b, o, ip), " -j "...), target...)
			filter.end()
		}
	}
}

// firewallChainRules fill KUBE-FW: traffic from each source range goes on
// to KUBE-EXT (and from the load-balancer IPs themselves when a range holds
// the node's address: a VIP-like balancer's address is local, so the node
// reaches it from that address); the rest falls through, undNATed, to
// KUBE-PROXY-FIREWALL's DROP. The last rule only comments on that.
func (r *Renderer) firewallChainRules(w *lines, o *svcOut) {
	head := func() []byte {
		b := appendChain(append(w.b, "-A "...), PrefixFW, &o.h)
		return append(append(append(b, ` -m comment --comment "`...), o.name...), ` loadbalancer IP"`...)
	}
	var nodeIP netip.Addr
	if len(r.cfg.NodeIPs) > 0 {
		nodeIP = r.cfg.NodeIPs[0]
	}
	allowFromNode := false
	for _, p := range o.ext.ranges {
		b := append(append(head(), " -s "...), p.String()...)
		w.b = appendChain(append(b, " -j "...), PrefixEXT, &o.h)
		w.end()
		allowFromNode = allowFromNode || p.Contains(nodeIP)
	}
	if allowFromNode {
		for _, ip := range o.ext.lbIPs {
			b := appendAddr(append(head(), " -s "...), ip)
			w.b = appendChain(append(b, " -j "...), PrefixEXT, &o.h)
			w.end()
		}
	}
	b := appendChain(append(w.b, "-A "...), PrefixFW, &o.h)
	b = append(append(b, ` -m comment --comment "other traffic to `...), o.name...)
	w.b = append(b, ` will be dropped by KUBE-PROXY-FIREWALL"`...)
	w.end()
}

// healthCheckRule accepts connections to the Service's healthCheckNodePort
// (filter KUBE-NODEPORTS), whether or not this node has local endpoints.
// kube-proxy writes it for each port of the Service.
func (r *Renderer) healthCheckRule(w *lines, o *svcOut) {
	if o.hcNodePort == 0 {
		return
	}
	b := append(append(w.b, "-A "+ChainNodePorts+` -m comment --comment "`...), o.name...)
	b = append(b, ` health check node port" -m tcp -p tcp --dport `...)
	w.b = append(strconv.AppendInt(b, int64(o.hcNodePort), 10), " -j ACCEPT"...)
	w.end()
}

// appendMatch appends ` -m <proto> -p <proto>`.
func appendMatch(b []byte, o *svcOut) []byte {
	b = append(append(b, " -m "...), o.proto...)
	return append(append(b, " -p "...), o.proto...)
}

// appendClusterIPMatch appends ` -m <proto> -p <proto> -d <cluster IP> --dport <port>`.
func appendClusterIPMatch(b []byte, o *svcOut) []byte {
	b = appendAddr(append(appendMatch(b, o), " -d "...), o.clusterIP)
	return strconv.AppendInt(append(b, " --dport "...), int64(o.port), 10)
}

// appendNoEndpoints appends the comment and target of a REJECT or DROP rule.
func appendNoEndpoints(b []byte, o *svcOut) (_ []byte, target string) {
	b = append(append(b, ` -m comment --comment "`...), o.name...)
	if o.HasEndpoints {
		return append(b, ` has no local endpoints"`...), "DROP"
	}
	return append(b, ` has no endpoints"`...), "REJECT"
}

// clusterIPRules sends traffic for the cluster IP to the internal policy
// chain, when it has endpoints.
func (r *Renderer) clusterIPRules(w *lines, o *svcOut) {
	if !o.HasInternal {
		return
	}
	b := append(w.b, "-A "+ChainServices+` -m comment --comment "`...)
	b = append(append(b, o.name...), ` cluster IP"`...)
	b = append(appendClusterIPMatch(b, o), " -j "...)
	w.b = appendChain(b, o.internalChainPrefix(), &o.h)
	w.end()
}

// internalChainPrefix is the prefix of the chain cluster-IP traffic goes to.
func (o *svcOut) internalChainPrefix() string {
	if o.InternalLocal {
		return PrefixSVL
	}
	return PrefixSVC
}

// clusterIPFilterRules REJECT traffic for a service port without endpoints,
// and DROP it for internalTrafficPolicy Local without local endpoints.
func (r *Renderer) clusterIPFilterRules(w *lines, o *svcOut) {
	if o.HasInternal {
		return
	}
	b, target := appendNoEndpoints(append(w.b, "-A "+ChainServices...), o)
	b = append(append(appendClusterIPMatch(b, o), " -j "...), target...)
	w.b = b
	w.end()
}

// nodePortRules send node-port traffic to the KUBE-EXT chain (nat), first
// the localhost one through its nfacct counter when that exists, and
// REJECT or DROP it when there is nowhere to send it (filter).
func (r *Renderer) nodePortRules(nat, filter *lines, o *svcOut) {
	if o.nodePort == 0 {
		return
	}
	if o.HasEndpoints && r.nfLocalhost {
		// Node ports on 127.0.0.0/8 (route_localnet), counted.
		b := append(append(nat.b, "-A "+ChainNodePorts+" -m comment --comment "...), o.name...)
		b = strconv.AppendInt(append(appendMatch(b, o), " -d 127.0.0.0/8 --dport "...), int64(o.nodePort), 10)
		b = append(b, " -m nfacct --nfacct-name "+NFAcctLocalhostNodePorts...)
		nat.b = appendChain(append(b, " -j "...), PrefixEXT, &o.h)
		nat.end()
	}
	if o.HasEndpoints {
		b := append(append(nat.b, "-A "+ChainNodePorts+" -m comment --comment "...), o.name...)
		b = strconv.AppendInt(append(appendMatch(b, o), " --dport "...), int64(o.nodePort), 10)
		nat.b = appendChain(append(b, " -j "...), PrefixEXT, &o.h)
		nat.end()
	}
	if !o.HasExternal {
		b, target := appendNoEndpoints(append(filter.b, "-A "+ChainExternalServices...), o)
		b = appendMatch(append(b, " -m addrtype --dst-type LOCAL"...), o)
		b = strconv.AppendInt(append(b, " --dport "...), int64(o.nodePort), 10)
		filter.b = append(append(b, " -j "...), target...)
		filter.end()
	}
}

// masqueradeRules mark traffic to the cluster IP from outside the pod range
// (or all of it, with masqueradeAll), in the internal policy chain.
func (r *Renderer) masqueradeRules(w *lines, o *svcOut) {
	if !r.cfg.MasqueradeAll && r.cidr == "" {
		return
	}
	b := appendChain(append(w.b, "-A "...), o.internalChainPrefix(), &o.h)
	b = append(append(append(b, ` -m comment --comment "`...), o.name...), ` cluster IP"`...)
	b = appendClusterIPMatch(b, o)
	if !r.cfg.MasqueradeAll {
		b = append(append(b, " ! -s "...), r.cidr...)
	}
	w.b = append(b, " -j "+ChainMarkMasq...)
	w.end()
}

// externalChainRules fill KUBE-EXT: masquerade and go to the Cluster chain for
// externalTrafficPolicy Cluster; for Local, short-circuit pod and host traffic
// to the Cluster chain (masquerading host traffic) and send the rest to the
// Local chain.
func (r *Renderer) externalChainRules(w *lines, v *svc) {
	o := v.o
	rule := func(comment, middle, target string, h *hash) {
		b := appendChain(append(w.b, "-A "...), PrefixEXT, &o.h)
		b = append(append(append(b, ` -m comment --comment "`...), comment...), o.name...)
		b = append(append(b, ` external destinations"`...), middle...)
		w.b = appendChain(append(b, " -j "...), target, h)
		w.end()
	}
	if !v.o.ExternalLocal || r.fLocalMasq {
		// Under the local-masquerade fault, Local traffic is masqueraded
		// too, before the short-circuits.
		rule("masquerade traffic for ", "", ChainMarkMasq, nil)
	}
	if v.o.ExternalLocal {
		if r.cidr != "" {
			rule("pod traffic for ", " -s "+r.cidr, PrefixSVC, &o.h)
		}
		rule("masquerade LOCAL traffic for ", " -m addrtype --src-type LOCAL", ChainMarkMasq, nil)
		rule("route LOCAL traffic for ", " -m addrtype --src-type LOCAL", PrefixSVC, &o.h)
	}
	if o.HasExternal {
		b := appendChain(append(w.b, "-A "...), PrefixEXT, &o.h)
		prefix := PrefixSVC
		if v.o.ExternalToLocal {
			prefix = PrefixSVL
		}
		w.b = appendChain(append(b, " -j "...), prefix, &o.h)
		w.end()
	}
}

// The per-endpoint families below are most of the text (5000 Services x 10
// endpoints: 200,000 of 215,000 lines).

// appendEPComment appends the per-endpoint comment `"svc -> ip:port"`.
func appendEPComment(b []byte, v *svc, e *epOut) []byte {
	if v.large {
		return b
	}
	b = append(append(b, ` -m comment --comment "`...), v.o.name...)
	b = append(b, " -> "...)
	if e != nil {
		b = appendAddrPort(b, e.ap)
	}
	return append(b, '"')
}

// appendSEP appends an endpoint's chain name ("" for a missing endpoint).
func appendSEP(b []byte, e *epOut) []byte {
	if e == nil {
		return b
	}
	return appendChain(b, PrefixSEP, &e.sep)
}

// affinityRules send a client with a live affinity entry for an endpoint
// straight to that endpoint's chain, before the cascade. Under the
// affinity-leak fault the leaking clients skip them (the cluster match
// selects the others); under affinity-overstay with recent lists each
// endpoint has two rules, see recentRules.
func (r *Renderer) affinityRules(w *lines, v *svc, chain string, eps []*cluster.Endpoint) {
	if !v.sp.ClientIPAffinity {
		return
	}
	v.cur = 0
	for i := range eps {
		e := v.ep(eps, i)
		head := func() []byte {
			b := appendEPComment(appendChain(append(w.b, "-A "...), chain, &v.o.h), v, e)
			if r.fLeak {
				b = appendClientMatch(b, proxy.LeakBuckets, true)
			}
			return b
		}
		if e != nil && e.hasAff {
			b := append(appendChain(append(head(), " -m set --match-set "...), PrefixAFF, &e.aff), " src"...)
			w.b = appendSEP(append(b, " -j "...), e)
			w.end()
			continue
		}
		r.recentRules(w, v, e, head)
	}
}

// recentRules are the affinity rules of one endpoint with recent lists: one
// rcheck of the timeout (--reap needs --seconds, so the affinity-no-timeout
// fault drops both). Under affinity-overstay, the overstaying clients'
// rule checks twice the timeout and reaps beyond it; the others' rule
// checks the timeout without --reap, which would purge the list's oldest
// entry once older than the timeout, whoever it belongs to.
func (r *Renderer) recentRules(w *lines, v *svc, e *epOut, head func() []byte) {
	rule := func(b []byte, seconds int32, reap bool) {
		b = append(appendSEP(append(b, " -m recent --name "...), e), " --rcheck"...)
		if seconds > 0 {
			b = strconv.AppendInt(append(b, " --seconds "...), int64(seconds), 10)
		}
		if reap {
			b = append(b, " --reap"...)
		}
		w.b = appendSEP(append(b, " -j "...), e)
		w.end()
	}
	switch {
	case r.fNoTimeout:
		rule(head(), 0, false)
	case r.fOverstay:
		rule(appendClientMatch(head(), proxy.OverstayBuckets, false), 2*v.sp.AffinityTimeout, true)
		rule(appendClientMatch(head(), proxy.OverstayBuckets, true), v.sp.AffinityTimeout, false)
	default:
		rule(head(), v.sp.AffinityTimeout, true)
	}
}

// appendClientMatch appends the cluster match of the clients in bucket 0 of
// n (proxy.ClientBucket), or with not of the others. xt_cluster hashes
// the connection's original source address with jhash and scales the hash
// into --cluster-total-nodes buckets; node 1 is bucket 0.
func appendClientMatch(b []byte, n int, not bool) []byte {
	b = strconv.AppendInt(append(b, " -m cluster --cluster-total-nodes "...), int64(n), 10)
	if not {
		b = append(b, " !"...)
	}
	b = append(b, " --cluster-local-node 1 --cluster-hash-seed "...)
	return append(b, ClientHashSeed...)
}

// ClientHashSeed is proxy.ClientHashSeed as the cluster match takes it.
var ClientHashSeed = fmt.Sprintf("%#x", proxy.ClientHashSeed)

// cascadeRules are the load-balancing rules: rule i of n matches with
// probability 1/(n-i), the last one always, which gives each endpoint 1/n.
func (r *Renderer) cascadeRules(w *lines, v *svc, chain string, eps []*cluster.Endpoint) {
	if r.fDropLast && len(eps) > 0 {
		eps = eps[:len(eps)-1]
	}
	v.cur = 0
	n := len(eps)
	for i := range eps {
		e := v.ep(eps, i)
		b := appendEPComment(appendChain(append(w.b, "-A "...), chain, &v.o.h), v, e)
		if i < n-1 {
			p := n - i
			if r.fUniform {
				p = n
			}
			prob := r.probability(p)
			if r.fSkew && !r.fUniform && i == 0 {
				prob = SkewProbability(n)
			}
			b = append(append(b, " -m statistic --mode random --probability "...), prob...)
		}
		w.b = appendSEP(append(b, " -j "...), e)
		w.end()
	}
}

// endpointRules fill a KUBE-SEP chain: masquerade hairpin traffic (the
// endpoint reaching itself through the Service), record the client for
// affinity, and DNAT.
func (r *Renderer) endpointRules(w *lines, v *svc, ep *cluster.Endpoint, e *epOut) {
	head := func(b []byte) []byte {
		b = appendChain(append(b, "-A "...), PrefixSEP, &e.sep)
		if !v.large {
			b = append(append(b, " -m comment --comment "...), v.o.name...)
		}
		return b
	}
	if !r.fHairpinNoMasq {
		b := appendAddr(append(head(w.b), " -s "...), ep.IP)
		w.b = append(b, " -j "+ChainMarkMasq...)
		w.end()
	}
	b := head(w.b)
	if v.sp.ClientIPAffinity {
		if e.hasAff {
			r.addSetRules(w, v, e, head)
			b = head(w.b)
		} else {
			b = append(appendChain(append(b, " -m recent --name "...), PrefixSEP, &e.sep), " --set"...)
		}
	}
	b = append(appendMatch(b, v.o), " -j DNAT --to-destination "...)
	w.b = appendAddrPort(b, e.ap)
	w.end()
}

// addSetRules record the client in the endpoint's affinity set, with the
// timeout (none under affinity-no-timeout). Under affinity-overstay the
// overstaying clients' entries get twice the timeout, the others' the
// timeout, by two rules.
func (r *Renderer) addSetRules(w *lines, v *svc, e *epOut, head func([]byte) []byte) {
	rule := func(b []byte, timeout int32) {
		b = append(appendChain(append(b, " -j SET --add-set "...), PrefixAFF, &e.aff), " src --exist"...)
		if timeout > 0 {
			b = strconv.AppendInt(append(b, " --timeout "...), int64(timeout), 10)
		}
		w.b = b
		w.end()
	}
	switch {
	case r.fNoTimeout:
		rule(head(w.b), 0)
	case r.fOverstay:
		rule(appendClientMatch(head(w.b), proxy.OverstayBuckets, false), 2*v.sp.AffinityTimeout)
		rule(appendClientMatch(head(w.b), proxy.OverstayBuckets, true), v.sp.AffinityTimeout)
	default:
		rule(head(w.b), v.sp.AffinityTimeout)
	}
}

// ipsetCreateLines create the service port's affinity sets (for
// `ipset restore -exist`, which leaves an identical existing set alone).
func (r *Renderer) ipsetCreateLines(v *svc, w *lines) {
	for i := range v.o.eps {
		e := &v.o.eps[i]
		if !e.hasAff {
			continue
		}
		b := append(appendChain(append(w.b, "create "...), PrefixAFF, &e.aff), " hash:ip family inet"...)
		if !r.fNoTimeout {
			b = strconv.AppendInt(append(b, " timeout "...), int64(v.sp.AffinityTimeout), 10)
		}
		w.b = b
		w.end()
	}
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

// SkewProbability is the first cascade rule's probability of n endpoints
// under the skew-at-mde fault (uniform-probability, which also sets it, wins
// when both are on, as in the other modes), the first endpoint's target share
// (proxy.MDESkewWeights), printed as Probability prints: the others'
// rules keep 1/(n-i), which splits the rest evenly.
func SkewProbability(n int) string {
	w := proxy.MDESkewWeights(n)
	var sum uint64
	for _, x := range w {
		sum += x
	}
	return fmt.Sprintf("%0.10f", float64(w[0])/float64(sum))
}

// Probability is 1/n printed as kube-proxy prints it, %0.10f.
func Probability(n int) string { return fmt.Sprintf("%0.10f", 1.0/float64(n)) }

// hashTo stores kube-proxy's chain-name hash of in in h: sha256, base32
// (standard alphabet), first 16 characters, which are the encoding of the
// first 10 bytes of the digest.
func hashTo(h *hash, in []byte) {
	sum := sha256.Sum256(in)
	base32.StdEncoding.Encode(h[:], sum[:10])
}
