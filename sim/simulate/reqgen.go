package simulate

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kpsim/kpsim/sim/engine"
)

// reqConn is one connection of a request client: a pooled connection
// (one lifetime of one pool slot) or a request's own connection.
type reqConn struct {
	t, end int64 // open and close, ns; end is the run's end for a kept one
	svc    int32
	client int32 // index in the node's request clients
	port   uint16
}

// idRange is the connection ids lo..hi-1.
type idRange struct{ lo, hi int32 }

// reqOpen is a request connection as its shard's stream takes it.
type reqOpen struct {
	cc chunkConn
	id int32
}

// reqNode is one node's request connections, the same in every mode.
type reqNode struct {
	conns []reqConn // by id, in the order generated
	// first[ci]..first[ci+1]-1 are client ci's connections.
	first []int32
	// A pooled client's connections are generated target by target, slot
	// by slot, each slot's lifetimes in time order: slot j (of every
	// pooled client, in order) holds slots[j].lo..slots[j].hi-1, and
	// slotOf[ci] is client ci's first slot (-1 without a pool).
	slots  []idRange
	slotOf []int32
	// perSvc counts the connections per service port (the shard plan's
	// weights); live estimates their peak live conntrack entries.
	perSvc map[int32]int
	live   int
	// byShard are the connections in time order, per shard (bucket).
	byShard [][]reqOpen
}

// requestStream is a node's random stream for its request connections.
func requestStream(seed uint64, ni int) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x726571636f6e6e73, mix(uint64(ni)|2<<40)))
}

// requestTraffic generates node ni's request connections (nil when the
// node has no client with requests).
func (w *world) requestTraffic(ni int, seed uint64) (*reqNode, error) {
	if w.rq == nil || len(w.rq.perNode[ni]) == 0 {
		return nil, nil
	}
	rn := &reqNode{perSvc: map[int32]int{}}
	r := requestStream(seed, ni)
	span := w.tr.span
	short := 0
	for ci, cl := range w.rq.perNode[ni] {
		g := &w.rq.groups[cl.group]
		rn.first = append(rn.first, int32(len(rn.conns)))
		rn.slotOf = append(rn.slotOf, -1)
		if g.size == 0 {
			n := len(rn.conns)
			rn.short(g, int32(ci), span, r)
			short += len(rn.conns) - n
		} else {
			rn.slotOf[ci] = int32(len(rn.slots))
			rn.pooled(g, int32(ci), span, r)
		}
		if len(rn.conns) > maxRequestConns {
			return nil, fmt.Errorf("node %s: its clients with requests open more than %d connections", w.nodes[ni].name, maxRequestConns)
		}
	}
	rn.first = append(rn.first, int32(len(rn.conns)))
	for i := range rn.conns {
		rn.perSvc[rn.conns[i].svc]++
	}
	// Pooled connections are live at once; a request's own lives for its
	// request plus TIME_WAIT.
	rn.live = len(rn.conns) - short + expectedLive(int64(short), &trafficPlan{span: span, meanDur: w.rq.meanShort()})
	return rn, nil
}

// meanShort is the largest mean request duration of the groups without a
// pool, ns.
func (rq *reqPlan) meanShort() int64 {
	var m float64
	for _, g := range rq.groups {
		if g.size == 0 {
			m = max(m, g.dur.mean)
		}
	}
	return int64(m)
}

// pooled generates a pooled client's connections: pool.size per target,
// each opened at the start and, with a maxAge, replaced when it reaches
// its age (maxAge × a factor in [0.9, 1.1]); the first lifetime is a
// uniform fraction of a full one, so the pool starts aged as a pool that
// has run for a while. Its connections take successive source ports from
// a random start: two live ones never share a tuple.
func (rn *reqNode) pooled(g *reqGroup, ci int32, span int64, r *rand.Rand) {
	port := uint32((uint64(uint32(r.Uint64())) * ephemeralN) >> 32)
	lives := 1
	if g.maxAge > 0 {
		// Every lifetime but the first is at least 0.9 × maxAge.
		lives = int(float64(span)/(float64(g.maxAge)*(1-ageJitter))) + 2
	}
	for _, s := range g.gp.targets {
		for range g.size {
			lo := int32(len(rn.conns))
			t := int64(0)
			for k := range lives {
				end := span
				if g.maxAge > 0 {
					life := float64(g.maxAge) * (1 - ageJitter + 2*ageJitter*r.Float64())
					if k == 0 {
						life *= r.Float64()
					}
					end = min(span, t+int64(life))
				}
				rn.conns = append(rn.conns, reqConn{t: t, end: end, svc: s, client: ci, port: uint16(ephemeralLo + port%ephemeralN)})
				port++
				if end >= span {
					break
				}
				t = end
			}
			rn.slots = append(rn.slots, idRange{lo, int32(len(rn.conns))})
		}
	}
}

// short generates the requests of a client without a pool, each a
// connection of its own that lasts the request: Poisson arrivals at the
// client's rate, a target drawn as connections draw theirs, the source
// port by the client's policy.
func (rn *reqNode) short(g *reqGroup, ci int32, span int64, r *rand.Rand) {
	mean := 1e9 / g.rate
	seq := uint16((uint64(uint32(r.Uint64())) * ephemeralN) >> 32)
	limit := int(2*g.rate*secs(span)) + 1000 // Poisson: never reached
	t := int64(0)
	for range limit {
		t += int64(r.ExpFloat64() * mean)
		if t >= span {
			return
		}
		s := g.gp.targets[g.gp.alias.pick(r.Uint64())]
		d := g.dur.draw(r)
		port := sourcePort(g.gp.portMode, uint32(r.Uint64()), &seq)
		rn.conns = append(rn.conns, reqConn{t: t, end: t + d, svc: s, client: ci, port: port})
	}
}

// bucket puts the connections into the plan's shards, each in time order
// (the order generated among equal times).
func (rn *reqNode) bucket(w *world, ni int, p *shardPlan) {
	order := make([]int32, len(rn.conns))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int {
		ta, tb := rn.conns[a].t, rn.conns[b].t
		switch {
		case ta < tb:
			return -1
		case ta > tb:
			return 1
		}
		return 0
	})
	clients := w.rq.perNode[ni]
	rn.byShard = make([][]reqOpen, p.n)
	for _, id := range order {
		c := &rn.conns[id]
		k := p.of[c.svc]
		conn := engine.Conn{SrcIP: clients[c.client].src, SrcPort: c.port, Proto: w.svcs[c.svc].proto, End: c.end}
		rn.byShard[k] = append(rn.byShard[k], reqOpen{cc: chunkConn{c: conn, t: c.t, svc: c.svc, local: p.local[c.svc]}, id: id})
	}
}

// addWeights adds the request connections to a shard plan's weights, in
// the plan's unit (weight × the node's other connections / their total
// weight is a count of connections), and returns their live estimate.
func (rn *reqNode) addWeights(weight []float64, total *float64, conns int64) int {
	unit := 1.0
	if conns > 0 && *total > 0 {
		unit = *total / float64(conns)
	}
	svcs := make([]int32, 0, len(rn.perSvc))
	for s := range rn.perSvc {
		svcs = append(svcs, s)
	}
	slices.Sort(svcs) // a fixed order: the float sum decides the cuts
	for _, s := range svcs {
		x := float64(rn.perSvc[s]) * unit
		weight[s] += x
		*total += x
	}
	return rn.live
}
