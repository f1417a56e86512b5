package engine

// The IPVS engine reproduces one virtual server as kube-proxy programs it
// (pkg/proxy/ipvs/proxier.go, graceful_termination.go) and the Linux kernel
// runs it (net/netfilter/ipvs):
//
//   - real servers in the kernel's list order: __ip_vs_update_dest adds a new
//     dest at the head (list_add_rcu), and kube-proxy adds the endpoints of a
//     sync in set order, which is random; the engine shuffles each sync's new
//     endpoints with the node's random source and adds them at the head;
//   - every real server has weight 1 (kube-proxy); a removed endpoint with
//     TCP or SCTP connections left is kept with weight 0 (graceful
//     termination) and deleted at the first check (every minute) after its
//     connections are gone; UDP real servers are deleted at once;
//   - the schedulers rr, wrr, lc, wlc, sed, nq, sh, dh and mh as in
//     ip_vs_<name>.c (see ipvs_sched.go);
//   - persistence (sessionAffinity ClientIP: ipvsadm -p T): a template per
//     client address, refreshed by each new connection of that client,
//     re-armed while connections it controls still exist, and invalid once
//     its real server is quiesced (kube-proxy sets expire_quiescent_template);
//   - connection counters: a TCP connection is active while open and
//     inactive during TIME_WAIT; a UDP connection is inactive until its
//     timeout (dest conn_flags carry IP_VS_CONN_F_INACTIVE; only TCP state
//     changes make a connection active).

import (
	"errors"
	"fmt"
	"time"
)

// Scheduler is an IPVS scheduling algorithm.
type Scheduler uint8

// The schedulers kube-proxy accepts (lblc and lblcr are not modelled) plus mh.
const (
	RR Scheduler = iota
	WRR
	LC
	WLC
	SED
	NQ
	SH
	DH
	MH
)

var schedulerNames = [...]string{"rr", "wrr", "lc", "wlc", "sed", "nq", "sh", "dh", "mh"}

// ErrUnknownScheduler is wrapped by ParseScheduler's error.
var ErrUnknownScheduler = errors.New("unknown ipvs scheduler")

// ParseScheduler reads a scheduler name; "" means rr, as in kube-proxy.
func ParseScheduler(s string) (Scheduler, error) {
	if s == "" {
		return RR, nil
	}
	for i, n := range schedulerNames {
		if n == s {
			return Scheduler(i), nil
		}
	}
	return 0, fmt.Errorf("could not use ipvs scheduler %q: %w", s, ErrUnknownScheduler)
}

// String is the scheduler's ipvsadm name.
func (s Scheduler) String() string {
	if int(s) < len(schedulerNames) {
		return schedulerNames[s]
	}
	return fmt.Sprintf("Scheduler(%d)", uint8(s))
}

// IPVS defaults (kernel ip_vs_proto_tcp.c / ip_vs_proto_udp.c timeouts,
// kube-proxy graceful_termination.go rsCheckDeleteInterval, Kconfig
// IP_VS_MH_TAB_INDEX=12 → primes[4]).
const (
	DefaultIPVSTCPTimeWait   = 120 * time.Second
	DefaultIPVSUDPTimeout    = 300 * time.Second
	DefaultIPVSGracefulCheck = time.Minute
	DefaultIPVSMHTableSize   = 4093
)

const (
	ipvsSHTableSize      = 256
	ipvsMHTableBits      = 12 / 2 // CONFIG_IP_VS_MH_TAB_INDEX / 2
	ipvsDHHashMultiplier = 2654435761
	ipvsSHGoldenRatio32  = 0x61C88647 // include/linux/hash.h GOLDEN_RATIO_32
	ipvsMHHash1Key       = 2654435761 // generate_hash_secret in ip_vs_mh.c
	ipvsMHHash2Key       = 2654446892
)

