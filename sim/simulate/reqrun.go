package simulate

import (
	"container/heap"
	"math/rand/v2"

	"github.com/kpsim/kpsim/sim/oracle"
)

// reqRun is a node run's request connections in one mode: where each
// shard's stream stands and the endpoint each connection reached.
type reqRun struct {
	rn   *reqNode
	pos  []int   // per shard: the next of rn.byShard[k]
	ep   []int32 // per connection: its endpoint, -1 when refused
	seed uint64
}

// useRequests gives the run its node's request connections (none: nil).
func (r *nodeRun) useRequests(rn *reqNode, seed uint64) {
	if rn == nil {
		return
	}
	r.rq = &reqRun{rn: rn, pos: make([]int, len(rn.byShard)), ep: make([]int32, len(rn.conns)), seed: seed}
}

// handleShardRequests is handleShard for a node with request connections:
// the shard's connections and its request connections merged in time
// order (a request connection first on a tie). Nodes without any keep
// handleShard's own loop.
func (r *nodeRun) handleShardRequests(k int, cs []chunkConn) {
	r.ready(k)
	opens := r.rq.rn.byShard[k]
	j := r.rq.pos[k]
	r.takeTable(k, len(cs) > 0 || j < len(opens))
	sh := &r.shards[k]
	node := sh.node
	for i := range cs {
		e := &cs[i]
		for j < len(opens) && opens[j].cc.t <= e.t {
			r.connectRequest(sh, &opens[j])
			j++
		}
		if e.t >= sh.nextAt {
			r.apply(sh, e.t)
		}
		res := node.Connect(int(e.local), &e.c, e.t)
		r.account(e.svc, &e.c, res, e.t)
	}
	r.rq.pos[k] = j
}

// drainRequests handles shard k's request connections left after the
// last of its other connections (finish calls it).
func (r *nodeRun) drainRequests(k int) {
	opens := r.rq.rn.byShard[k]
	if r.rq.pos[k] >= len(opens) {
		return
	}
	r.takeTable(k, true)
	sh := &r.shards[k]
	for j := r.rq.pos[k]; j < len(opens); j++ {
		r.connectRequest(sh, &opens[j])
	}
	r.rq.pos[k] = len(opens)
}

// connectRequest decides one request connection, as any connection is
// decided and counted, and keeps its endpoint for the requests.
func (r *nodeRun) connectRequest(sh *shard, o *reqOpen) {
	e := &o.cc
	if e.t >= sh.nextAt {
		r.apply(sh, e.t)
	}
	res := sh.node.Connect(int(e.local), &e.c, e.t)
	r.account(e.svc, &e.c, res, e.t)
	r.rq.ep[o.id] = res.Endpoint // -1 when refused
}

// reqCounts is one node's request figures in one mode.
type reqCounts struct {
	// total counts every request of the node's request clients; failed
	// those whose connection was refused (DROP, REJECT).
	total, failed int64
	ports         []portCounts // per followed service port
}

// portCounts is one followed service port's figures on one node. Arrays
// [b*k+ep] are per time bin b and pod (the port's endpoint ep of k).
type portCounts struct {
	k int
	// reqs counts requests started; busy and conn are ns of requests in
	// flight and of connections open; opened counts connections opened.
	reqs, busy, conn, opened []int64
	// n2 is, per bin, the sum over connections of the square of the
	// requests each carried in the bin (the spread of an even random
	// placement of connections; a request's own connection adds 1).
	n2 []float64
	// stale counts requests that reached a pod the API no longer listed
	// as eligible (their connection outlived it).
	stale int64
	win   [2]winCounts
}

// winCounts is a window's figures (0: before the scale event, or the
// whole run without one; 1: from it on): per pod the requests started in
// it and the ns of requests in flight and of connections open in it, and
// the sums over connections of the squares of each one's requests and
// connection time (seconds) in it.
type winCounts struct {
	reqs, busy, conn []int64
	n2, ct2          float64
}

