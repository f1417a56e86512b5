package simulate

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Traffic defaults and constants, documented in sim/README.md.
const (
	// SettleAfterEvents is how long traffic continues after the last
	// timeline step when the scenario gives a connection count without a
	// rate: the run spans the last step plus this (at least 4 ×
	// minSyncPeriod), so every event's exposure window is inside it.
	SettleAfterEvents = 10 * time.Second
	// Ephemeral source ports: Linux's default ip_local_port_range.
	ephemeralLo = 32768
	ephemeralN  = 60999 - 32768 + 1
	// fixedSourcePort is the one source port of "sourcePorts: fixed".
	fixedSourcePort = 40000
	// sourceBase is the first synthetic client address (100.64.0.0/10, the
	// shared address space, so it cannot clash with the scenario's ranges).
	sourceBase  = 0x64400000
	sourceCount = 1 << 22
)

// Source-port policies.
const (
	portRandom uint8 = iota
	portSequential
	portFixed
)

// trafficPlan is the traffic section resolved against the cluster.
type trafficPlan struct {
	total   int64
	span    int64 // ns
	groups  []groupPlan
	perNode []nodePlan
	// Connection durations.
	expDur  bool
	meanDur int64
	sources int
	targets int
	durDesc string
}

type groupPlan struct {
	name     string
	portMode uint8
	targets  []int32   // service ports
	weights  []float64 // their shares, summing to 1
	alias    alias
}

type nodePlan struct {
	// conns is the node's static connections (groups); lbConns its
	// load balancers' (lb).
	conns, lbConns int64
	groups         []nodeGroup
	lb             []lbStream
	alias          alias // over groups, when more than one
	// seqPorts is the number of sequential-port counters the node needs.
	seqPorts int
}

type nodeGroup struct {
	group  int32
	base   uint32 // first source address
	count  uint32 // pods × source addresses
	seqOff int32  // offset of its sequential-port counters, -1 if none
	weight float64
}

// planTraffic resolves clients to nodes, addresses and target service
// ports, and splits the connections over nodes.
func (w *world) planTraffic() error {
	tr := &w.tr
	tr.perNode = make([]nodePlan, len(w.nodes))
	if !w.trafficVolume() {
		return nil
	}
	if err := w.externalSources(); err != nil {
		return err
	}
	share, lbConns, err := w.planClients(w.sc.Traffic.Clients)
	if err != nil {
		return err
	}
	tr.splitConnections(share, tr.total-lbConns)
	w.planBalancers()
	for i := range tr.perNode {
		np := &tr.perNode[i]
		ws := make([]float64, len(np.groups))
		for j, g := range np.groups {
			ws[j] = g.weight
		}
		np.alias = newAlias(ws)
	}
	return w.planRequests(w.sc.Traffic.Clients)
}

// trafficVolume decides the run's span (the last timeline step plus the
// settle time, or the traffic's duration), the number of connections and
// their durations. It reports false when the scenario has no traffic.
func (w *world) trafficVolume() bool {
	t := w.sc.Traffic
	tr := &w.tr
	var last int64
	for _, s := range w.steps {
		last = max(last, s.at)
	}
	settle := SettleAfterEvents
	if p := w.sc.Proxy.MinSyncPeriod; p != nil {
		settle = max(settle, 4*p.Duration)
	}
	tr.span = last + int64(settle)
	if t == nil {
		tr.durDesc = "none"
		return false
	}
	switch {
	case t.Connections > 0:
		tr.total = t.Connections
	case t.Duration != nil:
		tr.total = int64(math.Round(t.Rate * t.Duration.Seconds()))
		tr.span = int64(t.Duration.Duration)
	}
	tr.durDesc = "0 (instant)"
	if d := t.ConnectionDuration; d != nil {
		tr.meanDur = int64(d.Mean.Duration)
		tr.expDur = d.Kind == "exponential"
		tr.durDesc = d.Kind + ", mean " + d.Mean.Duration.String()
	}
	return true
}

