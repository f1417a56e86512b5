package engine

import (
	"errors"
	"testing"

	"github.com/kpsim/kpsim/harness/stats"
)

func TestParseFault(t *testing.T) {
	for _, f := range []Fault{NoFault, FaultUniformProbability, FaultMovedBucket, FaultRotationStall} {
		got, err := ParseFault(f.String())
		if err != nil || got != f {
			t.Errorf("ParseFault(%q) = %v, %v", f.String(), got, err)
		}
	}
	if _, err := ParseFault("skew"); !errors.Is(err, ErrUnknownFault) {
		t.Errorf("unknown fault: %v", err)
	}
	if NoFault.Mode() != 0 || FaultUniformProbability.Mode() != IPTables || FaultMovedBucket.Mode() != NFTables || FaultRotationStall.Mode() != IPVS {
		t.Error("fault modes")
	}
}

// requireShares fails unless counts fit the given probabilities (the
// fault's shares) at alpha.
func requireShares(t *testing.T, what string, counts []int, p []float64) {
	t.Helper()
	obs := make([]float64, len(counts))
	for i, c := range counts {
		obs[i] = float64(c)
	}
	r, err := stats.ChiSquareGOF(obs, p)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if r.Rejects(alpha) {
		t.Errorf("%s: counts %v do not fit %v: p = %.3g", what, counts, p, r.P)
	}
}

// TestFaultUniformProbability: with the fault, the cascade's shares are
// 1/3, 2/9, 4/9 for three endpoints; without it they are uniform.
func TestFaultUniformProbability(t *testing.T) {
	for _, f := range []Fault{NoFault, FaultUniformProbability} {
		e := NewIPTables(NewRandSeed(3, uint64(f)), IPTablesConfig{Fault: f})
		e.Program(acceptRules(3, 0), 0)
		counts := make([]int, 3)
		for range 90_000 {
			id, _ := e.Choose(&Conn{}, 0)
			counts[id]++
		}
		want := []float64{1. / 3, 1. / 3, 1. / 3}
		if f == FaultUniformProbability {
			want = []float64{1. / 3, 2. / 9, 4. / 9}
		}
		requireShares(t, f.String(), counts, want)
	}
}

// TestFaultMovedBucket: the last of four buckets goes to the first
// endpoint.
func TestFaultMovedBucket(t *testing.T) {
	e := NewNFTables(NewRandSeed(4, 4), NFTablesConfig{Fault: FaultMovedBucket})
	e.Program(acceptRules(4, 0), 0)
	counts := make([]int, 4)
	for range 80_000 {
		id, _ := e.Choose(&Conn{}, 0)
		counts[id]++
	}
	if counts[3] != 0 {
		t.Errorf("the last endpoint received %d connections", counts[3])
	}
	requireShares(t, "moved bucket", counts[:3], []float64{0.5, 0.25, 0.25})
}

// TestFaultRotationStall: every tenth connection repeats the last choice,
// in rr and wrr; without the fault the rotation is strict.
func TestFaultRotationStall(t *testing.T) {
	for _, sched := range []string{"rr", "wrr"} {
		e, err := NewIPVS(NewRandSeed(5, 1), IPVSConfig{Scheduler: sched, Fault: FaultRotationStall})
		if err != nil {
			t.Fatal(err)
		}
		e.Program(acceptRules(4, 0), 0)
		prev, repeats := int32(-1), 0
		for i := range 100 {
			id, _ := e.Choose(&Conn{}, 0)
			if id == prev {
				repeats++
				if (i+1)%rotationStallEvery != 0 {
					t.Errorf("%s: connection %d repeated %d", sched, i+1, id)
				}
			}
			prev = id
		}
		if repeats != 100/rotationStallEvery {
			t.Errorf("%s: %d repeats in 100 connections, want %d", sched, repeats, 100/rotationStallEvery)
		}
	}
}