// add sums another node's counts.
func (c *reqCounts) add(o *reqCounts) {
	c.total += o.total
	c.failed += o.failed
	for i := range c.ports {
		p, q := &c.ports[i], &o.ports[i]
		addInts(p.reqs, q.reqs)
		addInts(p.busy, q.busy)
		addInts(p.conn, q.conn)
		addInts(p.opened, q.opened)
		for b := range p.n2 {
			p.n2[b] += q.n2[b]
		}
		p.stale += q.stale
		for wi := range p.win {
			a, b := &p.win[wi], &q.win[wi]
			addInts(a.reqs, b.reqs)
			addInts(a.busy, b.busy)
			addInts(a.conn, b.conn)
			a.n2 += b.n2
			a.ct2 += b.ct2
		}
	}
}

func (w *world) newReqCounts() *reqCounts {
	rq := w.rq
	c := &reqCounts{ports: make([]portCounts, len(rq.follow))}
	for i, f := range rq.follow {
		k := len(w.svcs[f.svc].eps)
		n := rq.bins * k
		c.ports[i] = portCounts{k: k, reqs: make([]int64, n), busy: make([]int64, n), conn: make([]int64, n), opened: make([]int64, n), n2: make([]float64, rq.bins)}
		for wi := range c.ports[i].win {
			c.ports[i].win[wi] = winCounts{reqs: make([]int64, k), busy: make([]int64, k), conn: make([]int64, k)}
		}
	}
	return c
}

// replay is the requests of one node in one mode, replayed over the
// endpoints its connections reached.
type replay struct {
	w   *world
	rn  *reqNode
	ep  []int32
	out *reqCounts
	// versions: per followed port, the API's versions on this node (their
	// start and the endpoints the oracle allows).
	versions [][]apiVersion
	r        *rand.Rand
	slots    []slotAcc
	rr       []int
	busy     busyHeap
}

type apiVersion struct {
	at int64
	o  *outcome
}

// slotAcc follows one pool slot of the client being replayed: its
// connection now, what that connection carried (in the current bin and
// per window, flushed when either changes) and its requests in flight.
type slotAcc struct {
	id       int32
	fi       int8 // the followed port of the slot's target, -1
	bin      int64
	nBin     int64
	nWin     [2]int64
	inflight int32
}

// replayRequests counts the node's requests in this mode: each pooled
// client's requests from the node's request stream (the same in every
// mode), each unpooled request from its connection.
func (r *nodeRun) replayRequests() *reqCounts {
	w := r.w
	q := &replay{w: w, rn: r.rq.rn, ep: r.rq.ep, out: w.newReqCounts(),
		r: rand.New(rand.NewPCG(r.rq.seed^0x7265717565737473, mix(uint64(r.ni)|3<<40)))}
	for _, f := range w.rq.follow {
		var vs []apiVersion
		for _, g := range w.svcs[f.svc].gvs {
			at := int64(0)
			if st := w.gvs[g].step; st >= 0 {
				at = w.steps[st].at
			}
			vs = append(vs, apiVersion{at: at, o: &r.md.outs[r.md.outAt(int(g), r.ni)]})
		}
		q.versions = append(q.versions, vs)
	}
	for ci, cl := range w.rq.perNode[r.ni] {
		g := &w.rq.groups[cl.group]
		if g.size == 0 {
			q.short(ci)
		} else {
			q.pooled(ci, g)
		}
	}
	q.connections()
	return q.out
}

// allowed reports whether followed port fi's API state at t lets its
// pod ep be chosen on this node.
func (q *replay) allowed(fi int8, ep int32, t int64) bool {
	vs := q.versions[fi]
	i := len(vs) - 1
	for i > 0 && vs[i].at > t {
		i--
	}
	return vs[i].o.kind == oracle.Endpoints && vs[i].o.allows(ep)
}

