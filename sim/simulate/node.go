package simulate

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/report"
)

// gvCount counts one service port version's connections from one node.
type gvCount struct {
	Total       int64
	Established int64
	Accepted    int64
	Dropped     int64
	Rejected    int64
	// Decisions are new connections decided while the node's rules were up
	// to date for the version; Mismatched of them disagreed with the
	// oracle; Fresh were accepted free choices (not held by affinity), the
	// sample of the distribution tests.
	Decisions  int64
	Mismatched int64
	Fresh      int64
	// In the exposure window (rules older than the API state).
	InWindow  int64
	Misrouted int64
	Refused   int64
	// Lost were accepted by an endpoint the oracle allows where it says
	// the replies never reach the client (outcome.lost).
	Lost int64
}

type syncRec struct {
	dur      int64
	periodic bool
}

// affCount is an affinity check's tally on one node.
type affCount struct {
	bound, violations, known int64
}

// nodeResult is what one node's run in one mode hands back.
type nodeResult struct {
	gv    []gvCount
	cells []uint32 // fresh accepted connections per version and endpoint
	syncs []syncRec
	// window per step: ns from the step to the end of the sync that put it
	// in this node's rules; -1 when no sync did (no write, or never).
	window []int64
	// Affinity (every ClientIP service port).
	bound, kept, recentEvictedLive int64
	peakLive                       int64
	// Per node totals.
	conns, toLocal, dropped, rejected, localDropped, localRejected int64
	// Timeline bins of the followed service port.
	tlConns, tlMis []int64
	aff            map[int32]*affCount
	// After the run, gv and cells are folded into the mode's totals and
	// dropped; perNode holds the versions that need per-node figures (those
	// of checked service ports, and those whose expectation differs
	// between nodes).
	perNode map[int32]*keptGV
	// fp is the node's first-packet figures (iptables).
	fp report.FirstPacket
	// rot is the rotation figures per version (ipvs rr and wrr only),
	// computed before shrink.
	rot []rotStat
	// req is the requests of the node's request clients (nil without any).
	req *reqCounts
}

// keptGV is one version's counts on one node.
type keptGV struct {
	c     gvCount
	cells []uint32
}

// add sums counts.
func (c *gvCount) add(o *gvCount) {
	c.Total += o.Total
	c.Established += o.Established
	c.Accepted += o.Accepted
	c.Dropped += o.Dropped
	c.Rejected += o.Rejected
	c.Decisions += o.Decisions
	c.Mismatched += o.Mismatched
	c.Fresh += o.Fresh
	c.InWindow += o.InWindow
	c.Misrouted += o.Misrouted
	c.Refused += o.Refused
	c.Lost += o.Lost
}

// modeAcc is a mode's counts summed over nodes (integers: the order in
// which nodes finish does not matter).
type modeAcc struct {
	gv    []gvCount
	cells []uint64
}

func newModeAcc(w *world) *modeAcc {
	return &modeAcc{gv: make([]gvCount, len(w.gvs)), cells: make([]uint64, w.cells)}
}

func (a *modeAcc) add(r *nodeResult) {
	for g := range r.gv {
		a.gv[g].add(&r.gv[g])
	}
	for i, c := range r.cells {
		a.cells[i] += uint64(c)
	}
}

// shrink keeps what needs per-node figures and drops the full arrays.
func (r *nodeResult) shrink(w *world) {
	r.perNode = map[int32]*keptGV{}
	for g := range w.gvs {
		if !w.keep[g] {
			continue
		}
		k := len(w.svcs[w.gvs[g].svc].eps)
		off := w.gvs[g].cellOff
		r.perNode[int32(g)] = &keptGV{c: r.gv[g], cells: append([]uint32(nil), r.cells[off:off+int32(k)]...)}
	}
	r.gv, r.cells = nil, nil
}