// planClients resolves each client group's targets and places its pods on
// its nodes (every node when it names none), each with its own block of
// source addresses. It returns each node's share of the connections: a
// group's weight, split evenly over its nodes. Clients with requests
// send at their own rate (planRequests) and have no share.
func (w *world) planClients(clients []scenario.Client) ([]float64, int64, error) {
	tr := &w.tr
	nodeIdx := map[string]int{}
	for i, n := range w.nodes {
		nodeIdx[n.name] = i
	}
	share := make([]float64, len(w.nodes))
	var lbConns int64
	next := uint32(sourceBase)
	allTargets := map[int32]bool{}
	totalW := 0.0
	for _, c := range clients {
		if c.Requests == nil {
			totalW += c.Weight
		}
	}
	for i, c := range clients {
		if c.Requests != nil {
			continue
		}
		gi := len(tr.groups)
		ec := w.extClientOf(i)
		g, err := w.clientGroup(c, ec)
		if err != nil {
			return nil, 0, err
		}
		for _, s := range g.targets {
			allTargets[s] = true
		}
		if ec != nil && ec.via == cluster.ViaLoadBalancer {
			// The balancer's connections follow its view of the nodes
			// (planLB), not a static share.
			ec.group = int32(gi)
			ec.conns = int64(math.Round(float64(tr.total) * c.Weight / totalW))
			lbConns += ec.conns
			w.lbNodeGroups(ec, gi, g.portMode)
			tr.groups = append(tr.groups, g)
			continue
		}
		nodes := c.Nodes
		if len(nodes) == 0 {
			for _, n := range w.nodes {
				nodes = append(nodes, n.name)
			}
		}
		for _, name := range nodes {
			ni, ok := nodeIdx[name]
			if !ok {
				return nil, 0, fmt.Errorf("client %s: node %s is not in the cluster", c.Name, name)
			}
			ng := nodeGroup{group: int32(gi), seqOff: -1, weight: c.Weight / totalW / float64(len(nodes))}
			if ec != nil {
				// An outside client's addresses are the same whichever
				// node its connections enter at.
				ng.base, ng.count = ec.base, ec.count
			} else {
				count := uint64(c.PodsPerNode) * uint64(c.SourceIPs)
				if uint64(next)+count > sourceBase+sourceCount {
					return nil, 0, fmt.Errorf("client %s: more than %d client source addresses in all", c.Name, sourceCount)
				}
				ng.base, ng.count = next, uint32(count)
				next += uint32(count)
			}
			if g.portMode == portSequential {
				ng.seqOff = int32(tr.perNode[ni].seqPorts)
				tr.perNode[ni].seqPorts += int(ng.count)
			}
			tr.perNode[ni].groups = append(tr.perNode[ni].groups, ng)
			share[ni] += ng.weight
		}
		tr.groups = append(tr.groups, g)
	}
	tr.sources = int(next-sourceBase) + w.externalSourceCount()
	tr.targets = len(allTargets)
	return share, lbConns, nil
}

// clientGroup is one client group's source-port policy and target service
// ports, with their weights normalised to sum to 1.
func (w *world) clientGroup(c scenario.Client, ec *extClient) (groupPlan, error) {
	g := groupPlan{name: c.Name}
	switch c.SourcePorts {
	case "sequential":
		g.portMode = portSequential
	case "fixed":
		g.portMode = portFixed
	}
	var weights []float64
	if ec != nil {
		// Resolved with the external entries (addExternalEntries).
		g.targets, weights = ec.targets, ec.weights
	} else {
		var err error
		if weights, err = w.targets(c.Services, c.Protocol, &g); err != nil {
			return groupPlan{}, fmt.Errorf("client %s: %w", c.Name, err)
		}
	}
	g.alias = newAlias(weights)
	sum := 0.0
	for _, x := range weights {
		sum += x
	}
	for _, x := range weights {
		g.weights = append(g.weights, x/sum)
	}
	return g, nil
}

