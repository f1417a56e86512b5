package engine

import (
	"math/rand/v2"
	"testing"
	"time"
)

// Benchmarks of new-connection decisions. Each reports conns/s (per core:
// the benchmarks are single-threaded). Run with
//
//	go test -run '^$' -bench . -benchtime 2000000x -count 5 ./sim/engine/

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
}

// BenchmarkNaiveCascade10 is the floor the design measured: a 10-endpoint
// cascade drawing a float64 per rule from a math/rand/v2 PCG through
// *rand.Rand (41 M/s there).
func BenchmarkNaiveCascade10(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	probs := make([]float64, 10)
	for i := range probs {
		probs[i] = 1 / float64(10-i)
	}
	sink := 0
	for b.Loop() {
		i := 0
		for ; i < 9; i++ {
			if r.Float64() < probs[i] {
				break
			}
		}
		sink += i
	}
	_ = sink
	reportRate(b)
}

func BenchmarkIPTablesChoose10(b *testing.B) {
	e := NewIPTables(NewRandSeed(1, 2), IPTablesConfig{})
	e.Program(acceptRules(10, 0), 0)
	c := &Conn{Proto: TCP}
	var sink int32
	for b.Loop() {
		id, _ := e.Choose(c, 0)
		sink += id
	}
	_ = sink
	reportRate(b)
}

func BenchmarkIPTablesChoose10Interface(b *testing.B) {
	var e Engine = NewIPTables(NewRandSeed(1, 2), IPTablesConfig{})
	e.Program(acceptRules(10, 0), 0)
	c := &Conn{Proto: TCP}
	var sink int32
	for b.Loop() {
		id, _ := e.Choose(c, 0)
		sink += id
	}
	_ = sink
	reportRate(b)
}

func BenchmarkNFTablesChoose10(b *testing.B) {
	e := NewNFTables(NewRandSeed(1, 2), NFTablesConfig{})
	e.Program(acceptRules(10, 0), 0)
	c := &Conn{Proto: TCP}
	var sink int32
	for b.Loop() {
		id, _ := e.Choose(c, 0)
		sink += id
	}
	_ = sink
	reportRate(b)
}

func BenchmarkIPVSChooseRR10(b *testing.B) {
	e, _ := NewIPVS(NewRandSeed(1, 2), IPVSConfig{Scheduler: "rr"})
	e.Program(acceptRules(10, 0), 0)
	c := &Conn{Proto: TCP}
	var sink int32
	for b.Loop() {
		id, _ := e.Choose(c, 0)
		sink += id
	}
	_ = sink
	reportRate(b)
}

// connWorkload generates new connections from a pool of client addresses
// with random source ports, 200 ms long, one every step of virtual time.
type connWorkload struct {
	r       *rand.PCG
	clients uint32
	step    int64
	now     int64
	c       Conn
}

func (w *connWorkload) next() (*Conn, int64) {
	x := w.r.Uint64()
	w.now += w.step
	w.c = Conn{
		SrcIP:   0x0A000000 + uint32((x>>32)*uint64(w.clients)>>32),
		SrcPort: uint16(x),
		Proto:   TCP,
		End:     w.now + int64(200*time.Millisecond),
	}
	return &w.c, w.now
}

// benchNode runs a node with one 10-endpoint service port with ClientIP
// affinity, 500 client addresses (50 per endpoint, within an iptables
// recent list's 100), random source ports and one new 200 ms connection
// every step of virtual time. Live conntrack entries settle at about
// (120 s TIME_WAIT + 0.2 s) / step: 12 thousand for a 10 ms step (a table
// that fits in cache), 120 thousand for 1 ms, 1.2 million for 100 µs (100 MB
// of slots, a cache miss per connection).
func benchNode(b *testing.B, mode Mode, step time.Duration) {
	n, _ := NewNode("bench", NodeConfig{Mode: mode}, NewRandSeed(1, 2))
	n.Program(0, acceptRules(10, 3*time.Hour), 0)
	w := &connWorkload{r: rand.NewPCG(3, 4), clients: 500, step: int64(step)}
	// Warm up to the steady state (TIME_WAIT is 120 s).
	for w.now < int64(121*time.Second) {
		c, now := w.next()
		n.Connect(0, c, now)
	}
	var sink int32
	for b.Loop() {
		c, now := w.next()
		sink += n.Connect(0, c, now).Endpoint
	}
	_ = sink
	reportRate(b)
	b.ReportMetric(float64(n.CT.Len(w.now)), "live-entries")
}

