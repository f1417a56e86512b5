package engine

// The iptables engine reproduces the KUBE-SVC chain kube-proxy writes
// (pkg/proxy/iptables/proxier.go, writeServiceToEndpointRules):
//
//	-A KUBE-SVC-X -m recent --name KUBE-SEP-i --rcheck --seconds T --reap -j KUBE-SEP-i   (affinity, one per endpoint)
//	-A KUBE-SVC-X -m statistic --mode random --probability 1/(n-i) -j KUBE-SEP-i          (i < n-1)
//	-A KUBE-SVC-X -j KUBE-SEP-(n-1)
//	-A KUBE-SEP-i -m recent --name KUBE-SEP-i --set ... -j DNAT                          (affinity)
//
// with the probability printed "%0.10f" (computeProbability), read back by
// iptables as lround(0x80000000 * p) (extensions/libxt_statistic.c) and
// matched by the kernel as (get_random_u32() & 0x7FFFFFFF) < q
// (net/netfilter/xt_statistic.c).
//
// Fidelity of the draw: the kernel draws a fresh 32-bit number for every
// statistic rule the packet reaches. So does Choose: one 31-bit draw per rule
// evaluated, compared with the same quantised threshold, so the chosen
// endpoint has exactly the kernel's distribution (including the 2^-31
// quantisation), only the generator differs (PCG instead of the kernel's
// ChaCha-based one). For speed the two 32-bit halves of one 64-bit PCG output
// serve two consecutive rules: PCG-DXSM's halves are independent uniform
// draws, so this changes nothing in distribution and halves the generator
// calls (a 10-endpoint cascade evaluates 5.4 rules on average).

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
)

// RecentListCapacity is xt_recent's ip_list_tot default: the number of
// addresses one recent list holds before it evicts the least recently seen
// (linux net/netfilter/xt_recent.c; fixed at module load).
const RecentListCapacity = 100

// ProbabilityString is kube-proxy's computeProbability(n):
// fmt.Sprintf("%0.10f", 1.0/float64(n)).
func ProbabilityString(n int) string { return fmt.Sprintf("%0.10f", 1.0/float64(n)) }

// ErrBadProbability is wrapped when a --probability value cannot be read.
var ErrBadProbability = errors.New("bad probability")

// ParseProbability reads a --probability value as iptables does
// (libxt_statistic: a double in [0, 1], stored as lround(0x80000000 * p)).
func ParseProbability(s string) (uint32, error) {
	p, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("could not parse probability %q: %w", s, errors.Join(ErrBadProbability, err))
	}
	if !(p >= 0 && p <= 1) {
		return 0, fmt.Errorf("could not use probability %q: %w: outside [0, 1]", s, ErrBadProbability)
	}
	return uint32(math.Round(0x80000000 * p)), nil // lround: half away from zero
}

// FormatProbability prints a kernel threshold as iptables-save does:
// "%.11f" of q / 0x80000000.
func FormatProbability(q uint32) string {
	return fmt.Sprintf("%.11f", float64(q)/0x80000000)
}

// CascadeThreshold is the kernel threshold of the rule that has n endpoints
// left to choose from: ParseProbability(ProbabilityString(n)).
func CascadeThreshold(n int) uint32 {
	if n <= 0 {
		return 0
	}
	thresholdsOnce.Do(initThresholds)
	if n < len(thresholds) {
		return thresholds[n]
	}
	q, _ := ParseProbability(ProbabilityString(n))
	return q
}

// Like kube-proxy's precomputedProbabilities, thresholds for up to 1000
// endpoints are computed once.
var (
	thresholdsOnce sync.Once
	thresholds     []uint32
	// descending is thresholds backwards (descending[len-1-n] =
	// thresholds[n]): a cascade's thresholds are a window of it.
	descending []uint32
)

func initThresholds() {
	thresholds = make([]uint32, 1001)
	descending = make([]uint32, len(thresholds))
	for n := 1; n < len(thresholds); n++ {
		q, err := ParseProbability(ProbabilityString(n))
		if err != nil {
			panic(err) // cannot happen: the string is a number in [0, 1]
		}
		thresholds[n] = q
		descending[len(descending)-1-n] = q
	}
}