// IPVSConfig tunes the IPVS engine.
type IPVSConfig struct {
	// Scheduler is the ipvsadm name ("" is rr).
	Scheduler string
	// MHTableSize is the Maglev table size, a prime from ip_vs_mh.c's list
	// (251 ... 131071); 0 means 4093, the kernel's default.
	MHTableSize int
	// TCPTimeWait, UDPTimeout and GracefulCheck default as above when 0.
	TCPTimeWait   time.Duration
	UDPTimeout    time.Duration
	GracefulCheck time.Duration
	// Fault, when FaultRotationStall, injects that bug (tests of the
	// checks only); other faults do not apply to this engine.
	Fault Fault
}

// IPVSStats counts what the IPVS engine did.
type IPVSStats struct {
	Scheduled    uint64
	TemplateHits uint64
	// NoDestination counts connections rejected because the scheduler found
	// no available real server.
	NoDestination uint64
}

type ipvsDest struct {
	id         int32
	ip         uint32
	port       uint16
	weight     int32
	lastWeight int32
	active     int32
	inactive   int32
	// lastGone is when the last connection bound to the dest disappears
	// from the IPVS table.
	lastGone int64
	graceful bool
	inList   bool
}

type ipvsTemplate struct {
	dest      *ipvsDest
	stamp     int64 // last new connection (the timer was re-armed then)
	busyUntil int64 // when the last connection it controls disappears
}

type ipvsEvent struct {
	t    int64
	d    *ipvsDest
	kind uint8 // evClose: active→inactive; evGone: inactive→gone
}

const (
	evClose uint8 = iota
	evGone
)

// IPVSEngine is one virtual server on one node.
type IPVSEngine struct {
	cfg   IPVSConfig
	sched Scheduler
	rng   *Rand

	verdict Verdict
	vip     uint32
	vport   uint16
	proto   Proto

	dests []*ipvsDest // the kernel's list, head first
	// known is every dest ever added (the kernel's trash reuses them):
	// a short list, and an index by ID once it grows past knownListMax.
	known     []*ipvsDest
	knownByID map[int32]*ipvsDest
	nGraceful int // quiesced dests awaiting deletion

	rrCur int // rr: index of the last dest chosen, -1 for the list head
	wrrCl int // wrr: mark->cl, -1 for the head
	wrrCw int32
	wrrMw int32
	wrrDi int32
	stall int // FaultRotationStall: scheduled connections counted

	// The sh and dh bucket tables, allocated for those schedulers only
	// (4 KiB each, and a node has one engine per service port).
	shTab *[ipvsSHTableSize]*ipvsDest
	dhTab *[ipvsSHTableSize]*ipvsDest
	mhTab []*ipvsDest

	persist   int64
	templates map[uint32]*ipvsTemplate
	sweepAt   int

	counts bool // keep active/inactive counters (lc, wlc, sed, nq)
	// blocks, when set, is where the engine's dests and dest lists are
	// carved from (its node's arena; see Node).
	blocks *Arena
	events []ipvsEvent

	// Stats are the engine's counters.
	Stats IPVSStats
}

// NewIPVS returns a virtual server without real servers.
func NewIPVS(rng *Rand, cfg IPVSConfig) (*IPVSEngine, error) {
	e := &IPVSEngine{}
	if err := e.init(rng, cfg); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *IPVSEngine) init(rng *Rand, cfg IPVSConfig) error {
	s, err := ParseScheduler(cfg.Scheduler)
	if err != nil {
		return err
	}
	if cfg.MHTableSize == 0 {
		cfg.MHTableSize = DefaultIPVSMHTableSize
	}
	if !isMHPrime(cfg.MHTableSize) {
		return fmt.Errorf("could not use mh table size %d: not one of ip_vs_mh.c's primes", cfg.MHTableSize)
	}
	if cfg.TCPTimeWait == 0 {
		cfg.TCPTimeWait = DefaultIPVSTCPTimeWait
	}
	if cfg.UDPTimeout == 0 {
		cfg.UDPTimeout = DefaultIPVSUDPTimeout
	}
	if cfg.GracefulCheck == 0 {
		cfg.GracefulCheck = DefaultIPVSGracefulCheck
	}
	*e = IPVSEngine{
		cfg: cfg, sched: s, rng: rng, verdict: Accept, proto: TCP,
		rrCur: -1, wrrCl: -1,
		counts: s == LC || s == WLC || s == SED || s == NQ,
	}
	switch s {
	case MH:
		e.mhTab = make([]*ipvsDest, cfg.MHTableSize)
	case SH:
		e.shTab = new([ipvsSHTableSize]*ipvsDest)
	case DH:
		e.dhTab = new([ipvsSHTableSize]*ipvsDest)
	}
	e.wrrChanged()
	return nil
}

