package simulate

import (
	"math/rand/v2"

	"github.com/kpsim/kpsim/sim/engine"
)

// Sharding and chunking bounds.
const (
	// shardSlots is the conntrack table size a shard aims at: 32768
	// slots of 24 bytes (768 KiB) stay in a core's L2 cache. A table is
	// kept under half load, and Reserve is asked for 1.2 times the
	// expected entries plus 64, so a shard is planned for at most
	// shardSlots/2 − 1024 of those (room for an unlucky shard).
	shardSlots = 1 << 15
	maxShards  = 256
	// shardPorts bounds the service ports of a shard, so that what a
	// connection reads per service port (its engine and rules, and the
	// run's per-port and per-version arrays, contiguous because a shard
	// holds a range of service ports) stays in the cache while the shard
	// is handled. At 30,000 service ports over 8 shards (the conntrack
	// bound alone) each connection was a cache miss on each of those;
	// with 1,024 ports a shard, sim run at 30,000 Services took a tenth
	// less time (and 3,500 a shard a fifth less than the same shards
	// dealt out by weight, longest first).
	shardPorts = 1024
	// chunkConns bounds the connections generated and bucketed at once
	// (32 bytes each); a node whose run fits is handled in one chunk, so
	// that each shard goes through its whole run with its table hot.
	chunkConns = 1 << 20
	// maxReserve bounds the conntrack entries reserved up front; past it
	// a table grows as it fills.
	maxReserve = 1 << 24
)

// shardPlan splits a node's service ports into shards: contiguous ranges
// of service ports (in the world's order) of about equal traffic, the same
// in every mode.
type shardPlan struct {
	n  int
	of []int32 // shard of each service port; -1: the node sends it nothing
	// local numbers the service ports of a shard 0, 1, ... : the shard's
	// engine.Node knows them by these numbers (its engine slice stays
	// dense; a conntrack entry is keyed by the local number, which is
	// unique in its shard's table).
	local []int32
	// members are each shard's service ports, in service-port order.
	members [][]int32
	live    []int     // conntrack entries to reserve per shard
	share   []float64 // each shard's share of the node's connections
}

// planShards plans node ni's shards from its clients' target weights: as
// many as the conntrack bound (shardSlots) and the port bound (shardPorts)
// ask for, each range cut where the cumulative weight passes the next
// shard's equal share. A service port heavier than a share leaves the
// shards after it fewer ports (or none); their tables are sized by the
// traffic they get.
func (w *world) planShards(ni int) *shardPlan { return w.planShardsWith(ni, nil) }

// planShardsWith is planShards with the node's request connections (rn,
// nil without any) among the weights.
func (w *world) planShardsWith(ni int, rn *reqNode) *shardPlan {
	np := &w.tr.perNode[ni]
	weight := make([]float64, len(w.svcs))
	total := 0.0
	for _, ng := range np.groups {
		gp := &w.tr.groups[ng.group]
		for i, s := range gp.targets {
			weight[s] += ng.weight * gp.weights[i]
			total += ng.weight * gp.weights[i]
		}
	}
	if np.lbConns > 0 {
		// The balancers' connections, by their share of the node's.
		f := float64(np.lbConns) / float64(np.conns+np.lbConns)
		if total > 0 {
			for s := range weight {
				weight[s] *= (1 - f) / total
			}
			total = 1 - f
		}
		for _, st := range np.lb {
			for _, sg := range st.segs {
				for i, s := range sg.targets {
					x := f * float64(sg.n) / float64(np.lbConns) * sg.share[i]
					weight[s] += x
					total += x
				}
			}
		}
	}
	live := expectedLive(np.conns+np.lbConns, &w.tr)
	if rn != nil {
		live = min(maxReserve, live+rn.addWeights(weight, &total, np.conns))
	}
	per := shardSlots/2 - 1024
	targeted := 0
	for s := range w.svcs {
		if weight[s] > 0 {
			targeted++
		}
	}
	n := min(maxShards, max(1, (live*12/10+per-1)/per, (targeted+shardPorts-1)/shardPorts))
	p := &shardPlan{n: n, of: make([]int32, len(w.svcs)), local: make([]int32, len(w.svcs)), live: make([]int, n), share: make([]float64, n)}
	load := make([]float64, n)
	acc := 0.0
	for s := range w.svcs {
		if weight[s] <= 0 {
			p.of[s] = -1
			continue
		}
		k := min(n-1, int(acc/total*float64(n)))
		p.of[s] = int32(k)
		load[k] += weight[s]
		acc += weight[s]
	}
	for k := range n {
		if total > 0 {
			p.share[k] = load[k] / total
			p.live[k] = int(float64(live)*p.share[k]*1.2) + 64
		}
	}
	p.members = make([][]int32, n)
	for s := range w.svcs {
		if k := p.of[s]; k >= 0 {
			p.local[s] = int32(len(p.members[k]))
			p.members[k] = append(p.members[k], int32(s))
		}
	}
	return p
}