// BenchmarkNodeConnect measures new connections through a node with
// conntrack and affinity, per mode and table size.
func BenchmarkNodeConnect(b *testing.B) {
	for _, m := range []Mode{IPTables, NFTables, IPVS} {
		b.Run(m.String()+"/12k-live", func(b *testing.B) { benchNode(b, m, 10*time.Millisecond) })
		b.Run(m.String()+"/120k-live", func(b *testing.B) { benchNode(b, m, time.Millisecond) })
		b.Run(m.String()+"/1.2M-live", func(b *testing.B) { benchNode(b, m, 100*time.Microsecond) })
	}
}

// BenchmarkGoMapConntrack is the design's second floor: a Go map keyed by
// the tuple, looked up and inserted per new connection, with the same
// workloads (8 M/s there). It never deletes expired entries, which flatters
// it.
func BenchmarkGoMapConntrack(b *testing.B) {
	for _, step := range []time.Duration{10 * time.Millisecond, 100 * time.Microsecond} {
		b.Run(step.String(), func(b *testing.B) {
			type entry struct {
				ep  int32
				exp int64
			}
			m := map[uint64]entry{}
			w := &connWorkload{r: rand.NewPCG(3, 4), clients: 500, step: int64(step)}
			var sink int32
			do := func() {
				c, now := w.next()
				k := ctKey(c)
				if e, ok := m[k]; ok && now < e.exp {
					sink += e.ep
					return
				}
				m[k] = entry{ep: int32(k & 7), exp: c.End + int64(DefaultTCPTimeWait)}
			}
			for w.now < int64(121*time.Second) {
				do()
			}
			for b.Loop() {
				do()
			}
			_ = sink
			reportRate(b)
		})
	}
}

// BenchmarkNodeProgram30000 is the set-up of one node's run in the
// 30,000-Service scenario: a node programs 30,000 service ports of 10
// endpoints (the simulator's rendered rules, shared, hence ProgramShared)
// and decides one connection to each. Per mode; reports service ports/s.
//
//	go test -run '^$' -bench NodeProgram30000 -benchtime 20x -count 5 ./sim/engine/
func BenchmarkNodeProgram30000(b *testing.B) {
	const ports = 30000
	rules := make([]Rules, ports)
	for s := range rules {
		rules[s] = acceptRules(10, 0)
		if s%20 == 0 {
			rules[s].AffinityTimeout = 3 * time.Hour
		}
	}
	for _, mode := range []Mode{IPTables, NFTables, IPVS} {
		b.Run(mode.String(), func(b *testing.B) {
			seed := uint64(0)
			for b.Loop() {
				seed++
				n, err := NewNode("n", NodeConfig{Mode: mode, IPVS: IPVSConfig{Scheduler: "rr"}}, NewRandSeed(seed, 1))
				if err != nil {
					b.Fatal(err)
				}
				n.ReserveServices(ports)
				for s := range rules {
					n.ProgramShared(s, rules[s], 0)
				}
				for s := range rules {
					n.Connect(s, &Conn{SrcIP: uint32(s), SrcPort: 1000, Proto: TCP, End: 1}, 0)
				}
			}
			b.ReportMetric(float64(ports)*float64(b.N)/b.Elapsed().Seconds(), "ports/s")
		})
	}
}