func isMHPrime(n int) bool {
	for _, p := range []int{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071} {
		if p == n {
			return true
		}
	}
	return false
}

// Program applies a sync: new endpoints are added (in random order, each at
// the list head), removed ones deleted or quiesced, the persistence timeout
// set.
func (e *IPVSEngine) Program(r Rules, now int64) {
	e.advance(now)
	e.vip, e.vport, e.proto = r.VIP, r.VPort, r.Proto
	e.verdict = Accept
	if r.Verdict == Drop {
		e.verdict = Drop
	}
	e.persist = int64(r.AffinityTimeout)
	if e.persist > 0 && e.templates == nil {
		e.templates = map[uint32]*ipvsTemplate{}
	} else if e.persist <= 0 {
		e.templates = nil
	}
	want := wantedIDs(r.Backends)
	// Removed endpoints: quiesce or delete (GracefulDeleteRS).
	for i := 0; i < len(e.dests); i++ {
		d := e.dests[i]
		if want.has(d.id) {
			continue
		}
		if d.graceful {
			continue
		}
		if (e.proto == TCP || e.proto == SCTP) && d.lastGone > now {
			d.graceful = true
			e.nGraceful++
			e.setWeight(d, 0)
			continue
		}
		e.delDest(i)
		i--
	}
	// New endpoints, and quiesced ones coming back, which kube-proxy takes
	// out of the graceful list by deleting them before adding them again.
	var addBuf [16]Backend // on the stack for the usual few endpoints
	add := addBuf[:0]
	for _, b := range r.Backends {
		if d := e.knownDest(b.ID); d != nil && d.inList {
			if !d.graceful {
				continue
			}
			e.delDest(e.indexOf(d))
		}
		add = append(add, b)
	}
	e.rng.Shuffle(len(add), func(i, j int) { add[i], add[j] = add[j], add[i] })
	var fresh []ipvsDest // the new dests, allocated together
	// Each added dest goes to the head of the list (ip_vs_add_dest:
	// list_add_rcu), so the list becomes the added ones in reverse order
	// followed by the old ones, and the rr cursor moves on by one per add;
	// built in one pass (a prepend each was quadratic in the endpoints).
	e.dests = e.blocks.grow(e.dests, len(add))
	k, old := len(add), len(e.dests)
	e.dests = e.dests[:old+k]
	copy(e.dests[k:], e.dests[:old])
	for i, b := range add {
		d := e.knownDest(b.ID)
		if d == nil {
			if fresh == nil {
				fresh = e.blocks.destSlice(len(add))
				e.known = e.blocks.grow(e.known, len(add))
			}
			fresh = append(fresh, ipvsDest{id: b.ID, ip: b.IP, port: b.Port})
			d = &fresh[len(fresh)-1]
			e.addKnown(d)
		}
		d.weight, d.lastWeight, d.graceful, d.inList = 1, 1, false, true
		e.dests[k-1-i] = d
	}
	if e.rrCur >= 0 {
		e.rrCur += k
	}
	// ip_vs_wrr_dest_changed runs once per add in the kernel; once after
	// them all leaves the same state here: weights are 0 or 1, so the gcd
	// is 1, the maximum weight is the last list's, and each call sets the
	// current weight to that maximum whatever it was (0 or 1).
	if k > 0 {
		e.wrrChanged()
	}
	e.reassign()
}