// cascadeThresholds returns the thresholds of the statistic rules of an
// n-endpoint cascade, q(n), q(n-1), ..., q(2) (every one q(n) under
// FaultUniformProbability). Up to the precomputed size they are a window of
// one shared descending table, so programming a chain allocates nothing
// for them (a node has one chain per service port); past it (or with the
// fault) they are computed into a new slice. buf is the previous result.
func cascadeThresholds(buf []uint32, n int, uniform bool) []uint32 {
	if n < 2 {
		return buf[:0]
	}
	thresholdsOnce.Do(initThresholds)
	if !uniform && n < len(thresholds) {
		// descending[len-1-k] = q(k): q(n) is at len-1-n, q(2) at len-3.
		top := len(descending) - 1
		return descending[top-n : top-1 : top-1]
	}
	// A new slice: buf may be a window of the shared table.
	buf = make([]uint32, 0, n-1)
	for i := range n - 1 {
		left := n - i
		if uniform {
			left = n
		}
		buf = append(buf, CascadeThreshold(left))
	}
	return buf
}

// CascadeProbabilities returns the exact probability of each of n endpoints
// under the kernel's quantised cascade: rule i matches with q(n-i)/2^31 and
// the last rule always matches.
func CascadeProbabilities(n int) []float64 {
	out := make([]float64, n)
	reach := 1.0
	for i := 0; i < n-1; i++ {
		p := float64(CascadeThreshold(n-i)) / 0x80000000
		out[i] = reach * p
		reach *= 1 - p
	}
	if n > 0 {
		out[n-1] = reach
	}
	return out
}

// IPTablesConfig tunes the iptables engine.
type IPTablesConfig struct {
	// RecentCapacity is ip_list_tot; 0 means RecentListCapacity (100).
	RecentCapacity int
	// Fault, when FaultUniformProbability, injects that bug (tests of the
	// checks only); other faults do not apply to this engine.
	Fault Fault
}

// IPTablesStats counts what the iptables engine did.
type IPTablesStats struct {
	// AffinityHits counts new connections sent by a recent --rcheck rule.
	AffinityHits uint64
	// CascadeDecisions counts new connections decided by the statistic rules.
	CascadeDecisions uint64
	// RecentEvictedLive counts addresses evicted from a full recent list
	// while still inside the affinity timeout: each is a client whose
	// affinity the kernel silently forgot.
	RecentEvictedLive uint64
}

// IPTablesEngine is one service port's KUBE-SVC chain on one node.
type IPTablesEngine struct {
	rng     *Rand
	verdict Verdict
	bk      backendList
	q       []uint32 // thresholds of the statistic rules 0..n-2
	recent  *recentTable
	cfg     IPTablesConfig
	// Stats are the engine's counters.
	Stats IPTablesStats
}

// NewIPTables returns an engine with no rules (REJECT) drawing from rng.
func NewIPTables(rng *Rand, cfg IPTablesConfig) *IPTablesEngine {
	e := &IPTablesEngine{}
	e.init(rng, cfg)
	return e
}

func (e *IPTablesEngine) init(rng *Rand, cfg IPTablesConfig) {
	if cfg.RecentCapacity <= 0 {
		cfg.RecentCapacity = RecentListCapacity
	}
	*e = IPTablesEngine{rng: rng, verdict: Reject, cfg: cfg}
}

// Program rewrites the chain. Recent lists of endpoints that stay keep their
// entries; those of removed endpoints are destroyed with their rules.
func (e *IPTablesEngine) Program(r Rules, now int64) { e.program(r, now, true) }

func (e *IPTablesEngine) programShared(r Rules, now int64) { e.program(r, now, false) }

