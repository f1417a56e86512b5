package simulate

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/engine"
)

// lbPlan is one load-balancer client: which nodes the balancer sends each
// target's connections to over time, the health-check lags, and the
// connections each node receives, as segments of constant rate.
type lbPlan struct {
	interval int64
	// views are, per target (the client's targets' order), the nodes the
	// balancer uses from each change on.
	views []lbView
	// lags are the times a node's health check failed before the balancer
	// took it out.
	lags []lagEpisode
	// segs are each node's segments in time order (world node index).
	segs [][]lbSeg
}

// lbView is a step function: from at[i] on, the balancer uses the nodes
// with in[i][node] (indexed by world node).
type lbView struct {
	at []int64
	in [][]bool
}

// lagEpisode is a node whose health check for a Service started failing
// (its last ready local endpoint gone, at the API write of step) while the
// balancer still sent it connections, until it noticed (end: the probe that
// took the node out) or the check passed again.
type lagEpisode struct {
	target  int32 // entry
	node    int
	step    int32
	from    int64
	end     int64
	noticed bool
	// expected is the number of connections the balancer sent the node
	// for the target meanwhile.
	expected float64
}

// lbSeg is a run of a node's load-balancer connections: n of them, evenly
// over [t0, t1), each to a target drawn from alias.
type lbSeg struct {
	t0, t1  int64
	n       int64
	client  int32 // index in extPlan.clients
	targets []int32
	alias   alias
	// share is each target's part of the segment's connections.
	share []float64
}

// planLB computes a load-balancer client's views, lags and segments.
func (w *world) planLB(ci int, ec *extClient, seed uint64) *lbPlan {
	lp := &lbPlan{interval: lbDuration(ec.hc), segs: make([][]lbSeg, len(w.nodes))}
	for ti, x := range ec.targets {
		lp.views = append(lp.views, w.lbView(ci, ti, ec, x, seed, lp))
	}
	lp.segments(w, ci, ec)
	return lp
}

// lbView probes every node of the client for target x from a phase drawn
// per (client, target, node) and records when the balancer takes a node out
// or puts it back, and the lag episodes.
func (w *world) lbView(ci, ti int, ec *extClient, x int32, seed uint64, lp *lbPlan) lbView {
	answers := w.healthAnswers(x)
	span := w.tr.span
	type flip struct {
		at int64
		ni int
		in bool
	}
	var flips []flip
	start := make([]bool, len(w.nodes))
	for _, ni := range ec.nodes {
		phase := int64(probePhase(seed, uint64(ci)<<40|uint64(ti)<<20|uint64(ni)) * float64(lp.interval))
		healthy := answers[0].ok[ni]
		start[ni] = healthy
		fails, passes, ai := 0, 0, 0
		var nodeFlips []flip
		for p := phase; p < span; p += lp.interval {
			for ai+1 < len(answers) && answers[ai+1].at <= p {
				ai++
			}
			if answers[ai].ok[ni] {
				passes, fails = passes+1, 0
				if !healthy && passes >= ec.hc.HealthyThreshold {
					healthy = true
					nodeFlips = append(nodeFlips, flip{p, ni, true})
				}
			} else {
				fails, passes = fails+1, 0
				if healthy && fails >= ec.hc.UnhealthyThreshold {
					healthy = false
					nodeFlips = append(nodeFlips, flip{p, ni, false})
				}
			}
		}
		flips = append(flips, nodeFlips...)
		w.lagEpisodes(x, ni, answers, func(from int64) (int64, bool) {
			for _, f := range nodeFlips {
				if f.at >= from && !f.in {
					return f.at, true
				}
			}
			return span, false
		}, lp)
	}
	slices.SortStableFunc(flips, func(a, b flip) int { return cmp.Compare(a.at, b.at) })
	v := lbView{at: []int64{0}, in: [][]bool{start}}
	for _, f := range flips {
		last := len(v.at) - 1
		if v.at[last] != f.at {
			v.at = append(v.at, f.at)
			v.in = append(v.in, slices.Clone(v.in[last]))
			last++
		}
		v.in[last][f.ni] = f.in
	}
	return v
}

// lagEpisodes records node ni's episodes for target x: each API write
// after which its answer turned from pass to fail, until the balancer took
// it out (noticed) or the answer passed again.
func (w *world) lagEpisodes(x int32, ni int, answers []healthAnswer, takenOut func(from int64) (int64, bool), lp *lbPlan) {
	for k := 1; k < len(answers); k++ {
		if !answers[k-1].ok[ni] || answers[k].ok[ni] {
			continue
		}
		from := answers[k].at
		end, noticed := takenOut(from)
		for j := k + 1; j < len(answers) && answers[j].at < end; j++ {
			if answers[j].ok[ni] {
				end, noticed = answers[j].at, false
				break
			}
		}
		lp.lags = append(lp.lags, lagEpisode{target: x, node: ni, step: w.stepAt(from), from: from, end: end, noticed: noticed})
	}
}

