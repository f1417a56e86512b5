package stats

import (
	"cmp"
	"math"
	"slices"
)

// holmOrder returns the indices of ps by increasing p-value; NaN sorts last
// (and is never rejected).
func holmOrder(ps []float64) []int {
	idx := make([]int, len(ps))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		pa, pb := ps[a], ps[b]
		switch {
		case math.IsNaN(pa) && math.IsNaN(pb):
			return 0
		case math.IsNaN(pa):
			return 1
		case math.IsNaN(pb):
			return -1
		}
		return cmp.Compare(pa, pb)
	})
	return idx
}

// Holm applies Holm's step-down procedure to the p-values of the m checks of
// a run at family-wise level alphaFamily (DefaultFamilyAlpha by default) and
// returns, in the original order, which checks are rejected: the i-th
// smallest p-value (i from 0) is rejected if it and all smaller ones satisfy
// p <= alphaFamily/(m-i). The first step tests at alphaFamily/m, the level
// each check should be sized for. NaN p-values are never rejected.
func Holm(ps []float64, alphaFamily float64) []bool {
	reject := make([]bool, len(ps))
	m := len(ps)
	for i, j := range holmOrder(ps) {
		if !(ps[j] <= alphaFamily/float64(m-i)) {
			break
		}
		reject[j] = true
	}
	return reject
}

// HolmAdjusted returns Holm-adjusted p-values in the original order:
// p̃_(i) = max over j <= i of min(1, (m-j) p_(j)), monotone in the sorted
// order and capped at 1, so that check i is rejected by Holm at level α
// exactly when its adjusted p-value is at most α (up to rounding of the
// product). NaN stays NaN.
func HolmAdjusted(ps []float64) []float64 {
	adj := make([]float64, len(ps))
	m := len(ps)
	running := 0.0
	for i, j := range holmOrder(ps) {
		if math.IsNaN(ps[j]) {
			adj[j] = math.NaN()
			continue
		}
		running = max(running, min(1, float64(m-i)*ps[j]))
		adj[j] = running
	}
	return adj
}