// splitConnections gives each node its share of the total connections,
// rounded by largest remainder so that they add up to exactly the total;
// a node with no share gets none.
func (tr *trafficPlan) splitConnections(share []float64, total int64) {
	type rem struct {
		i int
		r float64
	}
	var rems []rem
	var given int64
	sum := 0.0
	for _, s := range share {
		sum += s
	}
	for i, s := range share {
		x := 0.0
		if sum > 0 {
			x = float64(total) * s / sum
		}
		n := int64(math.Floor(x))
		tr.perNode[i].conns = n
		given += n
		rems = append(rems, rem{i, x - float64(n)})
	}
	slices.SortStableFunc(rems, func(a, b rem) int {
		switch {
		case a.r > b.r:
			return -1
		case a.r < b.r:
			return 1
		}
		return 0
	})
	for k := 0; given < total && k < len(rems); k++ {
		if share[rems[k].i] > 0 {
			tr.perNode[rems[k].i].conns++
			given++
		}
	}
}

// targets resolves a client's services (every Service when empty; a
// "namespace/name" target means each of its ports) and weights them so that
// every Service gets the same share, split evenly over its ports.
func (w *world) targets(list []string, proto string, g *groupPlan) ([]float64, error) {
	match := func(s int32) bool {
		return proto == "" || string(w.svcs[s].name.Protocol) == proto
	}
	perService := map[string][]int32{}
	var order []string
	add := func(key string, s int32) {
		if _, ok := perService[key]; !ok {
			order = append(order, key)
		}
		if !slices.Contains(perService[key], s) {
			perService[key] = append(perService[key], s)
		}
	}
	if len(list) == 0 {
		for s := range w.nBase {
			if match(s) {
				add(w.svcs[s].name.NamespacedName.String(), s)
			}
		}
	}
	for _, target := range list {
		svc, port, hasPort := strings.Cut(target, ":")
		found := false
		for s := range w.nBase {
			n := w.svcs[s].name
			if n.NamespacedName.String() != svc || (hasPort && n.Port != port) || !match(s) {
				continue
			}
			add(svc, s)
			found = true
		}
		if !found {
			return nil, fmt.Errorf("target %s has no %sservice port to send to", target, map[bool]string{true: proto + " ", false: ""}[proto != ""])
		}
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("no service port to send to")
	}
	var weights []float64
	for _, key := range order {
		ports := perService[key]
		for _, s := range ports {
			g.targets = append(g.targets, s)
			weights = append(weights, 1/float64(len(ports)))
		}
	}
	return weights, nil
}

// alias is Vose's alias table: one 64-bit draw picks an index with the
// given weights in constant time (the upper 32 bits choose a column, the
// lower 32 bits the coin).
type alias struct {
	prob  []uint64 // threshold on the lower 32 bits; 1<<32 means always
	alias []int32
	n     uint64
}

func newAlias(w []float64) alias {
	n := len(w)
	a := alias{prob: make([]uint64, n), alias: make([]int32, n), n: uint64(n)}
	if n == 0 {
		return a
	}
	sum := 0.0
	for _, x := range w {
		sum += x
	}
	p := make([]float64, n)
	var small, large []int32
	for i, x := range w {
		p[i] = x / sum * float64(n)
		if p[i] < 1 {
			small = append(small, int32(i))
		} else {
			large = append(large, int32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		a.prob[s] = uint64(p[s] * (1 << 32))
		a.alias[s] = l
		p[l] = p[l] + p[s] - 1
		if p[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	for _, i := range large {
		a.prob[i], a.alias[i] = 1<<32, i
	}
	for _, i := range small {
		// Left over by rounding: these are 1 up to float error.
		a.prob[i], a.alias[i] = 1<<32, i
	}
	return a
}

// pick maps one 64-bit draw to an index.
func (a *alias) pick(x uint64) int32 {
	i := ((x >> 32) * a.n) >> 32
	if x&0xFFFFFFFF < a.prob[i] {
		return int32(i)
	}
	return a.alias[i]
}

// sourcePort is the source port for a connection.
func sourcePort(mode uint8, r uint32, seq *uint16) uint16 {
	switch mode {
	case portSequential:
		p := *seq
		*seq = (p + 1) % ephemeralN
		return ephemeralLo + p
	case portFixed:
		return fixedSourcePort
	}
	return ephemeralLo + uint16((uint64(r)*ephemeralN)>>32)
}
