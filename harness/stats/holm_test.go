package stats

import (
	"math"
	"slices"
	"testing"
)

func TestHolm(t *testing.T) {
	// m = 5, sorted: 0.001 (×5 = 0.005), 0.01 (×4 = 0.04), 0.012 (×3 = 0.036 → 0.04),
	// 0.03 (×2 = 0.06), 0.5 (×1 → 0.5).
	ps := []float64{0.03, 0.001, 0.5, 0.012, 0.01}
	wantAdj := []float64{0.06, 0.005, 0.5, 0.04, 0.04}
	adj := HolmAdjusted(ps)
	for i := range ps {
		checkRel(t, "adjusted p", adj[i], wantAdj[i], 1e-12)
	}
	if got, want := Holm(ps, 0.05), []bool{false, true, false, true, true}; !slices.Equal(got, want) {
		t.Errorf("Holm at 0.05 = %v, want %v", got, want)
	}
	// Step-down stops at the first acceptance: 0.03 > 0.045/2 is kept although 0.03 < 0.045.
	if got, want := Holm(ps, 0.045), []bool{false, true, false, true, true}; !slices.Equal(got, want) {
		t.Errorf("Holm at 0.045 = %v, want %v", got, want)
	}
	// And a failure at step 2 stops everything after it: 0.01 > 0.039/4.
	if got, want := Holm(ps, 0.039), []bool{false, true, false, false, false}; !slices.Equal(got, want) {
		t.Errorf("Holm at 0.039 = %v, want %v", got, want)
	}
	// Holm rejects exactly where the adjusted p-value is at most alpha.
	for _, a := range []float64{0.001, 0.004, 0.005, 0.03, 0.04, 0.06, 0.7} {
		rej := Holm(ps, a)
		for i := range ps {
			if rej[i] != (adj[i] <= a) {
				t.Errorf("alpha %v, check %d: Holm %v but adjusted p %v", a, i, rej[i], adj[i])
			}
		}
	}
	// Capped at 1, NaN never rejected, empty input.
	adj = HolmAdjusted([]float64{0.9, 0.8, math.NaN()})
	if adj[0] != 1 || adj[1] != 1 || !math.IsNaN(adj[2]) {
		t.Errorf("HolmAdjusted = %v", adj)
	}
	if rej := Holm([]float64{math.NaN(), 0}, 0.05); !slices.Equal(rej, []bool{false, true}) {
		t.Errorf("Holm with NaN = %v", rej)
	}
	if len(Holm(nil, 0.05)) != 0 || len(HolmAdjusted(nil)) != 0 {
		t.Error("empty input")
	}
}
