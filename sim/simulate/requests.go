package simulate

// Clients with requests (scenario.Requests, scenario.Pool): long-lived
// connections and the requests they carry.
//
// A client with requests is one source address (a client pod, or each of
// its addresses when sourceIPs > 1). With a pool it holds pool.size
// connections to each of its target service ports, opened at the start of
// the run and, with a maxAge, each replaced by a new one when it reaches
// its age; without a pool each request is a connection of its own. Every
// such connection is a new connection of its node, decided like any
// other: it is merged in time order into its shard's stream and goes
// through the node's conntrack and the mode's engine (Node.Connect), then
// accounting, so the rules, syncs and exposure windows apply to it and the
// engine's state (IPVS's counters, rr's position) includes it. Which
// connections open and when depends neither on the mode nor on the
// decisions, so a node's request connections are generated once (reqgen.go)
// and every mode decides the same ones.
//
// The requests themselves never reach the dataplane: a request rides the
// connection it picked (round-robin or least-busy in its pool) to that
// connection's pod. After a node's run in a mode, its requests are
// replayed from their own random stream (the same in every mode) over the
// endpoints its connections reached (reqrun.go), and counted per followed
// service port, per pod and per time bin (reqreport.go).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kpsim/kpsim/sim/scenario"
)

// Request traffic bounds and constants, documented in sim/README.md.
const (
	// maxRequests bounds the requests of a run, over every client.
	maxRequests = 1e9
	// maxRequestConns bounds the request clients' connections of one node
	// (40 bytes each, and an endpoint per mode).
	maxRequestConns = 1 << 24
	// maxFollowed bounds the service ports the report follows.
	maxFollowed = 8
	// requestBins is about the number of time bins of a followed port.
	requestBins = 200
	// ageJitter is a pooled connection's lifetime spread: maxAge × a
	// uniform factor in [1−ageJitter, 1+ageJitter], as gRPC jitters
	// MaxConnectionAge.
	ageJitter = 0.1
	// balanceAlpha is the level of the even-spread bounds of the report:
	// the chance that an even random spread exceeds one, over the pods
	// (and, for the decay, over the bins after the scale event).
	balanceAlpha = 0.001
)

// Kinds of request duration.
const (
	durFixed uint8 = iota
	durExp
	durPareto
	durLognormal
)

// durDist draws request durations.
type durDist struct {
	kind uint8
	mean float64 // ns
	// pareto: a = alpha, b = scale (ns); lognormal: a = mu, b = sigma (of
	// the log of ns).
	a, b float64
	desc string
}

func newDurDist(d *scenario.DurationDist) durDist {
	out := durDist{mean: float64(d.Mean.Duration), desc: d.Kind + ", mean " + d.Mean.Duration.String()}
	switch d.Kind {
	case "exponential":
		out.kind = durExp
	case "pareto":
		// Scale x_m of a Pareto of this mean: mean·(α−1)/α.
		out.kind, out.a, out.b = durPareto, d.Alpha, out.mean*(d.Alpha-1)/d.Alpha
		out.desc += fmt.Sprintf(", alpha %g", d.Alpha)
	case "lognormal":
		// mu of a lognormal of this mean: ln(mean) − σ²/2.
		out.kind, out.a, out.b = durLognormal, math.Log(out.mean)-d.Sigma*d.Sigma/2, d.Sigma
		out.desc += fmt.Sprintf(", sigma %g", d.Sigma)
	}
	return out
}

// draw is one duration in ns (at most 2^62: a Pareto draw can be huge).
func (d *durDist) draw(r *rand.Rand) int64 {
	var x float64
	switch d.kind {
	case durFixed:
		return int64(d.mean)
	case durExp:
		x = r.ExpFloat64() * d.mean
	case durPareto:
		x = d.b * math.Pow(1-r.Float64(), -1/d.a) // 1−U is in (0, 1]
	case durLognormal:
		x = math.Exp(d.a + d.b*r.NormFloat64())
	}
	return int64(min(x, 1<<62))
}

// reqGroup is one client group with requests.
type reqGroup struct {
	name string
	gp   groupPlan // targets, their alias table, the source-port policy
	// size is the pool's connections per client and target (0: no pool,
	// a connection per request); maxAge their age (0: the whole run).
	size      int
	maxAge    int64
	leastBusy bool
	rate      float64 // requests per second of each client
	dur       durDist
}

// reqClient is one client of a group: one source address on its node.
type reqClient struct {
	group int32
	src   uint32
}

// followed is a service port whose request traffic the report follows,
// with the first scale event of its Service (at < 0: none).
type followed struct {
	svc      int32
	at       int64
	replicas int
	groups   []string // the groups sending to it
}

// reqPlan is the request traffic resolved against the cluster.
type reqPlan struct {
	groups  []reqGroup
	perNode [][]reqClient
	follow  []followed
	fidx    []int8 // per service port: its index in follow, or -1
	bin     int64
	bins    int
	// requests expected over the run, all clients.
	expected float64
}