// window is the window of followed port fi a time is in.
func (q *replay) window(fi int8, t int64) int {
	if t >= q.cut(fi) {
		return 1
	}
	return 0
}

// cut is where followed port fi's second window starts (the run's end
// without a scale event).
func (q *replay) cut(fi int8) int64 {
	span := q.w.tr.span
	if at := q.w.rq.follow[fi].at; at >= 0 {
		return min(span, at)
	}
	return span
}

// split adds [from, to) to a per-pod array of each window, cut at cut.
func split(win *[2]winCounts, pick func(*winCounts) []int64, ep int32, from, to, cut int64) {
	pick(&win[0])[ep] += max(0, min(to, cut)-from)
	pick(&win[1])[ep] += max(0, to-max(from, cut))
}

func busyOf(c *winCounts) []int64 { return c.busy }
func connOf(c *winCounts) []int64 { return c.conn }

// request counts one request of connection id at t lasting d; it reports
// the followed port whose request it was (-1: none, refused or stale).
func (q *replay) request(id int32, t, d int64) int8 {
	q.out.total++
	ep := q.ep[id]
	if ep < 0 {
		q.out.failed++
		return -1
	}
	fi := q.w.rq.fidx[q.rn.conns[id].svc]
	if fi < 0 {
		return -1
	}
	pc := &q.out.ports[fi]
	if !q.allowed(fi, ep, t) {
		pc.stale++
		return -1
	}
	rq := q.w.rq
	end := min(t+d, q.w.tr.span)
	pc.reqs[int(t/rq.bin)*pc.k+int(ep)]++
	spread(pc.busy, pc.k, ep, t, end, rq.bin, rq.bins)
	pc.win[q.window(fi, t)].reqs[ep]++
	split(&pc.win, busyOf, ep, t, end, q.cut(fi))
	return fi
}

// spread adds the part of [from, to) in each bin to arr's pod ep.
func spread(arr []int64, k int, ep int32, from, to, bin int64, bins int) {
	for b := from / bin; b < int64(bins) && b*bin < to; b++ {
		arr[int(b)*k+int(ep)] += min(to, (b+1)*bin) - max(from, b*bin)
	}
}

// short counts the requests of a client without a pool: one per
// connection.
func (q *replay) short(ci int) {
	for id := q.rn.first[ci]; id < q.rn.first[ci+1]; id++ {
		c := &q.rn.conns[id]
		if fi := q.request(id, c.t, c.end-c.t); fi >= 0 {
			pc := &q.out.ports[fi]
			pc.n2[c.t/q.w.rq.bin]++
			pc.win[q.window(fi, c.t)].n2++
		}
	}
}

// pooled replays a pooled client's requests: Poisson arrivals at its
// rate, a target drawn as connections draw theirs, a duration, then a
// connection of that target's pool: the next in turn (round-robin) or
// the one with the fewest requests in flight, the first on a tie
// (least-busy); the request rides the slot's connection open at its time.
func (q *replay) pooled(ci int, g *reqGroup) {
	base := int(q.rn.slotOf[ci])
	ns := len(g.gp.targets) * g.size
	q.slots = q.slots[:0]
	for j := range ns {
		s := g.gp.targets[j/g.size]
		q.slots = append(q.slots, slotAcc{id: q.rn.slots[base+j].lo, fi: q.w.rq.fidx[s], bin: -1})
	}
	q.rr = append(q.rr[:0], make([]int, len(g.gp.targets))...)
	q.busy = q.busy[:0]
	span := q.w.tr.span
	mean := 1e9 / g.rate
	limit := int(2*g.rate*secs(span)) + 1000 // Poisson: never reached
	t := int64(0)
	for range limit {
		t += int64(q.r.ExpFloat64() * mean)
		if t >= span {
			break
		}
		ti := int(g.gp.alias.pick(q.r.Uint64()))
		d := g.dur.draw(q.r)
		j := q.pick(g, ti, t)
		sa := &q.slots[j]
		for hi := q.rn.slots[base+j].hi; sa.id+1 < hi && q.rn.conns[sa.id+1].t <= t; {
			q.flush(sa)
			sa.id++
			sa.inflight = 0
		}
		if g.leastBusy {
			sa.inflight++
			heap.Push(&q.busy, busyReq{end: t + d, slot: int32(j), id: sa.id})
		}
		if q.request(sa.id, t, d) >= 0 {
			if b := t / q.w.rq.bin; b != sa.bin {
				q.flushBin(sa)
				sa.bin = b
			}
			sa.nBin++
			sa.nWin[q.window(sa.fi, t)]++
		}
	}
	for j := range q.slots {
		q.flush(&q.slots[j])
	}
}

