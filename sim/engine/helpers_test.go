package engine

import (
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/stats"
)

// alpha is the level of every distribution test here (seeded, so a result
// never flips between runs).
const alpha = 0.001

func backendsN(n int) []Backend {
	out := make([]Backend, n)
	for i := range out {
		out[i] = Backend{ID: int32(i), IP: 0x0A000100 + uint32(i+1), Port: 80}
	}
	return out
}

func acceptRules(n int, affinity time.Duration) Rules {
	return Rules{Verdict: Accept, Backends: backendsN(n), AffinityTimeout: affinity, Proto: TCP, VIP: 0xAC1E0101, VPort: 80}
}

// requireUniform runs the harness's chi-square goodness-of-fit test of
// counts against the uniform distribution and fails if it rejects at alpha.
func requireUniform(t *testing.T, what string, counts []int) {
	t.Helper()
	obs := make([]float64, len(counts))
	for i, c := range counts {
		obs[i] = float64(c)
	}
	r, err := stats.ChiSquareGOF(obs, stats.Uniform(len(counts)))
	if err != nil {
		t.Fatalf("%s: chi-square: %v", what, err)
	}
	if r.Rejects(alpha) {
		t.Errorf("%s: not uniform at α=%v: X²=%.2f df=%d p=%.3g counts=%v", what, alpha, r.Statistic, r.DF, r.P, counts)
	} else {
		t.Logf("%s: X²=%.2f df=%d p=%.3g n=%g", what, r.Statistic, r.DF, r.P, r.N)
	}
}

const sec = int64(time.Second)
