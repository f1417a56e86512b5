package engine

// Conntrack is one node's connection tracking table. The first packet of a
// flow is NATed by the rules and creates an entry; every later packet of
// the flow, and a new "connection" that reuses a live entry's tuple, follows
// the entry without consulting the rules. So an established flow keeps its
// endpoint however the rules change, until it ends and its entry times out.
//
// What kube-proxy does on endpoint removal: nothing for TCP (flows to a
// removed endpoint carry on until they end; see FlushUDP for UDP, whose
// entries kube-proxy deletes: pkg/proxy/conntrack, CleanStaleEntries).
//
// Layout: open addressing with linear probing over 24-byte slots keyed by
// (source address, source port, protocol) and the service port (which
// stands for the destination VIP:port of the kernel's tuple). Deadlines are
// stored in milliseconds of virtual time (the kernel counts jiffies, 1-4
// ms), which caps a simulation at 49 days. Expired entries are reclaimed
// lazily: an insertion reuses an expired slot on its probe path, and when
// half of the slots are taken a sequential in-place sweep removes the
// expired ones; the table doubles when more than a third of it is live.
// Memory: 24 bytes per slot, 72-144 bytes per live entry.

import (
	"math/bits"
	"time"
)

// Conntrack defaults (kernel sysctls net.netfilter.nf_conntrack_*).
const (
	DefaultTCPTimeWait = 120 * time.Second // nf_conntrack_tcp_timeout_time_wait
	DefaultUDPTimeout  = 30 * time.Second  // nf_conntrack_udp_timeout
)

// ConntrackConfig sets the table's timeouts and size.
type ConntrackConfig struct {
	// TCPTimeWait is how long a TCP entry outlives the end of its flow.
	TCPTimeWait time.Duration
	// UDPTimeout is how long a UDP entry outlives the flow's last packet
	// (use nf_conntrack_udp_timeout_stream, 120 s, for long-lived streams).
	UDPTimeout time.Duration
	// Max is nf_conntrack_max: new flows are dropped while this many entries
	// are alive. 0 means unlimited. (The kernel's early_drop of
	// unassured entries is not modelled.)
	Max int
}

// ConntrackStats counts the table's work.
type ConntrackStats struct {
	Inserted    uint64
	Established uint64 // packets of a new connection that matched a live entry
	Flushed     uint64
	DroppedFull uint64
	Sweeps      uint64
	Grows       uint64
	// PeakLive is the most live entries a sweep counted.
	PeakLive int
}

type ctSlot struct {
	key   uint64 // 0: empty; else ip<<32 | port<<16 | proto<<8 | 1
	svc   uint32
	ep    int32
	endMs uint32 // flow end
	expMs uint32 // entry deadline
}

// Conntrack is a connection tracking table; not safe for concurrent use.
type Conntrack struct {
	slots   []ctSlot
	shift   uint
	used    int // non-empty slots, expired ones included
	cfg     ConntrackConfig
	tcpWait uint32
	udpWait uint32
	fullMs  uint32 // while now < fullMs the table is known to be full
	gen     uint32 // incremented whenever slots move (sweep, grow)
	// Stats are the table's counters.
	Stats ConntrackStats
}

// conntrackDefaults fills the timeouts a configuration leaves unset.
func conntrackDefaults(cfg ConntrackConfig) ConntrackConfig {
	if cfg.TCPTimeWait <= 0 {
		cfg.TCPTimeWait = DefaultTCPTimeWait
	}
	if cfg.UDPTimeout <= 0 {
		cfg.UDPTimeout = DefaultUDPTimeout
	}
	return cfg
}

// NewConntrack returns an empty table.
func NewConntrack(cfg ConntrackConfig) *Conntrack {
	cfg = conntrackDefaults(cfg)
	const c = 1 << 10
	return &Conntrack{
		slots: make([]ctSlot, c), shift: 64 - 10, cfg: cfg,
		tcpWait: uint32(cfg.TCPTimeWait / time.Millisecond),
		udpWait: uint32(cfg.UDPTimeout / time.Millisecond),
	}
}

func msFloor(ns int64) uint32 {
	if ns <= 0 {
		return 0
	}
	return uint32(ns / 1e6)
}