// pick chooses the slot (index in q.slots) of a request to target ti at t.
func (q *replay) pick(g *reqGroup, ti int, t int64) int {
	base := ti * g.size
	if !g.leastBusy {
		j := base + q.rr[ti]%g.size
		q.rr[ti]++
		return j
	}
	for len(q.busy) > 0 && q.busy[0].end <= t {
		b := heap.Pop(&q.busy).(busyReq)
		if sa := &q.slots[b.slot]; sa.id == b.id {
			sa.inflight--
		}
	}
	best := base
	for j := base + 1; j < base+g.size; j++ {
		if q.slots[j].inflight < q.slots[best].inflight {
			best = j
		}
	}
	return best
}

// flushBin adds what a slot's connection carried in its current bin.
func (q *replay) flushBin(sa *slotAcc) {
	if sa.nBin > 0 {
		q.out.ports[sa.fi].n2[sa.bin] += float64(sa.nBin) * float64(sa.nBin)
	}
	sa.nBin = 0
}

// flush adds what a slot's connection carried, before the slot moves on
// to its next connection (or the client ends).
func (q *replay) flush(sa *slotAcc) {
	if sa.fi < 0 {
		return
	}
	q.flushBin(sa)
	for wi, n := range sa.nWin {
		q.out.ports[sa.fi].win[wi].n2 += float64(n) * float64(n)
	}
	sa.nWin = [2]int64{}
	sa.bin = -1
}

// connections counts the connections of the followed ports per pod:
// opened per bin, connection time per bin and per window.
func (q *replay) connections() {
	rq, span := q.w.rq, q.w.tr.span
	for id := range q.rn.conns {
		c := &q.rn.conns[id]
		fi, ep := rq.fidx[c.svc], q.ep[id]
		if fi < 0 || ep < 0 {
			continue
		}
		pc := &q.out.ports[fi]
		pc.opened[int(c.t/rq.bin)*pc.k+int(ep)]++
		end := min(c.end, span)
		spread(pc.conn, pc.k, ep, c.t, end, rq.bin, rq.bins)
		cut := q.cut(fi)
		split(&pc.win, connOf, ep, c.t, end, cut)
		before := secs(max(0, min(end, cut)-c.t))
		after := secs(max(0, end-max(c.t, cut)))
		pc.win[0].ct2 += before * before
		pc.win[1].ct2 += after * after
	}
}

// busyReq is a request in flight on a pool slot's connection id.
type busyReq struct {
	end  int64
	slot int32
	id   int32
}

// busyHeap orders requests in flight by their end (then slot, so that
// equal ends pop in a fixed order).
type busyHeap []busyReq

func (h busyHeap) Len() int { return len(h) }
func (h busyHeap) Less(i, j int) bool {
	if h[i].end != h[j].end {
		return h[i].end < h[j].end
	}
	return h[i].slot < h[j].slot
}
func (h busyHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *busyHeap) Push(x any)   { *h = append(*h, x.(busyReq)) }
func (h *busyHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// addInts adds src to dst element by element (the same length).
func addInts(dst, src []int64) {
	for i := range dst {
		dst[i] += src[i]
	}
}