// nodeRun is one node simulated in one mode: its dataplane split into
// shards, its control schedule (API writes and rule changes), and the
// counters.
//
// Shards: connections to different service ports never meet in the
// dataplane (each service port has its own engine, and a conntrack entry
// is keyed by the service port), so a node's service ports are split into
// shards, each an engine.Node with its own, small conntrack table, and each
// shard's connections are handled together, in time order. A table of a
// few tens of thousands of entries stays in the CPU's cache, where one
// table of half a million entries costs a cache miss per connection. The
// kernel has one table per node; without nf_conntrack_max (not modelled
// here) the split changes nothing a connection can observe.
type nodeRun struct {
	w      *world
	md     *modeData
	ni     int
	shards []shard
	plan   *shardPlan
	pool   *tablePool
	// Per service port: the versions in the API and in the rules, and the
	// programmed affinity timeout, side by side for the per-connection path.
	svc []svcState
	// Per version: the oracle's outcome for this node, in the compact form
	// the per-connection path reads (fast), and its index in md.outs.
	fast      []fastOutcome
	out       []int32
	gen       []uint32
	aff       affTable
	affOracle []*oracle.Affinity // per service port, for affinity checks
	res       *nodeResult
	liveDiff  []int32
	liveShift uint
	bufs      *runBufs // where finish hands the arrays back
	// rq is the node's request connections (nil without any).
	rq *reqRun
}

// runBufs are the per-run arrays a worker reuses from one node's run in a
// mode to the next one's in the same mode (at 30,000 service ports they
// are megabytes per run, a run costs tenths of a second, and allocating
// them anew made the garbage collector a large part of the CPU time).
type runBufs struct {
	svc      []svcState
	out      []int32
	fast     []fastOutcome
	gen      []uint32
	liveDiff []int32
	// The result's counters come back after the result is shrunk.
	gv    []gvCount
	cells []uint32
	// arena holds the shards' engines; the next run resets it.
	arena *engine.Arena
}