func msCeil(ns int64) uint32 {
	if ns <= 0 {
		return 0
	}
	return uint32((ns + 999_999) / 1e6)
}

func ctKey(c *Conn) uint64 {
	return uint64(c.SrcIP)<<32 | uint64(c.SrcPort)<<16 | uint64(c.Proto)<<8 | 1
}

func (t *Conntrack) home(key uint64, svc uint32) uint64 {
	x := key*0x9E3779B97F4A7C15 ^ uint64(svc)*0xC2B2AE3D27D4EB4F
	x ^= x >> 29
	return (x * 0xBF58476D1CE4E5B9) >> t.shift
}

// lookup finds the live entry of a tuple (found), or else the slot where a
// new entry for it goes: its own expired entry, the first expired slot on
// its probe path, or the empty slot that ends the path.
func (t *Conntrack) lookup(key uint64, svc uint32, nowMs uint32) (int, bool) {
	mask := uint64(len(t.slots) - 1)
	reuse := -1
	for i := t.home(key, svc); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == 0 {
			if reuse >= 0 {
				return reuse, false
			}
			return int(i), false
		}
		live := nowMs < s.expMs
		if s.key == key && s.svc == svc {
			if live {
				return int(i), true
			}
			return int(i), false
		}
		if !live && reuse < 0 {
			reuse = int(i)
		}
	}
}

// wait is how long an entry outlives its flow.
func (t *Conntrack) wait(p Proto) uint32 {
	if p == UDP {
		return t.udpWait
	}
	return t.tcpWait
}

// put writes an entry at slot i (from lookup) and cleans or grows the
// table when needed.
func (t *Conntrack) put(i int, key uint64, svc uint32, ep int32, c *Conn, nowMs uint32) {
	s := &t.slots[i]
	if s.key == 0 {
		t.used++
	}
	end := msCeil(c.End)
	if end < nowMs {
		end = nowMs
	}
	*s = ctSlot{key: key, svc: svc, ep: ep, endMs: end, expMs: end + t.wait(c.Proto)}
	t.Stats.Inserted++
	if t.used*2 > len(t.slots) {
		t.maintain(nowMs)
	}
}

// maintain sweeps out expired entries and doubles the table while more
// than a third of it is live, so probes stay short (load <= 1/2).
func (t *Conntrack) maintain(nowMs uint32) (live int, next uint32) {
	live, next = t.sweep(nowMs)
	if live*3 > len(t.slots) {
		t.grow(nowMs)
	}
	return live, next
}

// extend prolongs a live entry by a later flow on the same tuple, seen at
// nowMs.
func (t *Conntrack) extend(i int, c *Conn, nowMs uint32) {
	s := &t.slots[i]
	end := msCeil(c.End)
	if end < nowMs {
		end = nowMs
	}
	if end > s.endMs {
		s.endMs = end
		s.expMs = end + t.wait(c.Proto)
	}
}

// room reports whether a new entry may be created under Max. When the
// slots in use reach Max it sweeps to count the live entries; if the table
// is full it stays full, without further sweeps, until the earliest live
// entry expires or a flush frees some.
func (t *Conntrack) room(nowMs uint32) bool {
	if t.cfg.Max <= 0 || t.used < t.cfg.Max {
		return true
	}
	if nowMs < t.fullMs {
		return false
	}
	live, next := t.maintain(nowMs)
	if live < t.cfg.Max {
		return true
	}
	t.fullMs = next
	return false
}

