package conform

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"sort"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/oracle"
)

// simMachine runs a suite's checks on the simulator's engines instead of
// the kernel: one engine.Node per node (its rules rendered from the API
// state by the subject's own endpoint selection, its conntrack table, its
// affinity memory), a virtual clock, and an optional loss model. The
// checks, their probe plan (Prober's blocks, port walk and sources: planBlocks, Probe.source),
// their counting and their decisions are the run's own. It is the harness
// calibration's machine: on a correct dataplane every verdict's
// false-failure rate must hold through it.
type simMachine struct {
	s     *suite
	mode  engine.Mode
	cls   []*netns.Client
	nodes map[string]*engine.Node
	ids   *engine.Interner
	svcs  map[netip.AddrPort]int // VIP:port -> service-port index
	spns  []cluster.ServicePortName
	clock int64 // virtual nanoseconds
	// decided counts NAT decisions per node, service port and endpoint
	// ID, as the kernel's rule counters do.
	decided map[string]map[int]map[int32]uint64
	// lossRate is the probability that the observer misses a delivered
	// probe (the kernel decided, the counters count it).
	lossRate float64
	loss     *rand.Rand
	counts   Counts
}

// probeSpacing is the virtual time between two probes (the kernel path
// sends about 100,000 a second).
const probeSpacing = 10 * time.Microsecond

// newSimMachine builds the engines of every node of the suite's model and
// programs them from its API state.
func newSimMachine(s *suite, cls []*netns.Client, seed uint64, lossRate float64) (*simMachine, error) {
	mode, err := engine.ModeOf(s.o.Mode)
	if err != nil {
		return nil, err
	}
	m := &simMachine{s: s, mode: mode, cls: cls, nodes: map[string]*engine.Node{}, ids: engine.NewInterner(),
		svcs: map[netip.AddrPort]int{}, decided: map[string]map[int]map[int32]uint64{},
		lossRate: lossRate, loss: rand.New(rand.NewPCG(seed, 0x6c6f7373))}
	// A probe's IPVS connection ends in CLOSE for 10 s: the backend's reset
	// passes in ipvs mode (keepResets), so it never sits in TIME_WAIT.
	cfg := engine.NodeConfig{Mode: mode, IPVS: engine.IPVSConfig{Scheduler: s.l.Scenario.Proxy.IPVSScheduler, TCPTimeWait: oracle.IPVSCloseTimeout}}
	if s.ipset {
		cfg.IPTables.RecentCapacity = proxy.IPSetMaxElem
	}
	st := s.state()
	for i, name := range st.SortedNodes() {
		n, err := engine.NewNode(name, cfg, engine.NewRand(rand.NewPCG(seed, uint64(i))))
		if err != nil {
			return nil, err
		}
		m.nodes[name] = n
	}
	m.program(st)
	m.resetCounts()
	return m, nil
}

// program renders and installs every service port on every node.
func (m *simMachine) program(st *cluster.State) {
	for _, spn := range st.SortedServicePorts() {
		sp := st.Services[spn]
		vip := netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))
		idx, ok := m.svcs[vip]
		if !ok {
			idx = len(m.spns)
			m.svcs[vip] = idx
			m.spns = append(m.spns, spn)
		}
		for name, n := range m.nodes {
			zone := ""
			if nd := st.Nodes[name]; nd != nil {
				zone = nd.Zone
			}
			n.Program(idx, engine.Render(m.mode, sp, st.Endpoints[spn], name, zone, m.ids, engine.RenderOptions{PreferSameNode: m.s.or.PreferSameNode}), m.clock)
		}
	}
}

func (m *simMachine) resetCounts() {
	m.counts = Counts{Arrivals: map[Key]int{}, Rejects: map[netip.Addr]int{}}
}

func (m *simMachine) clients() []*netns.Client { return m.cls }
func (m *simMachine) phase()                   { m.resetCounts() }
func (m *simMachine) now() time.Duration       { return time.Duration(m.clock) }
func (m *simMachine) quiesce()                 {}

func (m *simMachine) flush() {
	for _, n := range m.nodes {
		n.CT.Reset()
	}
}

func (m *simMachine) idle(ctx context.Context, d time.Duration) error {
	m.clock += int64(d)
	return ctx.Err()
}

