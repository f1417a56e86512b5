package engine

import (
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/stats"
)

func TestNumgenUniform(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 37} {
		e := NewNFTables(NewRandSeed(uint64(n), 11), NFTablesConfig{})
		e.Program(acceptRules(n, 0), 0)
		counts := make([]int, n)
		for range 300_000 {
			id, v := e.Choose(&Conn{}, 0)
			if v != Accept {
				t.Fatalf("verdict %v", v)
			}
			counts[id]++
		}
		if n > 1 {
			requireUniform(t, "numgen random mod n", counts)
		}
	}
}

func TestNumgenIsReciprocalScale(t *testing.T) {
	// numgen random mod N = (u64(r32) * N) >> 32 on the draw the engine takes.
	rng := NewRandSeed(5, 5)
	twin := NewRandSeed(5, 5)
	e := NewNFTables(rng, NFTablesConfig{})
	e.Program(acceptRules(7, 0), 0)
	for range 1000 {
		id, _ := e.Choose(&Conn{}, 0)
		if want := int32((uint64(twin.Uint32()) * 7) >> 32); id != want {
			t.Fatalf("got %d, want %d", id, want)
		}
	}
}

func TestNFTablesAffinity(t *testing.T) {
	const timeout = 10 * time.Second
	e := NewNFTables(NewRandSeed(8, 1), NFTablesConfig{})
	e.Program(acceptRules(4, timeout), 0)
	c := &Conn{SrcIP: 0x0A000002}
	first, _ := e.Choose(c, 0)
	for i := int64(1); i <= 20; i++ {
		if id, _ := e.Choose(c, i*9*sec); id != first {
			t.Fatalf("connection %d moved to %d from %d", i, id, first)
		}
	}
	// The element expires 10 s after its last update (t = 180 s).
	if e.sets.lookup(c.SrcIP, 190*sec-1) != int(first) {
		t.Error("element expired early")
	}
	if e.sets.lookup(c.SrcIP, 190*sec) != -1 {
		t.Error("element alive after its timeout")
	}
	// First choices after expiry are fresh and uniform.
	counts := make([]int, 4)
	for k := range 20000 {
		cc := &Conn{SrcIP: 0x0B000000 + uint32(k)}
		e.Choose(cc, 1000*sec)
		b, _ := e.Choose(cc, 1000*sec+int64(timeout))
		counts[b]++
	}
	requireUniform(t, "choices after expiry", counts)
	// Sets have no capacity limit by default.
	for k := range 1000 {
		e.Choose(&Conn{SrcIP: 0x0C000000 + uint32(k)}, 2000*sec)
	}
	if e.Stats.SetFull != 0 {
		t.Errorf("set full %d", e.Stats.SetFull)
	}
}

func TestNFTablesSetSize(t *testing.T) {
	e := NewNFTables(NewRandSeed(8, 2), NFTablesConfig{AffinitySetSize: 10})
	e.Program(acceptRules(1, time.Hour), 0)
	for k := range 30 {
		e.Choose(&Conn{SrcIP: uint32(k)}, sec)
	}
	if e.Stats.SetFull != 20 {
		t.Errorf("set full %d, want 20", e.Stats.SetFull)
	}
	if e.sets.lookup(5, 2*sec) != 0 || e.sets.lookup(25, 2*sec) != -1 {
		t.Error("a full set replaced an element; nft adds nothing when full")
	}
}

func TestNFTablesPowerAgainstFault(t *testing.T) {
	// The uniformity test must see a broken balancer: here numgen over 10
	// endpoints where one endpoint is listed twice (11 slots), a 10 %
	// excess, with the sample size the statistics reference gives for 10
	// endpoints at δ = 10 % (42,034 probes at α = 0.001, power 0.99).
	e := NewNFTables(NewRandSeed(1, 99), NFTablesConfig{})
	r := acceptRules(10, 0)
	r.Backends = append(r.Backends, r.Backends[0])
	e.Program(r, 0)
	counts := make([]float64, 10)
	for range 42034 {
		id, _ := e.Choose(&Conn{}, 0)
		counts[id]++
	}
	res, err := stats.ChiSquareGOF(counts, stats.Uniform(10))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Rejects(alpha) {
		t.Errorf("fault not detected: p=%.3g", res.P)
	}
}
