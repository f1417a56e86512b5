package engine

import (
	"slices"
	"testing"
	"time"
)

func newIPVS(t *testing.T, sched string, seed uint64) *IPVSEngine {
	t.Helper()
	e, err := NewIPVS(NewRandSeed(seed, 1), IPVSConfig{Scheduler: sched})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func listOrder(e *IPVSEngine, now int64) []int32 {
	var out []int32
	for _, d := range e.Dests(now) {
		out = append(out, d.ID)
	}
	return out
}

func TestParseScheduler(t *testing.T) {
	for _, s := range []string{"", "rr", "wrr", "lc", "wlc", "sed", "nq", "sh", "dh", "mh"} {
		if _, err := ParseScheduler(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	if _, err := ParseScheduler("lblc"); err == nil {
		t.Error("lblc accepted")
	}
	if _, err := NewIPVS(NewRandSeed(1, 1), IPVSConfig{Scheduler: "mh", MHTableSize: 1000}); err == nil {
		t.Error("mh table size 1000 accepted")
	}
}

func TestRRStrictRotation(t *testing.T) {
	e := newIPVS(t, "rr", 1)
	e.Program(acceptRules(5, 0), 0)
	order := listOrder(e, 0)
	if len(order) != 5 {
		t.Fatalf("list %v", order)
	}
	// The first connection goes to the first dest after the head, then on
	// round the list, whatever the clients.
	for i := range 50 {
		id, v := e.Choose(&Conn{SrcIP: uint32(i * 7919), Proto: TCP}, 0)
		if v != Accept || id != order[i%5] {
			t.Fatalf("connection %d went to %d (%v), rotation %v", i, id, v, order)
		}
	}
}

func TestRRKeepsPositionAcrossChanges(t *testing.T) {
	e := newIPVS(t, "rr", 2)
	r := acceptRules(3, 0)
	e.Program(r, 0)
	order := listOrder(e, 0) // say [a b c]
	a, _ := e.Choose(&Conn{}, 0)
	b, _ := e.Choose(&Conn{}, 0)
	if a != order[0] || b != order[1] {
		t.Fatalf("got %d %d, list %v", a, b, order)
	}
	// A new endpoint is added at the head: rotation continues with c, then
	// wraps to the new head.
	r.Backends = append(r.Backends, Backend{ID: 9, IP: 99, Port: 80})
	e.Program(r, 0)
	if got := listOrder(e, 0); got[0] != 9 {
		t.Fatalf("new dest not at the head: %v", got)
	}
	c, _ := e.Choose(&Conn{}, 0)
	d, _ := e.Choose(&Conn{}, 0)
	if c != order[2] || d != 9 {
		t.Errorf("after add: %d %d, want %d 9", c, d, order[2])
	}
	// Deleting the dest rr last chose moves its mark to the previous one
	// (the head here), so the rotation resumes at the next dest. (UDP: the
	// real server is deleted at once.)
	r.Proto = UDP
	r.Backends = slices.DeleteFunc(r.Backends, func(x Backend) bool { return x.ID == 9 })
	e.Program(r, 0)
	if got, _ := e.Choose(&Conn{Proto: UDP}, 0); got != order[0] {
		t.Errorf("after deleting the marked dest: %d, want %d", got, order[0])
	}
}

func TestWRRWithUnitWeightsRotatesAndRestarts(t *testing.T) {
	e := newIPVS(t, "wrr", 3)
	r := acceptRules(4, 0)
	e.Program(r, 0)
	order := listOrder(e, 0)
	for i := range 12 {
		if id, _ := e.Choose(&Conn{}, 0); id != order[i%4] {
			t.Fatalf("connection %d: %d, list %v", i, id, order)
		}
	}
	e.Choose(&Conn{}, 0)
	// Any change (ip_vs_wrr_dest_changed) restarts from the head.
	r.Backends = append(r.Backends, Backend{ID: 7, IP: 77, Port: 80})
	e.Program(r, 0)
	order = listOrder(e, 0)
	if id, _ := e.Choose(&Conn{}, 0); id != order[0] {
		t.Errorf("after change: %d, want the head %d", id, order[0])
	}
}

func TestWRRWeights(t *testing.T) {
	// Weights other than 1 (not set by kube-proxy, but the algorithm is the
	// kernel's): 4:3:2 gives the classic interleaving a a a b a b c b c.
	e := newIPVS(t, "wrr", 4)
	for i, w := range []int32{2, 3, 4} { // added at the head: list is 4,3,2
		d := &ipvsDest{id: int32(i), weight: w, lastWeight: w, inList: true}
		e.dests = append([]*ipvsDest{d}, e.dests...)
	}
	e.wrrChanged()
	var got []int32
	for range 9 {
		d := e.wrr()
		got = append(got, d.weight)
	}
	want := []int32{4, 4, 3, 4, 3, 2, 4, 3, 2}
	if !slices.Equal(got, want) {
		t.Errorf("weights chosen %v, want %v", got, want)
	}
}

func TestLeastConnectionFamily(t *testing.T) {
	for _, s := range []string{"lc", "wlc", "sed", "nq"} {
		e := newIPVS(t, s, 5)
		e.Program(acceptRules(3, 0), 0)
		order := listOrder(e, 0)
		// Long connections: each new one goes to the least loaded, ties to
		// the first in the list.
		for i := range 9 {
			id, _ := e.Choose(&Conn{Proto: TCP, End: 1000 * sec}, int64(i))
			if id != order[i%3] {
				t.Fatalf("%s: connection %d → %d, list %v", s, i, id, order)
			}
		}
		// The second dest's connections end: it is now the least loaded.
		e2 := newIPVS(t, s, 5)
		e2.Program(acceptRules(3, 0), 0)
		o := listOrder(e2, 0)
		e2.Choose(&Conn{Proto: TCP, End: 1000 * sec}, 0) // o[0]
		e2.Choose(&Conn{Proto: TCP, End: 1 * sec}, 0)    // o[1], ends at 1 s
		e2.Choose(&Conn{Proto: TCP, End: 1000 * sec}, 0) // o[2]
		e2.Choose(&Conn{Proto: TCP, End: 1000 * sec}, 0) // o[0] again
		id, _ := e2.Choose(&Conn{Proto: TCP, End: 1000 * sec}, 2*sec)
		if id != o[1] {
			t.Errorf("%s: after o[1]'s connection closed, chose %d, want %d", s, id, o[1])
		}
		if s == "lc" || s == "wlc" {
			// o[1] holds one TIME_WAIT (inactive) connection: overhead 1 vs 256.
			info := e2.Dests(2 * sec)
			for _, d := range info {
				if d.ID == o[1] && (d.Active != 1 || d.Inactive != 1) {
					t.Errorf("%s: counters %+v", s, d)
				}
			}
		}
	}
}

func TestNQPrefersIdle(t *testing.T) {
	e := newIPVS(t, "nq", 6)
	e.Program(acceptRules(3, 0), 0)
	o := listOrder(e, 0)
	for i := range 3 { // each idle dest in turn
		if id, _ := e.Choose(&Conn{Proto: TCP, End: 1000 * sec}, 0); id != o[i] {
			t.Fatalf("connection %d → %d, want idle %d", i, id, o[i])
		}
	}
	e.Choose(&Conn{Proto: TCP, End: 1000 * sec}, 0) // no idle dest: o[0] (tie, first)
	id, _ := e.Choose(&Conn{Proto: TCP, End: 1000 * sec}, 0)
	if id != o[1] {
		t.Errorf("chose %d, want %d (fewest active)", id, o[1])
	}
}

func TestSHHash(t *testing.T) {
	// hash_32(addr, 8) = (addr * 0x61C88647 mod 2^32) >> 24, and the dh hash
	// (addr * 2654435761) & 255, computed independently.
	for _, c := range []struct{ ip, sh, dh uint32 }{
		{0x0A000001, 39, 177}, {0x0A000002, 137, 98}, {0xC0A80001, 192, 177},
	} {
		if got := SHBucket(c.ip); got != c.sh {
			t.Errorf("sh %#x: %d, want %d", c.ip, got, c.sh)
		}
		if got := DHBucket(c.ip); got != c.dh {
			t.Errorf("dh %#x: %d, want %d", c.ip, got, c.dh)
		}
	}
}

func TestSHSendsASourceToOneDestination(t *testing.T) {
	e := newIPVS(t, "sh", 7)
	e.Program(acceptRules(5, 0), 0)
	perDest := map[int32]int{}
	for src := range 5000 {
		ip := 0x0A000000 + uint32(src)*2654435761>>8
		first, _ := e.Choose(&Conn{SrcIP: ip, SrcPort: 1000, Proto: TCP}, 0)
		for port := range 20 {
			if id, _ := e.Choose(&Conn{SrcIP: ip, SrcPort: uint16(2000 + port), Proto: TCP}, 0); id != first {
				t.Fatalf("source %#x went to %d then %d", ip, first, id)
			}
		}
		perDest[first]++
	}
	if len(perDest) != 5 {
		t.Errorf("sources reached %d destinations, want 5: %v", len(perDest), perDest)
	}
	// 256 buckets over 5 dests: 52, 51, 51, 51, 51.
	buckets := map[int32]int{}
	for _, d := range e.shTab {
		buckets[d.id]++
	}
	counts := []int{}
	for _, n := range buckets {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	if !slices.Equal(counts, []int{51, 51, 51, 51, 52}) {
		t.Errorf("bucket counts %v", counts)
	}
}

func TestSHQuiescedDestRejects(t *testing.T) {
	e := newIPVS(t, "sh", 8)
	r := acceptRules(2, 0)
	e.Program(r, 0)
	// A live TCP connection keeps the removed endpoint as weight 0.
	var victim int32 = -1
	var ip uint32
	for src := uint32(1); victim < 0; src++ {
		if id, _ := e.Choose(&Conn{SrcIP: src, Proto: TCP, End: 100 * sec}, 0); id == 0 {
			victim, ip = id, src
		}
	}
	r.Backends = r.Backends[1:]
	e.Program(r, sec)
	if _, v := e.Choose(&Conn{SrcIP: ip, Proto: TCP}, 2*sec); v != Reject {
		t.Errorf("source hashed to a quiesced dest: %v, want REJECT (no sh-fallback)", v)
	}
	// Once drained (100 s + TIME_WAIT 120 s, then the next minute check) it
	// is deleted and the table reassigned.
	if _, v := e.Choose(&Conn{SrcIP: ip, Proto: TCP}, 300*sec); v != Accept {
		t.Errorf("after deletion: %v", v)
	}
	if got := listOrder(e, 300*sec); !slices.Equal(got, []int32{1}) {
		t.Errorf("list %v", got)
	}
}

func TestDHSendsEverythingToOneDestination(t *testing.T) {
	e := newIPVS(t, "dh", 9)
	e.Program(acceptRules(4, 0), 0)
	first, _ := e.Choose(&Conn{SrcIP: 1}, 0)
	for i := range 1000 {
		if id, _ := e.Choose(&Conn{SrcIP: uint32(i) * 7777, SrcPort: uint16(i)}, 0); id != first {
			t.Fatalf("dh chose %d and %d", first, id)
		}
	}
}

func TestMHTable(t *testing.T) {
	for _, size := range []int{251, 4093} {
		e, err := NewIPVS(NewRandSeed(1, 2), IPVSConfig{Scheduler: "mh", MHTableSize: size})
		if err != nil {
			t.Fatal(err)
		}
		r := acceptRules(7, 0)
		e.Program(r, 0)
		before := e.MHTable()
		counts := map[int32]int{}
		for _, id := range before {
			counts[id]++
		}
		// Equal weights: every dest claims one slot per round.
		lo, hi := size/7, (size+6)/7
		for id, n := range counts {
			if n < lo || n > hi || id < 0 {
				t.Errorf("size %d: dest %d owns %d slots, want %d..%d", size, id, n, lo, hi)
			}
		}
		// Consistent hashing: removing one dest (UDP: deleted at once)
		// keeps most slots of the others.
		r.Proto = UDP
		e.Program(r, 0)
		r.Backends = r.Backends[:6]
		e.Program(r, 0)
		after := e.MHTable()
		kept, others := 0, 0
		for i := range before {
			if before[i] == 6 {
				if after[i] == 6 {
					t.Fatalf("removed dest still in slot %d", i)
				}
				continue
			}
			others++
			if after[i] == before[i] {
				kept++
			}
		}
		if frac := float64(kept) / float64(others); frac < 0.85 {
			t.Errorf("size %d: only %.2f of the other slots kept their dest", size, frac)
		}
	}
}

func TestMHHashesSourcePort(t *testing.T) {
	e := newIPVS(t, "mh", 10)
	e.Program(acceptRules(5, 0), 0)
	seen := map[int32]bool{}
	for port := range 200 {
		c := &Conn{SrcIP: 0x0A000005, SrcPort: uint16(40000 + port)}
		id, _ := e.Choose(c, 0)
		again, _ := e.Choose(c, 0)
		if id != again {
			t.Fatalf("same tuple, two dests")
		}
		if want := e.mhTab[MHBucket(c.SrcIP, c.SrcPort, len(e.mhTab))].id; id != want {
			t.Fatalf("dest %d, table says %d", id, want)
		}
		seen[id] = true
	}
	if len(seen) != 5 {
		t.Errorf("one client's ports reached %d dests, want 5 (kube-proxy sets mh-port)", len(seen))
	}
}

func TestPersistenceTemplate(t *testing.T) {
	e := newIPVS(t, "rr", 11)
	e.Program(acceptRules(3, 10*time.Second), 0)
	const client = 0x0A000002
	first, _ := e.Choose(&Conn{SrcIP: client, Proto: TCP, End: 1 * sec}, 0)
	// Other clients move the rotation on (their templates die at 121 s).
	for k := range 5 {
		e.Choose(&Conn{SrcIP: uint32(100 + k), Proto: TCP}, sec)
	}
	// The connection ended at 1 s and sits in TIME_WAIT until 121 s; the
	// template (timeout 10 s) is re-armed every 10 s while it controls a
	// connection: it lives until 130 s, not 10 s (kubernetes#89358).
	tp := e.templates[client]
	if !e.templateValid(tp, 129*sec) || e.templateValid(tp, 130*sec) {
		t.Errorf("template should live until 130 s: %+v", *tp)
	}
	if id, _ := e.Choose(&Conn{SrcIP: client, SrcPort: 2, Proto: TCP, End: 50 * sec}, 50*sec); id != first {
		t.Fatalf("at 50 s the client moved from %d to %d", first, id)
	}
	// Re-stamped at 50 s, controlling a connection gone at 170 s: expires at
	// 50 + 12*10 = 170 s.
	if exp := templateExpiry(tp.stamp, tp.busyUntil, e.persist); exp != 170*sec {
		t.Errorf("template expiry %d s, want 170 s", exp/sec)
	}
	if a, b := e.Templates(169*sec), e.Templates(400*sec); a != 1 || b != 0 {
		t.Errorf("templates alive: %d at 169 s, %d at 400 s; want 1 and 0", a, b)
	}
	if e.Stats.TemplateHits != 1 {
		t.Errorf("template hits %d", e.Stats.TemplateHits)
	}
	// After expiry the client is scheduled afresh: rr hands it the next dest.
	order := listOrder(e, 400*sec)
	want := order[(e.rrCur+1)%3]
	id, _ := e.Choose(&Conn{SrcIP: client, SrcPort: 3, Proto: TCP}, 400*sec)
	if id != want {
		t.Errorf("after expiry: %d, want the rotation's %d", id, want)
	}
}

func TestPersistenceQuiescedDest(t *testing.T) {
	// expire_quiescent_template: a template whose dest got weight 0 is
	// dropped, so the client goes elsewhere at once.
	e := newIPVS(t, "rr", 12)
	r := acceptRules(2, time.Hour)
	e.Program(r, 0)
	c := &Conn{SrcIP: 5, Proto: TCP, End: 1000 * sec}
	first, _ := e.Choose(c, 0)
	r.Backends = slices.DeleteFunc(r.Backends, func(b Backend) bool { return b.ID == first })
	e.Program(r, sec)
	if got := e.Dests(sec); len(got) != 2 {
		t.Fatalf("graceful dest gone: %+v", got)
	}
	id, v := e.Choose(&Conn{SrcIP: 5, SrcPort: 2, Proto: TCP}, 2*sec)
	if v != Accept || id == first {
		t.Errorf("client kept a quiesced dest: %d %v", id, v)
	}
}

func TestGracefulDeletion(t *testing.T) {
	e := newIPVS(t, "rr", 13)
	r := acceptRules(2, 0)
	e.Program(r, 0)
	id, _ := e.Choose(&Conn{Proto: TCP, End: 30 * sec}, 0)
	r.Backends = slices.DeleteFunc(r.Backends, func(b Backend) bool { return b.ID == id })
	e.Program(r, sec)
	d := e.Dests(sec)
	if len(d) != 2 {
		t.Fatalf("dests %+v", d)
	}
	for range 10 {
		if got, _ := e.Choose(&Conn{Proto: TCP}, 2*sec); got == id {
			t.Fatal("new connection to a quiesced dest")
		}
	}
	// Gone at 30 + 120 = 150 s; the next check is at 180 s.
	if n := len(e.Dests(179 * sec)); n != 2 {
		t.Errorf("deleted before the check: %d dests", n)
	}
	if n := len(e.Dests(180 * sec)); n != 1 {
		t.Errorf("not deleted at the check: %d dests", n)
	}
	// UDP real servers go at once.
	u := newIPVS(t, "rr", 14)
	ru := acceptRules(2, 0)
	ru.Proto = UDP
	u.Program(ru, 0)
	u.Choose(&Conn{Proto: UDP, End: 30 * sec}, 0)
	ru.Backends = ru.Backends[:1]
	u.Program(ru, sec)
	if n := len(u.Dests(sec)); n != 1 {
		t.Errorf("udp dests %d", n)
	}
}

func TestIPVSNoDestination(t *testing.T) {
	e := newIPVS(t, "rr", 15)
	if _, v := e.Choose(&Conn{}, 0); v != Reject {
		t.Errorf("empty virtual server: %v", v)
	}
	e.Program(Rules{Verdict: Reject}, 0)
	if _, v := e.Choose(&Conn{}, 0); v != Reject {
		t.Errorf("no endpoints: %v", v)
	}
}

func TestIPVSShuffledInsertionIsSeeded(t *testing.T) {
	a, b := newIPVS(t, "rr", 16), newIPVS(t, "rr", 16)
	a.Program(acceptRules(8, 0), 0)
	b.Program(acceptRules(8, 0), 0)
	if !slices.Equal(listOrder(a, 0), listOrder(b, 0)) {
		t.Error("same seed, different list order")
	}
}