// collectTime is the virtual time a collection takes: the kernel's waits
// for the phase's packets take a few milliseconds at least (a probe sent
// after it never shares a millisecond with one sent before).
const collectTime = 2 * time.Millisecond

func (m *simMachine) collect(int) Counts {
	m.clock += int64(collectTime)
	c := Counts{Arrivals: make(map[Key]int, len(m.counts.Arrivals)), Rejects: make(map[netip.Addr]int, len(m.counts.Rejects)),
		OtherICMP: m.counts.OtherICMP, Seen: m.counts.Seen}
	for k, v := range m.counts.Arrivals {
		c.Arrivals[k] = v
	}
	for k, v := range m.counts.Rejects {
		c.Rejects[k] = v
	}
	return c
}

// send decides every probe of the batch on the client's node, with the
// source ports the kernel prober would use.
func (m *simMachine) send(ctx context.Context, b Probe, r *rand.Rand) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := m.nodes[b.Client.Node]
	svc, ok := m.svcs[b.VIP]
	if n == nil || !ok {
		// Nothing programs this address: unrouted.
		m.counts.OtherICMP += b.N
		m.counts.Seen += b.N
		return b.N, nil
	}
	proto := engine.TCP
	if b.Proto == traffic.UDP {
		proto = engine.UDP
	}
	sent := 0
	for i, blk := range planBlocks(b.N, r) {
		if b.N > 1 {
			// The kernel prober empties conntrack before every block of a
			// counted batch.
			m.flush()
		}
		src := b.source(i)
		for j := 0; j < blk.N; j++ {
			m.clock += int64(probeSpacing)
			c := engine.Conn{SrcIP: engine.IPv4(src), SrcPort: blk.port(j), Proto: proto, End: m.probeEnd(proto)}
			m.deliver(n, svc, &c, src)
			sent++
		}
	}
	return sent, nil
}

// probeEnd is when a probe's flow ends, as the kernel sees it: a SYN whose
// reset the backend namespace drops stays SYN_SENT for 120 s (so a probe
// that reused its tuple would follow it); in ipvs mode the reset passes
// and the connection closes at once; a datagram ends when it is sent.
func (m *simMachine) probeEnd(p engine.Proto) int64 {
	if p == engine.UDP || m.mode == engine.IPVS {
		return m.clock
	}
	return m.clock + int64(120*time.Second)
}

func (m *simMachine) deliver(n *engine.Node, svc int, c *engine.Conn, src netip.Addr) {
	res := n.Connect(svc, c, m.clock)
	switch res.Verdict {
	case engine.Reject:
		m.counts.Rejects[src]++
		m.counts.Seen++
	case engine.Accept:
		if !res.Established {
			m.count(n.Name, svc, res.Endpoint)
		}
		ep := m.ids.Key(res.Endpoint)
		if m.lossRate > 0 && m.loss.Float64() < m.lossRate {
			return // the observer missed it
		}
		m.counts.Arrivals[Key{Endpoint: ep, Client: src}]++
		m.counts.Seen++
	}
}

func (m *simMachine) count(node string, svc int, ep int32) {
	byNode := m.decided[node]
	if byNode == nil {
		byNode = map[int]map[int32]uint64{}
		m.decided[node] = byNode
	}
	if byNode[svc] == nil {
		byNode[svc] = map[int32]uint64{}
	}
	byNode[svc][ep]++
}

func (m *simMachine) counters(node string) []dataplane.Counter {
	var out []dataplane.Counter
	for svc, eps := range m.decided[node] {
		for ep, v := range eps {
			out = append(out, dataplane.Counter{ServicePort: m.spns[svc], Endpoint: m.ids.Key(ep).String(), Packets: v})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ServicePort != out[j].ServicePort {
			return out[i].ServicePort.String() < out[j].ServicePort.String()
		}
		return out[i].Endpoint < out[j].Endpoint
	})
	return out
}

// apply writes the step through the model's API and reprograms every node
// at once: the simulated proxies have no sync delay.
func (m *simMachine) apply(ctx context.Context, step apiserver.Step) (map[string]time.Duration, error) {
	if err := m.s.applyModel(ctx, step); err != nil {
		return nil, err
	}
	m.program(m.s.state())
	out := map[string]time.Duration{}
	for name := range m.nodes {
		out[name] = 0
	}
	return out, nil
}