// stepAt is the index of the timeline step at time t (-1: none).
func (w *world) stepAt(t int64) int32 {
	for i, st := range w.steps {
		if st.at == t {
			return int32(i)
		}
	}
	return -1
}

// users is the set of nodes the balancer sends target ti to at time t:
// the view's, or every node of the client when the view has none (cloud
// balancers send to every node when no health check passes).
func (lp *lbPlan) users(ti int, ec *extClient, t int64) ([]bool, int) {
	v := &lp.views[ti]
	i, ok := slices.BinarySearch(v.at, t)
	if !ok {
		i--
	}
	n := 0
	for _, ni := range ec.nodes {
		if v.in[i][ni] {
			n++
		}
	}
	if n > 0 {
		return v.in[i], n
	}
	all := make([]bool, len(v.in[i]))
	for _, ni := range ec.nodes {
		all[ni] = true
	}
	return all, len(ec.nodes)
}

// segments splits the client's connections over its nodes: between two
// changes of any target's view, each node gets rate × share of every
// target that uses it, rounded so that each node's count follows its
// cumulative expectation; it also totals each lag episode's expected
// connections.
func (lp *lbPlan) segments(w *world, ci int, ec *extClient) {
	span := w.tr.span
	if span <= 0 || ec.conns <= 0 {
		return
	}
	rate := float64(ec.conns) / float64(span)
	times := []int64{0, span}
	for _, v := range lp.views {
		times = append(times, v.at...)
	}
	slices.Sort(times)
	times = slices.Compact(times)
	acc := make([]float64, len(w.nodes))
	given := make([]int64, len(w.nodes))
	for i := 0; i+1 < len(times) && times[i] < span; i++ {
		t0, t1 := times[i], min(times[i+1], span)
		per := make([][]float64, len(w.nodes)) // node → per-target rate
		for ti := range ec.targets {
			use, n := lp.users(ti, ec, t0)
			for _, ni := range ec.nodes {
				if use[ni] {
					if per[ni] == nil {
						per[ni] = make([]float64, len(ec.targets))
					}
					per[ni][ti] = rate * ec.weights[ti] / float64(n)
				}
			}
		}
		for _, ni := range ec.nodes {
			if per[ni] == nil {
				continue
			}
			sum := 0.0
			for _, r := range per[ni] {
				sum += r
			}
			acc[ni] += sum * float64(t1-t0)
			n := int64(math.Floor(acc[ni]+1e-9)) - given[ni]
			if n <= 0 {
				continue
			}
			given[ni] += n
			share := make([]float64, len(per[ni]))
			for ti, r := range per[ni] {
				share[ti] = r / sum
			}
			lp.segs[ni] = append(lp.segs[ni], lbSeg{t0: t0, t1: t1, n: n, client: int32(ci), targets: ec.targets, alias: newAlias(per[ni]), share: share})
		}
		lp.lagShares(ec, per, t0, t1)
	}
	lp.settle(ec, acc, given)
}

// settle gives the connections the flooring left over, one each, to the
// nodes with the largest remainders (their last segment), so that the
// client sends exactly its count.
func (lp *lbPlan) settle(ec *extClient, acc []float64, given []int64) {
	var sum int64
	for _, ni := range ec.nodes {
		sum += given[ni]
	}
	order := slices.Clone(ec.nodes)
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(acc[b]-float64(given[b]), acc[a]-float64(given[a]))
	})
	for _, ni := range order {
		if sum >= ec.conns {
			return
		}
		if segs := lp.segs[ni]; len(segs) > 0 {
			segs[len(segs)-1].n++
			sum++
		}
	}
}

// lagShares adds to each lag episode the connections its node received
// for its target over the part of [t0, t1) inside the episode.
func (lp *lbPlan) lagShares(ec *extClient, per [][]float64, t0, t1 int64) {
	for k := range lp.lags {
		e := &lp.lags[k]
		lo, hi := max(t0, e.from), min(t1, e.end)
		if hi <= lo || per[e.node] == nil {
			continue
		}
		ti := slices.Index(ec.targets, e.target)
		e.expected += per[e.node][ti] * float64(hi-lo)
	}
}

// lbStream is one load-balancer client's connections into one node: its
// addresses and source-port counters there, and its segments.
type lbStream struct {
	ng   nodeGroup
	segs []lbSeg
}

// extClientOf is the external client of traffic.clients[i] (nil for a pod
// or host client).
func (w *world) extClientOf(i int) *extClient {
	if w.ext == nil {
		return nil
	}
	for _, ec := range w.ext.clients {
		if ec.idx == i {
			return ec
		}
	}
	return nil
}