// sweep removes expired entries in place, cluster by cluster (a cluster is
// a run of occupied slots between empty ones): the live entries of a
// cluster that holds an expired one are taken out and put back from their
// home slots, in their old order, which keeps every probe path intact. The
// walk is sequential, so it costs a pass over memory, not a cache miss per
// entry. It returns the live count and the earliest live deadline.
func (t *Conntrack) sweep(nowMs uint32) (live int, next uint32) {
	t.Stats.Sweeps++
	t.gen++
	next = ^uint32(0)
	n := len(t.slots)
	mask := n - 1
	start := 0
	for t.slots[start].key != 0 {
		start++ // the load is below 1: there is an empty slot
	}
	var keep []ctSlot
	for off := 1; off < n; {
		a := (start + off) & mask
		if t.slots[a].key == 0 {
			off++
			continue
		}
		// The cluster runs from a to the next empty slot.
		length, expired := 0, false
		for t.slots[(a+length)&mask].key != 0 {
			if nowMs >= t.slots[(a+length)&mask].expMs {
				expired = true
			}
			length++
		}
		off += length
		if !expired {
			for k := 0; k < length; k++ {
				s := &t.slots[(a+k)&mask]
				live++
				next = min(next, s.expMs)
			}
			continue
		}
		keep = keep[:0]
		for k := 0; k < length; k++ {
			j := (a + k) & mask
			if s := t.slots[j]; nowMs < s.expMs {
				keep = append(keep, s)
				live++
				next = min(next, s.expMs)
			}
			t.slots[j] = ctSlot{}
		}
		for _, s := range keep {
			j := int(t.home(s.key, s.svc))
			for t.slots[j].key != 0 {
				j = (j + 1) & mask
			}
			t.slots[j] = s
		}
	}
	t.used = live
	if live > t.Stats.PeakLive {
		t.Stats.PeakLive = live
	}
	return live, next
}

// grow rehashes the (swept) table into one twice as large.
func (t *Conntrack) grow(nowMs uint32) {
	t.Stats.Grows++
	t.resize(2*len(t.slots), nowMs)
}

// resize rehashes the live entries into a table of size slots (a power of
// two).
func (t *Conntrack) resize(size int, nowMs uint32) {
	t.gen++
	old := t.slots
	t.slots = make([]ctSlot, size)
	adviseHuge(t.slots)
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	mask := uint64(len(t.slots) - 1)
	t.used = 0
	for i := range old {
		s := &old[i]
		if s.key == 0 || nowMs >= s.expMs {
			continue
		}
		j := t.home(s.key, s.svc)
		for t.slots[j].key != 0 {
			j = (j + 1) & mask
		}
		t.slots[j] = *s
		t.used++
	}
}

// Reserve sizes the table so that n live entries stay under half load:
// no sweep and no rehash until more are inserted. It is a hint for a
// simulator that knows its connection count (growing by doubling from
// 1024 slots to millions costs a rehash per doubling and a sweep before
// each); a call that would shrink the table does nothing. Entries live at
// now are kept.
func (t *Conntrack) Reserve(n int, now int64) {
	size := len(t.slots)
	for size/2 <= n {
		size *= 2
	}
	if size > len(t.slots) {
		t.resize(size, msFloor(now))
	}
}

// Reset empties the table and its counters, keeping its size and
// configuration, so that a simulator can reuse one table for another
// node's run instead of allocating (and having the kernel fault in) a new
// one.
func (t *Conntrack) Reset() {
	clear(t.slots)
	t.used, t.fullMs = 0, 0
	t.gen++
	t.Stats = ConntrackStats{}
}

// Lookup returns the endpoint of a live entry for the connection's tuple.
func (t *Conntrack) Lookup(svc int, c *Conn, now int64) (int32, bool) {
	i, ok := t.lookup(ctKey(c), uint32(svc), msFloor(now))
	if !ok {
		return -1, false
	}
	return t.slots[i].ep, true
}

// FlushUDP deletes the live UDP entries of a service port whose endpoint is
// ep (ep < 0: all of the service port's UDP entries), as kube-proxy's
// conntrack cleanup does after a sync that removed the endpoint, and
// returns how many it deleted.
func (t *Conntrack) FlushUDP(svc int, ep int32, now int64) int {
	nowMs := msFloor(now)
	n := 0
	for i := range t.slots {
		s := &t.slots[i]
		if s.key == 0 || s.svc != uint32(svc) || Proto(s.key>>8) != UDP || nowMs >= s.expMs {
			continue
		}
		if ep >= 0 && s.ep != ep {
			continue
		}
		s.expMs = 0 // expired: reclaimed lazily
		n++
	}
	t.Stats.Flushed += uint64(n)
	t.fullMs = 0
	return n
}

// Len counts the live entries at now (a scan of the table).
func (t *Conntrack) Len(now int64) int {
	nowMs := msFloor(now)
	n := 0
	for i := range t.slots {
		if t.slots[i].key != 0 && nowMs < t.slots[i].expMs {
			n++
		}
	}
	return n
}

// Bytes is the memory the table's slots take.
func (t *Conntrack) Bytes() int { return len(t.slots) * 24 }