// expectedLive estimates a node's peak live conntrack entries: every
// connection of the last TIME_WAIT (plus a flow's length) of the run.
func expectedLive(conns int64, tr *trafficPlan) int {
	n := float64(conns)
	if tr.span > 0 {
		if f := float64(int64(engine.DefaultTCPTimeWait)+2*tr.meanDur) / float64(tr.span); f < 1 {
			n *= f * 1.1
		}
	}
	return int(min(n, maxReserve))
}

// trafficStream is a node's traffic source: the same in every mode (the
// modes see the same connections; only their decisions differ).
func trafficStream(seed uint64, ni int) *rand.PCG {
	return rand.NewPCG(seed^0x7472616666696373, mix(uint64(ni)|1<<40))
}

// chunkConn is one generated connection.
type chunkConn struct {
	c     engine.Conn
	t     int64
	svc   int32 // service port
	local int32 // its number in its shard
}

// chunk holds generated connections bucketed by shard, each bucket in time
// order.
type chunk struct {
	byShard [][]chunkConn
}

// trafficGen is a node's stream of new connections in time order: arrival
// i falls in slot [i, i+1)·span/n at a uniform offset; its client, source
// address and port, target service port (alias table) and duration are
// drawn from the node's traffic random stream.
type trafficGen struct {
	tr     *trafficPlan
	np     *nodePlan
	pcg    *rand.PCG
	xr     *rand.Rand
	seq    []uint16
	protos []engine.Proto
	i, n   int64
	delta  float64
	// The node's load-balancer streams (nil without any), merged with the
	// static stream in time order: si counts the static arrivals emitted,
	// sx and st are the next static arrival's pre-drawn number and time.
	lb     []lbCursor
	lbRand *rand.PCG
	lbXR   *rand.Rand
	si     int64
	sx     uint64
	st     int64
	sReady bool
}

func newTrafficGen(w *world, ni int, seed uint64) *trafficGen {
	tr := &w.tr
	np := &tr.perNode[ni]
	g := &trafficGen{tr: tr, np: np, pcg: trafficStream(seed, ni), n: np.conns + np.lbConns}
	g.xr = rand.New(g.pcg)
	if np.lbConns > 0 {
		g.lbRand = rand.NewPCG(seed^0x62616c616e636572, mix(uint64(ni)|2<<40))
		g.lbXR = rand.New(g.lbRand)
		for k := range np.lb {
			g.lb = append(g.lb, newLBCursor(&np.lb[k], g.lbRand))
		}
	}
	g.seq = make([]uint16, np.seqPorts)
	for i := range g.seq {
		g.seq[i] = uint16((uint64(uint32(g.pcg.Uint64())) * ephemeralN) >> 32)
	}
	if np.conns > 0 {
		g.delta = float64(tr.span) / float64(np.conns)
	}
	g.protos = make([]engine.Proto, len(w.svcs))
	for s := range w.svcs {
		g.protos[s] = w.svcs[s].proto
	}
	return g
}

// fill generates the next chunk of connections into ch, bucketed by the
// plan's shards; false when the stream is exhausted.
func (g *trafficGen) fill(ch *chunk, p *shardPlan) bool {
	k := min(chunkConns, g.n-g.i)
	for b := range ch.byShard {
		// Room for the shard's share, so that appending rarely copies.
		// Emptied even when the stream is exhausted: the buckets are the
		// worker's, and a node with no connections of its own must not
		// be handed the previous node's.
		// Under a load balancer the nodes' shares differ (it follows
		// their health): an eighth more, so that the next node rarely
		// needs a new bucket.
		if want := int(float64(max(k, 0))*p.share[b]*1.05) + 256; cap(ch.byShard[b]) < want {
			if g.lb != nil {
				want += want / 8
			}
			ch.byShard[b] = make([]chunkConn, 0, want)
		}
		ch.byShard[b] = ch.byShard[b][:0]
	}
	if k <= 0 {
		return false
	}
	if g.lb != nil {
		g.fillMerged(ch, p, k)
		return true
	}
	for j := range k {
		x := g.pcg.Uint64()
		g.emitStatic(ch, p, int64((float64(g.i+j)+float64(x>>11)*0x1p-53)*g.delta))
	}
	g.i += k
	return true
}

// emitStatic draws the rest of a static arrival at t (its arrival number
// already drawn): its client group, source address and port, target
// service port and duration, from the node's traffic stream.
func (g *trafficGen) emitStatic(ch *chunk, p *shardPlan, t int64) {
	tr, np, pcg := g.tr, g.np, g.pcg
	ng := &np.groups[0]
	if len(np.groups) > 1 {
		ng = &np.groups[np.alias.pick(pcg.Uint64())]
	}
	gp := &tr.groups[ng.group]
	y := pcg.Uint64()
	src := uint32(((y >> 32) * uint64(ng.count)) >> 32)
	var sp *uint16
	if ng.seqOff >= 0 {
		sp = &g.seq[int(ng.seqOff)+int(src)]
	}
	port := sourcePort(gp.portMode, uint32(y), sp)
	s := gp.targets[gp.alias.pick(pcg.Uint64())]
	d := tr.meanDur
	if tr.expDur {
		d = int64(g.xr.ExpFloat64() * float64(tr.meanDur))
	}
	g.put(ch, p, s, engine.Conn{SrcIP: ng.base + src, SrcPort: port, Proto: g.protos[s], End: t + d}, t)
}
