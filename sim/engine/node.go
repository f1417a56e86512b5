package engine

import "fmt"

// NodeConfig configures a node's proxy mode and kernel tables.
type NodeConfig struct {
	Mode      Mode
	Conntrack ConntrackConfig
	IPTables  IPTablesConfig
	NFTables  NFTablesConfig
	IPVS      IPVSConfig
}

// NodeStats counts the node's new connections by outcome.
type NodeStats struct {
	Connections uint64
	Established uint64 // followed a live conntrack entry
	Accepted    uint64 // decided by the rules and DNATed
	Dropped     uint64
	Rejected    uint64
}

// Result is what happened to a new connection.
type Result struct {
	// Endpoint is the backend ID, or -1 when the verdict is not Accept.
	Endpoint int32
	Verdict  Verdict
	// Established is true when a live conntrack entry decided, not the rules.
	Established bool
}

// Node is one node's dataplane: a conntrack table and one engine per
// service port (indexed by the caller's service-port number), all drawing
// from the node's random source. Not safe for concurrent use; run nodes in
// parallel, each in its own goroutine.
type Node struct {
	Name string
	cfg  NodeConfig
	rng  *Rand
	// CT is the node's conntrack table.
	CT      *Conntrack
	engines []Engine
	rules   []Rules
	// arena: where engines come from, a block at a time (a node of 30,000
	// service ports would otherwise make 30,000 objects), and the IPVS
	// engines' dests. Its own unless the node was made with NewNodeIn.
	arena    *Arena
	slabNext int // engines the next block holds
	// Stats are the node's counters.
	Stats NodeStats
}

// NewNode returns a node with no service ports programmed.
func NewNode(name string, cfg NodeConfig, rng *Rand) (*Node, error) {
	return NewNodeIn(NewArena(), name, cfg, rng)
}

// NewNodeIn is NewNode with the node's memory taken from an arena: the node
// is valid until the arena's next Reset.
func NewNodeIn(a *Arena, name string, cfg NodeConfig, rng *Rand) (*Node, error) {
	switch cfg.Mode {
	case IPTables, NFTables:
	case IPVS:
		if _, err := ParseScheduler(cfg.IPVS.Scheduler); err != nil {
			return nil, fmt.Errorf("could not configure node %s: %w", name, err)
		}
	default:
		return nil, fmt.Errorf("could not configure node %s: %w: %v", name, ErrUnknownMode, cfg.Mode)
	}
	return &Node{Name: name, cfg: cfg, rng: rng, CT: a.conntrack(cfg.Conntrack), arena: a}, nil
}

// NewEngine returns an engine of the node's mode for one service port, with
// no rules yet (it rejects until Program).
func NewEngine(cfg NodeConfig, rng *Rand) (Engine, error) {
	switch cfg.Mode {
	case IPTables:
		return NewIPTables(rng, cfg.IPTables), nil
	case NFTables:
		return NewNFTables(rng, cfg.NFTables), nil
	case IPVS:
		e, err := NewIPVS(rng, cfg.IPVS)
		if err != nil {
			return nil, err
		}
		return e, nil
	}
	return nil, fmt.Errorf("could not create an engine: %w: %v", ErrUnknownMode, cfg.Mode)
}

// Engine returns the engine of a service port (nil before its first
// Program).
func (n *Node) Engine(svc int) Engine {
	if svc < 0 || svc >= len(n.engines) {
		return nil
	}
	return n.engines[svc]
}

// Program installs a service port's rules at virtual time now, as the end
// of a sync does. For UDP service ports the conntrack entries of endpoints
// that left the rules are flushed, as kube-proxy's conntrack cleanup does;
// TCP entries stay.
func (n *Node) Program(svc int, r Rules, now int64) {
	n.program(svc, r, now, true)
}

// ProgramShared is Program for a caller whose r.Backends is never modified
// afterwards (the simulator's rendered versions, shared by every node): the
// node keeps the slice instead of a copy of it. At 30,000 Services × 100
// nodes the copies were a third of a mode's allocations.
func (n *Node) ProgramShared(svc int, r Rules, now int64) {
	n.program(svc, r, now, false)
}

// ReserveServices makes room for service ports 0..k-1: the slices of
// engines and rules are sized once, and engines are allocated in blocks of
// up to k.
func (n *Node) ReserveServices(k int) {
	switch {
	case len(n.engines) == 0 && k > 0:
		// The first reservation: from the arena, cleared. A quarter to
		// spare, so that a reused block fits the next node's count.
		n.engines = n.arena.engines.take(k, k+k/4)
		clear(n.engines)
		n.rules = n.arena.rules.take(k, k+k/4)
		clear(n.rules)
		for i := range n.rules {
			n.rules[i].Verdict = Reject
		}
	case k > len(n.engines):
		n.engines = append(n.engines, make([]Engine, k-len(n.engines))...)
		old := len(n.rules)
		n.rules = append(n.rules, make([]Rules, k-old)...)
		for i := old; i < k; i++ {
			n.rules[i].Verdict = Reject
		}
	}
	n.slabNext = max(n.slabNext, k)
}