// planRequests resolves the clients with requests: their targets, their
// nodes and source addresses (after the other clients'), the service
// ports the report follows and its time bins. w.rq stays nil without any.
func (w *world) planRequests(clients []scenario.Client) error {
	rq := &reqPlan{perNode: make([][]reqClient, len(w.nodes))}
	next := uint64(sourceBase) + uint64(w.tr.sources)
	var conns float64
	for _, c := range clients {
		if c.Requests == nil {
			continue
		}
		g, err := w.requestGroup(c)
		if err != nil {
			return err
		}
		nodes, err := w.requestNodes(c)
		if err != nil {
			return err
		}
		gi := int32(len(rq.groups))
		n := uint64(c.PodsPerNode) * uint64(c.SourceIPs)
		for _, ni := range nodes {
			if next+n > sourceBase+sourceCount {
				return fmt.Errorf("client %s: more than %d client source addresses in all", c.Name, sourceCount)
			}
			for range n {
				rq.perNode[ni] = append(rq.perNode[ni], reqClient{group: gi, src: uint32(next)})
				next++
			}
		}
		clientsN := float64(n) * float64(len(nodes))
		rq.expected += g.rate * secs(w.tr.span) * clientsN
		conns += g.expectedConns(w.tr.span) * clientsN
		rq.groups = append(rq.groups, g)
	}
	if len(rq.groups) == 0 {
		return nil
	}
	if rq.expected > maxRequests {
		return fmt.Errorf("the clients with requests send about %.3g requests over the run, more than %g: lower requests.rate or the run's length", rq.expected, float64(maxRequests))
	}
	if conns > maxRequestConns {
		return fmt.Errorf("the clients with requests open about %.3g connections over the run, more than %d: give them a pool, a larger maxAge or a lower rate", conns, maxRequestConns)
	}
	w.tr.sources = int(next - sourceBase)
	w.tr.targets = countTargets(w.tr.groups, rq.groups)
	w.rq = rq
	rq.followPorts(w)
	// About requestBins bins, at least 10 ms each, whole milliseconds.
	ms := int64(time.Millisecond)
	rq.bin = max(10*ms, (w.tr.span/requestBins+ms-1)/ms*ms)
	rq.bins = int((w.tr.span + rq.bin - 1) / rq.bin)
	return nil
}

// countTargets is the number of distinct service ports any client sends
// to.
func countTargets(plain []groupPlan, req []reqGroup) int {
	seen := map[int32]bool{}
	for _, g := range plain {
		for _, s := range g.targets {
			seen[s] = true
		}
	}
	for _, g := range req {
		for _, s := range g.gp.targets {
			seen[s] = true
		}
	}
	return len(seen)
}

// requestGroup resolves one client group with requests.
func (w *world) requestGroup(c scenario.Client) (reqGroup, error) {
	gp, err := w.clientGroup(c, nil)
	if err != nil {
		return reqGroup{}, err
	}
	g := reqGroup{name: c.Name, gp: gp, rate: c.Requests.Rate, dur: newDurDist(c.Requests.Duration)}
	if p := c.Pool; p != nil {
		g.size = p.Size
		g.leastBusy = p.Pick == scenario.PickLeastBusy
		if p.MaxAge != nil {
			g.maxAge = int64(p.MaxAge.Duration)
		}
	}
	return g, nil
}

// expectedConns is how many connections one client of the group opens
// over a run of span ns.
func (g *reqGroup) expectedConns(span int64) float64 {
	switch {
	case g.size == 0:
		return g.rate * secs(span)
	case g.maxAge == 0:
		return float64(g.size * len(g.gp.targets))
	}
	lives := float64(span)/(float64(g.maxAge)*(1-ageJitter)) + 2
	return float64(g.size*len(g.gp.targets)) * lives
}

// requestNodes is the nodes a client group runs on (every node when it
// names none), by index.
func (w *world) requestNodes(c scenario.Client) ([]int, error) {
	var out []int
	if len(c.Nodes) == 0 {
		for ni := range w.nodes {
			out = append(out, ni)
		}
		return out, nil
	}
	for _, name := range c.Nodes {
		ni := slices.IndexFunc(w.nodes, func(n nodeInfo) bool { return n.name == name })
		if ni < 0 {
			return nil, fmt.Errorf("client %s: node %s is not in the cluster", c.Name, name)
		}
		out = append(out, ni)
	}
	return out, nil
}

// followPorts picks the service ports the report follows: every target
// of the request clients, in group and target order, each with the first
// scale event of its Service (if any); at most maxFollowed.
func (rq *reqPlan) followPorts(w *world) {
	rq.fidx = make([]int8, len(w.svcs))
	for s := range rq.fidx {
		rq.fidx[s] = -1
	}
	for _, g := range rq.groups {
		for _, s := range g.gp.targets {
			if rq.fidx[s] >= 0 || len(rq.follow) >= maxFollowed {
				continue
			}
			rq.fidx[s] = int8(len(rq.follow))
			f := followed{svc: s, at: -1}
			if at, replicas, ok := w.firstScale(s); ok {
				f.at, f.replicas = at, replicas
			}
			for _, h := range rq.groups {
				if slices.Contains(h.gp.targets, s) {
					f.groups = append(f.groups, h.name)
				}
			}
			rq.follow = append(rq.follow, f)
		}
	}
}

// firstScale is the earliest scale event of service port s's Service.
func (w *world) firstScale(s int32) (at int64, replicas int, ok bool) {
	name := w.svcs[s].name.NamespacedName.String()
	at = math.MaxInt64
	for _, e := range w.sc.Events {
		if e.Type != scenario.EventScale || e.Service != name || e.Replicas == nil {
			continue
		}
		if t := int64(e.At.Duration); t < at {
			at, replicas, ok = t, *e.Replicas, true
		}
	}
	return at, replicas, ok
}