// knownListMax is the number of known dests searched by a scan; past it
// they are indexed by ID.
const knownListMax = 32

// knownDest returns the dest ever added with that endpoint ID, or nil.
func (e *IPVSEngine) knownDest(id int32) *ipvsDest {
	if e.knownByID != nil {
		return e.knownByID[id]
	}
	for _, d := range e.known {
		if d.id == id {
			return d
		}
	}
	return nil
}

func (e *IPVSEngine) addKnown(d *ipvsDest) {
	e.known = append(e.known, d)
	if e.knownByID != nil {
		e.knownByID[d.id] = d
	} else if len(e.known) > knownListMax {
		e.knownByID = make(map[int32]*ipvsDest, 2*len(e.known))
		for _, k := range e.known {
			e.knownByID[k.id] = k
		}
	}
}

// idSet is the endpoint IDs of a sync's backends: a scan of the backends
// when they are few, a map otherwise.
type idSet struct {
	list []Backend
	m    map[int32]bool
}

func wantedIDs(bs []Backend) idSet {
	if len(bs) <= knownListMax {
		return idSet{list: bs}
	}
	m := make(map[int32]bool, len(bs))
	for _, b := range bs {
		m[b.ID] = true
	}
	return idSet{m: m}
}

func (s idSet) has(id int32) bool {
	if s.m != nil {
		return s.m[id]
	}
	for _, b := range s.list {
		if b.ID == id {
			return true
		}
	}
	return false
}

// advance applies what happened up to now: connection state changes and
// the deletion of drained quiesced real servers.
func (e *IPVSEngine) advance(now int64) {
	for len(e.events) > 0 && e.events[0].t <= now {
		ev := e.popEvent()
		if ev.kind == evClose {
			ev.d.active--
			ev.d.inactive++
		} else {
			ev.d.inactive--
		}
	}
	if e.nGraceful == 0 {
		return
	}
	changed := false
	for i := 0; i < len(e.dests); i++ {
		d := e.dests[i]
		if !d.graceful || e.nextCheck(d.lastGone) > now {
			continue
		}
		e.delDest(i)
		i--
		changed = true
	}
	if changed {
		e.reassign()
	}
}

// nextCheck is the first graceful-termination check at or after t.
func (e *IPVSEngine) nextCheck(t int64) int64 {
	iv := int64(e.cfg.GracefulCheck)
	if t <= 0 {
		return 0
	}
	return (t + iv - 1) / iv * iv
}

func (e *IPVSEngine) indexOf(d *ipvsDest) int {
	for i, x := range e.dests {
		if x == d {
			return i
		}
	}
	return -1
}

// delDest unlinks dest i (ip_vs_del_dest): rr moves its mark to the
// previous dest if it pointed there; wrr restarts; hash tables are rebuilt
// by the caller's reassign.
func (e *IPVSEngine) delDest(i int) {
	d := e.dests[i]
	if d.graceful {
		e.nGraceful--
	}
	d.inList = false
	d.graceful = false
	e.dests = append(e.dests[:i], e.dests[i+1:]...)
	switch {
	case e.rrCur == i:
		e.rrCur = i - 1
	case e.rrCur > i:
		e.rrCur--
	}
	e.wrrChanged()
}

func (e *IPVSEngine) setWeight(d *ipvsDest, w int32) {
	d.weight = w
	if w != 0 {
		d.lastWeight = w
	}
	e.wrrChanged()
	e.reassign()
}