// newEngine is NewEngine(n.cfg, n.rng), the engine taken from the node's
// current block.
func (n *Node) newEngine() Engine {
	size := min(max(n.slabNext, 16), 4096)
	switch n.cfg.Mode {
	case IPTables:
		e := &n.arena.ipt.take(1, size)[0]
		e.init(n.rng, n.cfg.IPTables)
		return e
	case NFTables:
		e := &n.arena.nft.take(1, size)[0]
		e.init(n.rng, n.cfg.NFTables)
		return e
	case IPVS:
		e := &n.arena.ipvs.take(1, size)[0]
		if err := e.init(n.rng, n.cfg.IPVS); err != nil {
			panic(err) // NewNode checked the scheduler
		}
		e.blocks = n.arena
		return e
	}
	panic(fmt.Sprintf("node %s: %v: %v", n.Name, ErrUnknownMode, n.cfg.Mode)) // NewNode checked the mode
}

func (n *Node) program(svc int, r Rules, now int64, copyBackends bool) {
	if svc >= len(n.engines) {
		n.ReserveServices(max(svc+1, 2*len(n.engines)))
	}
	e := n.engines[svc]
	if e == nil {
		e = n.newEngine()
		n.engines[svc] = e
	}
	if r.Proto == UDP || n.rules[svc].Proto == UDP {
		keep := make(map[int32]bool, len(r.Backends))
		if r.Verdict == Accept {
			for _, b := range r.Backends {
				keep[b.ID] = true
			}
		}
		for _, b := range n.rules[svc].Backends {
			if !keep[b.ID] {
				n.CT.FlushUDP(svc, b.ID, now)
			}
		}
	}
	if copyBackends {
		r.Backends = append([]Backend(nil), r.Backends...)
	}
	// r.Backends is now never modified: the engine may keep it.
	if sp, ok := e.(sharedProgrammer); ok {
		sp.programShared(r, now)
	} else {
		e.Program(r, now)
	}
	n.rules[svc] = r
}

// Rules returns the rules last programmed for a service port.
func (n *Node) Rules(svc int) Rules {
	if svc < 0 || svc >= len(n.rules) {
		return Rules{Verdict: Reject}
	}
	return n.rules[svc]
}

// Connect handles a new connection to a service port at virtual time now
// (c.End is when it ends). A live conntrack entry for the tuple decides
// first: UDP flows and open TCP flows follow it; a TCP connection reusing
// the tuple of a flow in TIME_WAIT is a new flow (conntrack replaces the
// entry). Otherwise the service port's engine decides and, on Accept, a
// conntrack entry is created. A service port never programmed rejects.
func (n *Node) Connect(svc int, c *Conn, now int64) Result {
	n.Stats.Connections++
	ct := n.CT
	key := ctKey(c)
	nowMs := msFloor(now)
	i, found := ct.lookup(key, uint32(svc), nowMs)
	if found {
		s := &ct.slots[i]
		if c.Proto == UDP || nowMs < s.endMs {
			ct.extend(i, c, nowMs)
			ct.Stats.Established++
			n.Stats.Established++
			return Result{Endpoint: s.ep, Verdict: Accept, Established: true}
		}
	}
	gen := ct.gen
	if !ct.room(nowMs) {
		ct.Stats.DroppedFull++
		n.Stats.Dropped++
		return Result{Endpoint: -1, Verdict: Drop}
	}
	if svc < 0 || svc >= len(n.engines) || n.engines[svc] == nil {
		n.Stats.Rejected++
		return Result{Endpoint: -1, Verdict: Reject}
	}
	ep, v := n.engines[svc].Choose(c, now)
	switch v {
	case Drop:
		n.Stats.Dropped++
		return Result{Endpoint: -1, Verdict: Drop}
	case Reject:
		n.Stats.Rejected++
		return Result{Endpoint: -1, Verdict: Reject}
	}
	if ct.gen != gen {
		// room() rebuilt the table: find the insertion slot again.
		i, _ = ct.lookup(key, uint32(svc), nowMs)
	}
	ct.put(i, key, uint32(svc), ep, c, nowMs)
	n.Stats.Accepted++
	return Result{Endpoint: ep, Verdict: Accept}
}