// externalSourceCount is the number of distinct external client addresses.
func (w *world) externalSourceCount() int {
	if w.ext == nil {
		return 0
	}
	seen := map[uint32]bool{}
	n := 0
	for _, ec := range w.ext.clients {
		if !seen[ec.base] {
			seen[ec.base] = true
			n += int(ec.count)
		}
	}
	return n
}

// lbNodeGroups gives a load-balancer client a stream on each of its nodes,
// with its addresses and, for sequential source ports, its counters there.
func (w *world) lbNodeGroups(ec *extClient, gi int, portMode uint8) {
	for _, ni := range ec.nodes {
		np := &w.tr.perNode[ni]
		ng := nodeGroup{group: int32(gi), base: ec.base, count: ec.count, seqOff: -1}
		if portMode == portSequential {
			ng.seqOff = int32(np.seqPorts)
			np.seqPorts += int(ec.count)
		}
		np.lb = append(np.lb, lbStream{ng: ng})
	}
}

// planBalancers plans every load-balancer client (planLB) and hands each
// node its segments.
func (w *world) planBalancers() {
	if w.ext == nil {
		return
	}
	for ci, ec := range w.ext.clients {
		if ec.via != cluster.ViaLoadBalancer {
			continue
		}
		ec.lb = w.planLB(ci, ec, w.seed)
		for _, ni := range ec.nodes {
			np := &w.tr.perNode[ni]
			for k := range np.lb {
				if np.lb[k].ng.group == ec.group {
					np.lb[k].segs = ec.lb.segs[ni]
					for _, sg := range ec.lb.segs[ni] {
						np.lbConns += sg.n
					}
				}
			}
		}
	}
}

// lbCursor walks one load-balancer stream's arrivals: arrival k of a
// segment of n falls in slot [k, k+1)·(t1−t0)/n at a uniform offset.
type lbCursor struct {
	st   *lbStream
	seg  int
	k    int64
	next int64 // time of the next arrival; math.MaxInt64 when done
}

func newLBCursor(st *lbStream, r *rand.PCG) lbCursor {
	c := lbCursor{st: st}
	c.advance(r)
	return c
}

// advance draws the time of the cursor's next arrival.
func (c *lbCursor) advance(r *rand.PCG) {
	for c.seg < len(c.st.segs) && c.k >= c.st.segs[c.seg].n {
		c.seg, c.k = c.seg+1, 0
	}
	if c.seg >= len(c.st.segs) {
		c.next = math.MaxInt64
		return
	}
	sg := &c.st.segs[c.seg]
	x := r.Uint64()
	c.next = sg.t0 + int64((float64(c.k)+float64(x>>11)*0x1p-53)*float64(sg.t1-sg.t0)/float64(sg.n))
	c.k++
}

// fillMerged generates k connections of a node with load-balancer streams:
// the static stream (exactly as fill draws it, from the node's traffic
// stream) and the balancers' (from a stream of their own), merged in time
// order.
func (g *trafficGen) fillMerged(ch *chunk, p *shardPlan, k int64) {
	tr, np := g.tr, g.np
	for range k {
		if !g.sReady && g.si < np.conns {
			g.sx = g.pcg.Uint64()
			g.st = int64((float64(g.si) + float64(g.sx>>11)*0x1p-53) * g.delta)
			g.sReady = true
		}
		best := -1
		bt := int64(math.MaxInt64)
		if g.sReady {
			bt = g.st
		}
		for i := range g.lb {
			if g.lb[i].next < bt {
				best, bt = i, g.lb[i].next
			}
		}
		if best < 0 {
			g.sReady = false
			g.si++
			g.emitStatic(ch, p, g.st)
			continue
		}
		cur := &g.lb[best]
		sg := &cur.st.segs[cur.seg]
		ng := &cur.st.ng
		gp := &tr.groups[ng.group]
		y := g.lbRand.Uint64()
		src := uint32(((y >> 32) * uint64(ng.count)) >> 32)
		var sp *uint16
		if ng.seqOff >= 0 {
			sp = &g.seq[int(ng.seqOff)+int(src)]
		}
		port := sourcePort(gp.portMode, uint32(y), sp)
		s := sg.targets[sg.alias.pick(g.lbRand.Uint64())]
		d := tr.meanDur
		if tr.expDur {
			d = int64(g.lbXR.ExpFloat64() * float64(tr.meanDur))
		}
		g.put(ch, p, s, engine.Conn{SrcIP: ng.base + src, SrcPort: port, Proto: g.protos[s], End: bt + d}, bt)
		cur.advance(g.lbRand)
	}
	g.i += k
}

// put appends a connection to its shard's bucket.
func (g *trafficGen) put(ch *chunk, p *shardPlan, s int32, c engine.Conn, t int64) {
	b := p.of[s]
	ch.byShard[b] = append(ch.byShard[b], chunkConn{c: c, t: t, svc: s, local: p.local[s]})
}