func (e *IPTablesEngine) program(r Rules, now int64, copyBackends bool) {
	e.verdict = r.Verdict
	if r.Verdict == Accept && len(r.Backends) == 0 {
		e.verdict = Reject
	}
	n := len(r.Backends)
	e.bk.set(r.Backends, copyBackends)
	e.q = cascadeThresholds(e.q, n, e.cfg.Fault == FaultUniformProbability)
	if r.AffinityTimeout <= 0 || e.verdict != Accept {
		e.recent = nil
		return
	}
	if e.recent == nil {
		e.recent = &recentTable{addrLists: newAddrLists(), capacity: int32(e.cfg.RecentCapacity)}
	}
	e.recent.seconds = int64(r.AffinityTimeout)
	e.recent.reset(r.Backends)
}

// Choose walks the chain for a new connection.
func (e *IPTablesEngine) Choose(c *Conn, now int64) (int32, Verdict) {
	if e.verdict != Accept {
		return -1, e.verdict
	}
	if e.recent != nil {
		if i := e.recent.check(c.SrcIP, now); i >= 0 {
			e.recent.set(int32(i), c.SrcIP, now, &e.Stats)
			e.Stats.AffinityHits++
			return e.bk.s[i].ID, Accept
		}
	}
	i := e.cascade()
	e.Stats.CascadeDecisions++
	if e.recent != nil {
		e.recent.set(int32(i), c.SrcIP, now, &e.Stats)
	}
	return e.bk.s[i].ID, Accept
}

// cascade evaluates the statistic rules in order: rule i matches when a
// fresh 31-bit draw is below its threshold; the last rule always matches.
func (e *IPTablesEngine) cascade() int {
	q := e.q
	src := e.rng.src
	var buf uint64
	half := false
	for i, t := range q {
		var r uint32
		if half {
			r = uint32(buf >> 32)
		} else {
			buf = src.Uint64()
			r = uint32(buf)
		}
		half = !half
		if r&0x7FFFFFFF < t {
			return i
		}
	}
	return len(q)
}

// Len is the number of endpoints in the chain.
func (e *IPTablesEngine) Len() int { return len(e.bk.s) }

// RecentEntries returns how many addresses each endpoint's recent list holds
// (expired ones included, as /proc/net/xt_recent shows them), in rule order.
func (e *IPTablesEngine) RecentEntries() []int {
	if e.recent == nil {
		return nil
	}
	out := make([]int, len(e.recent.lists))
	for i, l := range e.recent.lists {
		out[i] = int(l.n)
	}
	return out
}

// recentTable is the set of recent lists of one KUBE-SVC chain, one per
// endpoint position, with xt_recent's semantics (linux
// net/netfilter/xt_recent.c: recent_mt, recent_entry_init,
// recent_entry_update, recent_entry_reap).
type recentTable struct {
	addrLists
	capacity int32
	seconds  int64 // --seconds, ns
}

// check evaluates the --rcheck --seconds T --reap rules in endpoint order
// for a source address and returns the position of the first that matches,
// or -1. As in the kernel, a rule whose list does not hold the address does
// nothing; one whose list holds it (fresh or not) reaps that list's least
// recent entry if it is older than T; evaluation stops at the first match.
func (t *recentTable) check(ip uint32, now int64) int {
	h := t.first(ip)
	if h == -1 {
		return -1
	}
	horizon := now - t.seconds
	best := int32(-1)
	var lists [8]int32
	seen := lists[:0]
	for e := h; e != -1; e = t.ents[e].inext {
		en := &t.ents[e]
		seen = append(seen, en.list)
		if en.last >= horizon && (best == -1 || en.list < best) {
			best = en.list
		}
	}
	for _, l := range seen {
		if best != -1 && l > best {
			continue // rules after the match are not evaluated
		}
		if hd := t.lists[l].head; hd != -1 && t.ents[hd].last < horizon {
			t.remove(hd)
		}
	}
	return int(best)
}

// set is --set on list pos: refresh the address, or add it, evicting the
// least recently seen address if the list is full.
func (t *recentTable) set(pos int32, ip uint32, now int64, st *IPTablesStats) {
	if e := t.find(pos, ip); e != -1 {
		t.touch(e, now)
		return
	}
	l := &t.lists[pos]
	if l.n >= t.capacity {
		hd := l.head
		if t.ents[hd].last >= now-t.seconds {
			st.RecentEvictedLive++
		}
		t.remove(hd)
	}
	t.add(pos, ip, now)
}