// take returns the slice kept in *p (emptied there) resized to n and
// zeroed, or a new one.
func take[T any](p *[]T, n int) []T {
	s := *p
	*p = nil
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// shard is a part of a node's service ports with its own dataplane and
// its part of the control schedule.
type shard struct {
	node  *engine.Node
	table bool // node.CT is the shard's sized table
	// own is the node's own table (its arena's), put back when the sized
	// one goes back to the pool early (giveTable).
	own    *engine.Conntrack
	evs    []ctlEvent
	ev     int
	nextAt int64
	ready  bool // its engines hold the initial full sync
}

func newNodeRun(w *world, md *modeData, ni int, plan *shardPlan, seed uint64, pool *tablePool, b *runBufs) *nodeRun {
	r := &nodeRun{w: w, md: md, ni: ni, plan: plan, pool: pool, bufs: b}
	r.svc = take(&b.svc, len(w.svcs))
	r.out = take(&b.out, len(w.gvs))
	r.fast = take(&b.fast, len(w.gvs))
	for g := range w.gvs {
		k := md.slot(g, ni)
		r.out[g], r.fast[g] = md.out[k], md.fast[k]
	}
	r.gen = take(&b.gen, int(w.unionCells))
	r.aff = newAffTable()
	r.res = &nodeResult{
		gv:     take(&b.gv, len(w.gvs)),
		cells:  take(&b.cells, int(w.cells)),
		window: make([]int64, len(w.steps)),
	}
	for i := range r.res.window {
		r.res.window[i] = -1
	}
	if w.tlSvc >= 0 {
		r.res.tlConns = make([]int64, w.tlBins)
		r.res.tlMis = make([]int64, w.tlBins)
	}
	// Bins of a power of two nanoseconds, about 1/4096 of the run.
	for r.liveShift = 0; int64(1)<<r.liveShift < max(1, w.tr.span/4096); r.liveShift++ {
	}
	r.liveDiff = take(&b.liveDiff, int(w.tr.span>>r.liveShift+2))
	if len(w.affCheck) > 0 {
		r.affOracle = make([]*oracle.Affinity, len(w.svcs))
		r.res.aff = map[int32]*affCount{}
		for s, nodes := range w.affCheck {
			if nodes[ni] {
				g := w.svcs[s].gvs[0]
				o := md.outs[r.out[g]]
				r.affOracle[s] = oracle.Oracle{RecentCapacity: md.ncfg.IPTables.RecentCapacity}.NewAffinity(md.name, w.gvs[g].sp, w.oracleOutcome(s, &o))
				r.res.aff[s] = &affCount{}
			}
		}
	}
	// The control schedule does not depend on traffic: compute it first,
	// then give each shard its part.
	evs := r.schedule()
	r.shards = make([]shard, plan.n)
	if b.arena == nil {
		b.arena = engine.NewArena()
	}
	b.arena.Reset() // the previous run in this mode has finished
	for i := range r.shards {
		rng := engine.NewRand(rand.NewPCG(seed, mix(uint64(md.mode)<<56|uint64(ni)<<24|uint64(i))))
		node, err := engine.NewNodeIn(b.arena, w.nodes[ni].name, md.ncfg, rng)
		if err != nil {
			panic(err) // buildMode parsed the mode and the scheduler
		}
		// The shard's real table is taken when its connections come
		// (handleShard): emptying it then brings it into the cache.
		node.ReserveServices(len(plan.members[i]))
		r.shards[i].node = node
	}
	for _, e := range evs {
		if k := plan.of[e.svc]; k >= 0 {
			r.shards[k].evs = append(r.shards[k].evs, e)
		}
	}
	for i := range r.shards {
		r.shards[i].nextAt = math.MaxInt64
		if len(r.shards[i].evs) > 0 {
			r.shards[i].nextAt = r.shards[i].evs[0].at
		}
	}
	// The initial full sync happened before traffic starts; a shard's
	// engines are programmed with it when the shard is first handled
	// (ready).
	for s := range w.svcs {
		g := w.svcs[s].gvs[0]
		r.svc[s].api, r.svc[s].rule = g, g
	}
	return r
}

// ready programs shard k's engines with the initial full sync, once,
// right before the shard's connections are handled: a shard being at
// most shardPorts service ports, its engines are then still in the CPU's
// cache when the connections come (programming every shard first left
// each connection a cache miss on its engine). Each
// shard has its own random stream and programs its service ports in the
// same order either way, so when it happens changes no decision. Service
// ports this node sends nothing to get no engine.
func (r *nodeRun) ready(k int) {
	sh := &r.shards[k]
	if sh.ready {
		return
	}
	sh.ready = true
	for _, s := range r.plan.members[k] {
		rules := r.md.ruleAt(int(r.svc[s].rule), r.ni)
		sh.node.ProgramShared(int(r.plan.local[s]), *rules, 0)
		if rules.Verdict == engine.Accept {
			r.svc[s].aff = int64(rules.AffinityTimeout)
		}
	}
}

// mix is SplitMix64's finaliser: distinct, well spread stream numbers.
func mix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// runNode simulates one node's traffic through that node in every mode.
// The node's connections are generated a chunk at a time (the whole run
// when it fits, the common case) and bucketed by shard; each mode handles
// a chunk shard by shard. With one chunk, the modes run one after the
// other on it, so only one mode's tables are alive at a time; with more,
// every mode's run stays alive across chunks. The traffic stream does not
// depend on the modes, the shards or the chunking, so every mode (and a
// mode simulated alone) sees the same connections.
func runNode(ctx context.Context, w *world, ni int, seed uint64, wk *worker) ([]*nodeResult, error) {
	rn, err := w.requestTraffic(ni, seed)
	if err != nil {
		return nil, err
	}
	plan := w.planShardsWith(ni, rn)
	if rn != nil {
		rn.bucket(w, ni, plan)
	}
	out := make([]*nodeResult, len(w.modes))
	g := newTrafficGen(w, ni, seed)
	ch := wk.chunk(plan.n)
	// handle runs a chunk through every shard of r; when the chunk is the
	// node's whole run (whole), each shard's table goes back to the pool
	// as soon as the shard is done.
	handle := func(r *nodeRun, whole bool) error {
		for k := range r.shards {
			if err := ctx.Err(); err != nil {
				return err
			}
			r.handleShard(k, ch.byShard[k])
			if whole && r.rq == nil {
				r.giveTable(k)
			}
		}
		return nil
	}
	if g.n <= chunkConns {
		g.fill(ch, plan)
		for mi, md := range w.modes {
			r := newNodeRun(w, md, ni, plan, seed, &wk.tables, wk.bufsOf(mi))
			r.useRequests(rn, seed)
			if err := handle(r, true); err != nil {
				return nil, err
			}
			r.finish()
			out[mi] = r.res
		}
		return out, nil
	}
	runs := make([]*nodeRun, len(w.modes))
	for mi, md := range w.modes {
		runs[mi] = newNodeRun(w, md, ni, plan, seed, &wk.tables, wk.bufsOf(mi))
		runs[mi].useRequests(rn, seed)
	}
	for g.fill(ch, plan) {
		for _, r := range runs {
			if err := handle(r, false); err != nil {
				return nil, err
			}
		}
	}
	for mi, r := range runs {
		r.finish()
		out[mi] = r.res
	}
	return out, nil
}

// worker holds what one worker goroutine reuses from node to node: the
// chunk buffers and the shards' conntrack tables (allocating them anew
// for every node and mode costs page faults and zeroing).
type worker struct {
	ch     *chunk
	tables tablePool
	bufs   []*runBufs // by mode
	// firstPacketNode's inputs.
	fpIn      []cost.ServicePortInput
	fpWeights []float64
}

func (wk *worker) bufsOf(mi int) *runBufs {
	for len(wk.bufs) <= mi {
		wk.bufs = append(wk.bufs, &runBufs{})
	}
	return wk.bufs[mi]
}

func (wk *worker) chunk(shards int) *chunk {
	if wk.ch == nil {
		wk.ch = &chunk{}
	}
	for len(wk.ch.byShard) < shards {
		wk.ch.byShard = append(wk.ch.byShard, nil)
	}
	wk.ch.byShard = wk.ch.byShard[:shards]
	return wk.ch
}

// tablePool keeps emptied conntrack tables by the entry count they were
// reserved for (rounded as Conntrack.Reserve rounds it).
type tablePool struct {
	free map[int][]*engine.Conntrack
}

// sizeClass is Conntrack.Reserve's table size for n entries: the smallest
// power of two (at least 1024) above 2n.
func sizeClass(n int) int {
	size := 1 << 10
	for size/2 <= n {
		size *= 2
	}
	return size
}

// get returns an emptied table reserved for n entries, or nil.
func (p *tablePool) get(n int) *engine.Conntrack {
	l := p.free[sizeClass(n)]
	if len(l) == 0 {
		return nil
	}
	ct := l[len(l)-1]
	p.free[sizeClass(n)] = l[:len(l)-1]
	ct.Reset()
	return ct
}

// put keeps a table that was reserved for n entries.
func (p *tablePool) put(n int, ct *engine.Conntrack) {
	if p.free == nil {
		p.free = map[int][]*engine.Conntrack{}
	}
	p.free[sizeClass(n)] = append(p.free[sizeClass(n)], ct)
}

// handleShard decides a shard's connections in time order, each after the
// shard's control events due by its time.
func (r *nodeRun) handleShard(k int, cs []chunkConn) {
	if r.rq != nil {
		r.handleShardRequests(k, cs)
		return
	}
	r.ready(k)
	sh := &r.shards[k]
	node := sh.node
	r.takeTable(k, len(cs) > 0)
	for i := range cs {
		e := &cs[i]
		if e.t >= sh.nextAt {
			r.apply(sh, e.t)
		}
		res := node.Connect(int(e.local), &e.c, e.t)
		r.account(e.svc, &e.c, res, e.t)
	}
}

// takeTable gives shard k its sized conntrack table, once, when it has
// connections to handle (need): a table of the pool, or a new one (the
// node's own is its arena's: it stays there).
func (r *nodeRun) takeTable(k int, need bool) {
	sh := &r.shards[k]
	if sh.table || !need {
		return
	}
	ct := r.pool.get(r.plan.live[k])
	if ct == nil {
		ct = engine.NewConntrack(r.md.ncfg.Conntrack)
		ct.Reserve(r.plan.live[k], 0)
	}
	sh.own, sh.node.CT = sh.node.CT, ct
	sh.table = true
}

// giveTable hands shard k's sized table back to the pool (none: nothing
// to do): at finish, or as soon as the shard has handled its last
// connection (runNode's one-chunk run without requests), so that the next
// shard takes the same table, so a worker holds one
// table at a time instead of one per shard, some 60 MiB of the
// simulator's peak memory at 1,000 Services. What is left for the shard
// (finish's last control events) only flushes UDP entries, which the
// node's own, empty table takes.
func (r *nodeRun) giveTable(k int) {
	sh := &r.shards[k]
	if !sh.table {
		return
	}
	r.pool.put(r.plan.live[k], sh.node.CT)
	sh.node.CT, sh.own = sh.own, nil
	sh.table = false
}

// apply applies a shard's control events up to and including t.
func (r *nodeRun) apply(sh *shard, t int64) {
	for sh.ev < len(sh.evs) && sh.evs[sh.ev].at <= t {
		e := &sh.evs[sh.ev]
		sh.ev++
		if e.program {
			r.program(sh.node, e.svc, e.gv, e.at)
		} else {
			r.svc[e.svc].api = e.gv
		}
	}
	sh.nextAt = math.MaxInt64
	if sh.ev < len(sh.evs) {
		sh.nextAt = sh.evs[sh.ev].at
	}
}

// program puts version g of service port sv into a node's rules at now,
// as the end of a sync does.
func (r *nodeRun) program(node *engine.Node, sv, g int32, now int64) {
	w := r.w
	old0 := r.svc[sv].rule
	old := r.md.ruleAt(int(old0), r.ni)
	rules := r.md.ruleAt(int(g), r.ni)
	// Affinity state of an endpoint that leaves the rules is gone (recent
	// list destroyed, set deleted, real server removed).
	if r.svc[sv].aff > 0 {
		off := w.svcs[sv].unionOff
		for _, b := range old.Backends {
			if !hasBackend(rules, b.ID) {
				r.gen[off+b.ID]++
			}
		}
	}
	node.ProgramShared(int(r.plan.local[sv]), *rules, now)
	r.svc[sv].rule = g
	r.svc[sv].aff = 0
	if rules.Verdict == engine.Accept {
		r.svc[sv].aff = int64(rules.AffinityTimeout)
	}
	if r.affOracle != nil && r.affOracle[sv] != nil {
		o := r.md.outs[r.out[g]]
		prev, cur := w.gvs[old0].sp, w.gvs[g].sp
		if prev.ClientIPAffinity != cur.ClientIPAffinity || prev.AffinityTimeout != cur.AffinityTimeout {
			// New affinity settings: the proxy starts over.
			r.affOracle[sv] = oracle.Oracle{RecentCapacity: r.md.ncfg.IPTables.RecentCapacity}.NewAffinity(r.md.name, cur, w.oracleOutcome(sv, &o))
		} else {
			r.affOracle[sv].Update(w.oracleOutcome(sv, &o))
		}
	}
}

func hasBackend(r *engine.Rules, id int32) bool {
	if r.Verdict != engine.Accept {
		return false
	}
	for _, b := range r.Backends {
		if b.ID == id {
			return true
		}
	}
	return false
}

// account classifies one connection against the oracle and counts it.
func (r *nodeRun) account(s int32, c *engine.Conn, res engine.Result, t int64) {
	ss := &r.svc[s]
	g := ss.api
	st := &r.res.gv[g]
	st.Total++
	if res.Established {
		st.Established++
		return
	}
	o := &r.fast[g]
	inWin := g != ss.rule
	ok, misrouted := false, false
	switch res.Verdict {
	case engine.Accept:
		st.Accepted++
		if o.kind == oracle.Endpoints {
			if o.small {
				ok = uint32(res.Endpoint) < 64 && o.bits&(1<<(uint32(res.Endpoint)&63)) != 0
			} else {
				ok = o.o.allows(res.Endpoint)
			}
		}
		misrouted = !ok
		if ok && o.lost {
			st.Lost++
		}
		r.live(t, c)
	case engine.Drop:
		st.Dropped++
		ok = o.kind == oracle.Drop
	default:
		st.Rejected++
		ok = o.kind == oracle.Reject
	}
	fresh := res.Verdict == engine.Accept
	if fresh && ss.aff > 0 {
		fresh = !r.affinity(s, c, res.Endpoint, t)
	}
	if r.affOracle != nil && r.affOracle[s] != nil && res.Verdict == engine.Accept {
		r.observeAffinity(s, c, res.Endpoint, t)
	}
	if inWin {
		st.InWindow++
		if misrouted {
			st.Misrouted++
		} else if !ok {
			st.Refused++
		}
	} else {
		st.Decisions++
		if !ok {
			st.Mismatched++
		}
		if fresh {
			st.Fresh++
			r.res.cells[o.cellOff+res.Endpoint]++
		}
	}
	if s == r.w.tlSvc {
		b := t / r.w.tlBin
		r.res.tlConns[b]++
		if misrouted {
			r.res.tlMis[b]++
		}
	}
}

// svcState is a service port's state on a node.
type svcState struct {
	api, rule int32 // versions in the API and in the rules
	aff       int64 // affinity timeout of the rules, ns (0: none)
}

// fastOutcome is an outcome as the per-connection path reads it: the kind
// and, for up to 64 endpoints, the allowed set inline.
type fastOutcome struct {
	kind  oracle.Kind
	small bool
	lost  bool
	// cellOff is the version's gvInfo.cellOff, here because the counters
	// of a connection are written next to this read (gvInfo is a cache
	// miss away).
	cellOff int32
	bits    uint64
	o       *outcome
}

// affinity tracks which endpoint each client of a ClientIP service port is
// bound to, and reports whether this connection's client was bound.
func (r *nodeRun) affinity(s int32, c *engine.Conn, ep int32, t int64) bool {
	e := r.aff.get(uint64(s)<<32 | uint64(c.SrcIP))
	gen := &r.gen[r.w.svcs[s].unionOff+ep]
	bound := false
	if e.last != 0 && t < e.last-1+r.svc[s].aff && r.gen[r.w.svcs[s].unionOff+e.ep] == e.gen {
		bound = true
		r.res.bound++
		if e.ep == ep {
			r.res.kept++
		}
	}
	e.ep, e.gen, e.last = ep, *gen, t+1 // +1: 0 means unset
	return bound
}

func (r *nodeRun) observeAffinity(s int32, c *engine.Conn, ep int32, t int64) {
	a := r.affOracle[s]
	ac := r.res.aff[s]
	client := engine.AddrFromIPv4(c.SrcIP)
	now := time.Duration(t)
	if _, bound := a.Expect(client, now); bound {
		ac.bound++
	}
	switch a.Observe(client, r.w.svcs[s].names[ep], now, time.Duration(c.End)) {
	case oracle.Violation:
		ac.violations++
	case oracle.KnownDeviation:
		ac.known++
	}
}

// live counts a new conntrack entry in the live-entries histogram: +1 when
// it is created, -1 when it expires (the end of the flow plus TIME_WAIT or
// the UDP timeout), at the histogram's resolution.
func (r *nodeRun) live(t int64, c *engine.Conn) {
	r.liveDiff[t>>r.liveShift]++
	wait := int64(engine.DefaultTCPTimeWait)
	if c.Proto == engine.UDP {
		wait = int64(engine.DefaultUDPTimeout)
	}
	if exp := max(c.End, t) + wait; exp < r.w.tr.span {
		r.liveDiff[exp>>r.liveShift+1]--
	}
}

func (r *nodeRun) finish() {
	for i := range r.shards {
		r.ready(i)
		if r.rq != nil {
			r.drainRequests(i)
		}
		r.apply(&r.shards[i], math.MaxInt64)
	}
	var cur, peak int64
	for _, d := range r.liveDiff {
		cur += int64(d)
		peak = max(peak, cur)
	}
	r.res.peakLive = peak
	for k, sh := range r.shards {
		for s := range len(r.plan.members[k]) { // the shard's local numbers
			if e, ok := sh.node.Engine(s).(*engine.IPTablesEngine); ok {
				r.res.recentEvictedLive += int64(e.Stats.RecentEvictedLive)
			}
		}
		ns := sh.node.Stats
		r.res.conns += int64(ns.Connections)
		r.res.dropped += int64(ns.Dropped)
		r.res.rejected += int64(ns.Rejected)
	}
	for g := range r.w.gvs {
		if r.w.gvs[g].local {
			st := &r.res.gv[g]
			r.res.toLocal += st.Total
			r.res.localDropped += st.Dropped
			r.res.localRejected += st.Rejected
		}
	}
	// Hand the tables back before the result is kept.
	for k := range r.shards {
		r.giveTable(k)
	}
	r.shards = nil
	if r.rq != nil {
		r.res.req = r.replayRequests()
		r.rq = nil
	}
	b := r.bufs
	b.svc, b.out, b.fast, b.gen, b.liveDiff = r.svc, r.out, r.fast, r.gen, r.liveDiff
	r.svc, r.out, r.fast, r.gen, r.liveDiff = nil, nil, nil, nil, nil
}

// affTable maps (service port, client address) to the client's binding:
// open addressing with linear probing, grown at half load.
type affTable struct {
	keys  []uint64
	vals  []affEntry
	n     int
	shift uint
}

type affEntry struct {
	ep   int32
	gen  uint32
	last int64 // last new connection + 1; 0: none
}

func newAffTable() affTable {
	return affTable{keys: make([]uint64, 64), vals: make([]affEntry, 64), shift: 64 - 6}
}

// get returns the entry of a key, inserting an empty one.
func (a *affTable) get(k uint64) *affEntry {
	k |= 1 << 63 // never 0
	if (a.n+1)*2 > len(a.keys) {
		a.grow()
	}
	mask := uint64(len(a.keys) - 1)
	for i := (k * 0x9E3779B97F4A7C15) >> a.shift; ; i = (i + 1) & mask {
		switch a.keys[i] {
		case k:
			return &a.vals[i]
		case 0:
			a.keys[i] = k
			a.n++
			return &a.vals[i]
		}
	}
}

func (a *affTable) grow() {
	keys, vals := a.keys, a.vals
	a.keys = make([]uint64, 2*len(keys))
	a.vals = make([]affEntry, 2*len(keys))
	a.shift--
	mask := uint64(len(a.keys) - 1)
	for i, k := range keys {
		if k == 0 {
			continue
		}
		j := (k * 0x9E3779B97F4A7C15) >> a.shift
		for a.keys[j] != 0 {
			j = (j + 1) & mask
		}
		a.keys[j], a.vals[j] = k, vals[i]
	}
}