// Choose schedules a new connection.
func (e *IPVSEngine) Choose(c *Conn, now int64) (int32, Verdict) {
	e.advance(now)
	if e.verdict != Accept {
		return -1, e.verdict
	}
	end := c.End
	if end < now {
		end = now
	}
	gone := end + int64(e.cfg.TCPTimeWait)
	if c.Proto == UDP {
		gone = end + int64(e.cfg.UDPTimeout)
	}
	var d *ipvsDest
	if e.persist > 0 {
		t := e.templates[c.SrcIP]
		if t != nil && e.templateValid(t, now) {
			d = t.dest
			t.stamp = now
			e.Stats.TemplateHits++
		} else {
			if d = e.schedule(c); d == nil {
				e.Stats.NoDestination++
				return -1, Reject
			}
			if t == nil {
				t = &ipvsTemplate{}
				e.templates[c.SrcIP] = t
				e.maybeSweep(now)
			}
			*t = ipvsTemplate{dest: d, stamp: now}
		}
		if gone > t.busyUntil {
			t.busyUntil = gone
		}
	} else if d = e.schedule(c); d == nil {
		e.Stats.NoDestination++
		return -1, Reject
	}
	e.Stats.Scheduled++
	if gone > d.lastGone {
		d.lastGone = gone
	}
	if e.counts {
		if c.Proto == UDP {
			d.inactive++
		} else {
			d.active++
			e.pushEvent(ipvsEvent{t: end, d: d, kind: evClose})
		}
		e.pushEvent(ipvsEvent{t: gone, d: d, kind: evGone})
	}
	return d.id, Accept
}

// templateValid is ip_vs_check_template plus the template's timer: the
// dest must still be in the list with a weight, and the timer (stamp + T,
// re-armed by T while controlled connections exist) must not have fired.
func (e *IPVSEngine) templateValid(t *ipvsTemplate, now int64) bool {
	if !t.dest.inList || t.dest.weight <= 0 {
		return false
	}
	return now < templateExpiry(t.stamp, t.busyUntil, e.persist)
}

func templateExpiry(stamp, busyUntil, timeout int64) int64 {
	exp := stamp + timeout
	if busyUntil > exp {
		k := (busyUntil - stamp + timeout - 1) / timeout
		exp = stamp + k*timeout
	}
	return exp
}

// maybeSweep drops expired templates when the map has doubled since the
// last sweep, so memory follows the number of live clients.
func (e *IPVSEngine) maybeSweep(now int64) {
	if len(e.templates) < 2*e.sweepAt+1024 {
		return
	}
	for ip, t := range e.templates {
		if now >= templateExpiry(t.stamp, t.busyUntil, e.persist) {
			delete(e.templates, ip)
		}
	}
	e.sweepAt = len(e.templates)
}

// DestInfo describes one real server, as ipvsadm -Ln lists it.
type DestInfo struct {
	ID       int32
	Weight   int32
	Active   int32
	Inactive int32
}

// Dests lists the real servers in the kernel's list order at time now.
func (e *IPVSEngine) Dests(now int64) []DestInfo {
	e.advance(now)
	out := make([]DestInfo, len(e.dests))
	for i, d := range e.dests {
		out[i] = DestInfo{ID: d.id, Weight: d.weight, Active: d.active, Inactive: d.inactive}
	}
	return out
}

// Templates is the number of persistence templates alive at now.
func (e *IPVSEngine) Templates(now int64) int {
	n := 0
	for _, t := range e.templates {
		if now < templateExpiry(t.stamp, t.busyUntil, e.persist) {
			n++
		}
	}
	return n
}

func (e *IPVSEngine) pushEvent(ev ipvsEvent) {
	h := append(e.events, ev)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p].t <= h[i].t {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	e.events = h
}

func (e *IPVSEngine) popEvent() ipvsEvent {
	h := e.events
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = ipvsEvent{}
	h = h[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h[l].t < h[m].t {
			m = l
		}
		if r < n && h[r].t < h[m].t {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	e.events = h
	return top
}
