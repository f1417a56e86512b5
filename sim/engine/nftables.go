package engine

// The nftables engine reproduces kube-proxy's service chain
// (pkg/proxy/nftables/proxier.go):
//
//	ip saddr @affinity-<ep i> goto endpoint-<ep i>        (affinity, one per endpoint, in order)
//	numgen random mod N vmap { 0 : goto endpoint-0, ... }
//	endpoint-i: update @affinity-<ep i> { ip saddr }; dnat to ...
//
// numgen random is net/netfilter/nft_numgen.c nft_ng_random_gen:
// reciprocal_scale(get_random_u32(), N) = (u64(r) * N) >> 32, one 32-bit draw
// per connection, so Choose draws exactly that. The affinity sets are
// `flags dynamic,timeout; timeout T`: an element matches until T after its
// last `update`, which refreshes it (nft_dynset.c).

// NFTablesConfig tunes the nftables engine.
type NFTablesConfig struct {
	// AffinitySetSize caps each affinity set; 0 means unlimited. kube-proxy
	// declares no size; when a dynamic set is full, `update` adds nothing
	// and the dnat still happens.
	AffinitySetSize int
	// Fault, when FaultMovedBucket, injects that bug (tests of the checks
	// only); other faults do not apply to this engine.
	Fault Fault
}

// NFTablesStats counts what the nftables engine did.
type NFTablesStats struct {
	AffinityHits uint64
	// NumgenDecisions counts connections decided by numgen.
	NumgenDecisions uint64
	// SetFull counts updates that could not add an element to a full set.
	SetFull uint64
}

// NFTablesEngine is one service port's service chain on one node.
type NFTablesEngine struct {
	rng     *Rand
	verdict Verdict
	bk      backendList
	n       uint64
	sets    *timeoutSets
	cfg     NFTablesConfig
	// Stats are the engine's counters.
	Stats NFTablesStats
}

// NewNFTables returns an engine with no rules (REJECT) drawing from rng.
func NewNFTables(rng *Rand, cfg NFTablesConfig) *NFTablesEngine {
	e := &NFTablesEngine{}
	e.init(rng, cfg)
	return e
}

func (e *NFTablesEngine) init(rng *Rand, cfg NFTablesConfig) {
	*e = NFTablesEngine{rng: rng, verdict: Reject, cfg: cfg}
}

// Program rewrites the service chain. Affinity sets of endpoints that stay
// keep their elements; stale sets are deleted.
func (e *NFTablesEngine) Program(r Rules, now int64) { e.program(r, now, true) }

func (e *NFTablesEngine) programShared(r Rules, now int64) { e.program(r, now, false) }

func (e *NFTablesEngine) program(r Rules, now int64, copyBackends bool) {
	e.verdict = r.Verdict
	if r.Verdict == Accept && len(r.Backends) == 0 {
		e.verdict = Reject
	}
	e.bk.set(r.Backends, copyBackends)
	e.n = uint64(len(e.bk.s))
	if r.AffinityTimeout <= 0 || e.verdict != Accept {
		e.sets = nil
		return
	}
	if e.sets == nil {
		e.sets = &timeoutSets{addrLists: newAddrLists(), size: int32(e.cfg.AffinitySetSize)}
	}
	e.sets.timeout = int64(r.AffinityTimeout)
	e.sets.reset(r.Backends)
}

// Choose runs the service chain for a new connection.
func (e *NFTablesEngine) Choose(c *Conn, now int64) (int32, Verdict) {
	if e.verdict != Accept {
		return -1, e.verdict
	}
	if e.sets != nil {
		if i := e.sets.lookup(c.SrcIP, now); i >= 0 {
			e.sets.update(int32(i), c.SrcIP, now, &e.Stats)
			e.Stats.AffinityHits++
			return e.bk.s[i].ID, Accept
		}
	}
	i := (uint64(uint32(e.rng.src.Uint64()>>32)) * e.n) >> 32
	if e.cfg.Fault == FaultMovedBucket && e.n > 1 && i == e.n-1 {
		i = 0
	}
	e.Stats.NumgenDecisions++
	if e.sets != nil {
		e.sets.update(int32(i), c.SrcIP, now, &e.Stats)
	}
	return e.bk.s[i].ID, Accept
}

// Len is the number of endpoints in the vmap.
func (e *NFTablesEngine) Len() int { return len(e.bk.s) }

// timeoutSets are the affinity sets of one service chain, one per endpoint
// position.
type timeoutSets struct {
	addrLists
	timeout int64
	size    int32
}

// lookup returns the position of the first set (in rule order) holding ip
// with an unexpired timeout, or -1.
func (s *timeoutSets) lookup(ip uint32, now int64) int {
	best := int32(-1)
	for e := s.first(ip); e != -1; e = s.ents[e].inext {
		en := &s.ents[e]
		if now < en.last+s.timeout && (best == -1 || en.list < best) {
			best = en.list
		}
	}
	return int(best)
}

// update is `update @set { ip saddr }`: refresh the element's timeout or add
// it. Expired elements at the head of the set are collected first, as the
// set's garbage collector would have.
func (s *timeoutSets) update(pos int32, ip uint32, now int64, st *NFTablesStats) {
	l := &s.lists[pos]
	for l.head != -1 && now >= s.ents[l.head].last+s.timeout {
		s.remove(l.head)
	}
	if e := s.find(pos, ip); e != -1 {
		s.touch(e, now)
		return
	}
	if s.size > 0 && l.n >= s.size {
		st.SetFull++
		return
	}
	s.add(pos, ip, now)
}
