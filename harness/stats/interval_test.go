package stats

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func floatCounts(c []int) []float64 {
	out := make([]float64, len(c))
	for i, x := range c {
		out[i] = float64(x)
	}
	return out
}

// TestSimultaneousIntervals: each interval is Clopper-Pearson at the
// Bonferroni level, and over 20,000 seeded samples all k intervals cover
// their true shares together at least conf of the time.
func TestSimultaneousIntervals(t *testing.T) {
	lo, hi := SimultaneousIntervals([]float64{10, 30, 60}, 0.95)
	for i, c := range []int{10, 30, 60} {
		l, h := ClopperPearson(c, 100, 1-0.05/3)
		if lo[i] != l || hi[i] != h {
			t.Errorf("cell %d: [%g, %g], want [%g, %g]", i, lo[i], hi[i], l, h)
		}
	}
	for _, bad := range [][]float64{{0, 0}, {1.5, 2}, {-1, 3}} {
		if lo, _ := SimultaneousIntervals(bad, 0.95); !math.IsNaN(lo[0]) {
			t.Errorf("SimultaneousIntervals(%v) gave %v, want NaN", bad, lo)
		}
	}
	p := []float64{0.1, 0.15, 0.2, 0.25, 0.3}
	r := newCalibrationRand(t, 900)
	counts := make([]int, len(p))
	covered := 0
	reps := mcReps(calibrationReps)
	for range reps {
		SampleMultinomial(r, 200, p, counts)
		lo, hi := SimultaneousIntervals(floatCounts(counts), 0.95)
		all := true
		for i := range p {
			all = all && lo[i] <= p[i] && p[i] <= hi[i]
		}
		if all {
			covered++
		}
	}
	expectAtLeast(t, "simultaneous coverage, k=5, n=200, conf 0.95", covered, reps, 0.95)
}

// equivalenceRate runs Equivalence on mcReps(calibrationReps) samples of n from truth and
// returns how often it held; it also checks on the first 2,000 samples that
// Holds is exactly "every (1-2α) interval lies inside its margin".
func equivalenceRate(t *testing.T, r *rand.Rand, n int, truth, p0 []float64, delta, alpha float64) int {
	t.Helper()
	counts := make([]int, len(truth))
	holds := 0
	for rep := range mcReps(calibrationReps) {
		SampleMultinomial(r, n, truth, counts)
		res, err := Equivalence(floatCounts(counts), p0, delta, alpha)
		if err != nil {
			t.Fatal(err)
		}
		if res.Holds {
			holds++
		}
		if rep >= 2000 {
			continue
		}
		inside := true
		for i, c := range counts {
			l, h := ClopperPearson(c, n, 1-2*alpha)
			ml, mh := equivalenceMargin(p0[i], delta)
			inside = inside && l > ml && h < mh
		}
		if inside != res.Holds {
			t.Fatalf("counts %v: Holds %v (P %g, worst %d) but intervals inside margins: %v", counts, res.Holds, res.P, res.Worst, inside)
		}
	}
	return holds
}

// TestEquivalence: at the sample size EquivalenceSampleSize gives, shares
// exactly at p0 show equivalence at least with the target power, and shares
// on the margin's edge (one endpoint at (1+δ)·p0, the others scaled) show it
// at most α of the time: the test's size, without a multiplicity correction.
func TestEquivalence(t *testing.T) {
	const delta, alpha, power = 0.1, 0.05, 0.9
	for ci, p0 := range [][]float64{Uniform(3), {0.1, 0.2, 0.3, 0.4}} {
		t.Run(fmt.Sprintf("k=%d", len(p0)), func(t *testing.T) {
			n := EquivalenceSampleSize(p0, delta, alpha, power)
			t.Logf("n = %d", n)
			r := newCalibrationRand(t, uint64(910+ci))
			expectAtLeast(t, "equivalence shown at p0", equivalenceRate(t, r, n, p0, p0, delta, alpha), mcReps(calibrationReps), power)
			for _, j := range []int{0, len(p0) - 1} {
				for _, s := range []float64{1, -1} {
					edge := make([]float64, len(p0))
					pj := p0[j] * (1 + s*delta)
					for i := range p0 {
						edge[i] = p0[i] * (1 - pj) / (1 - p0[j])
					}
					edge[j] = pj
					expectAtMost(t, fmt.Sprintf("equivalence shown, endpoint %d at %+g", j, s*delta), equivalenceRate(t, r, n, edge, p0, delta, alpha), mcReps(calibrationReps), alpha)
				}
			}
		})
	}
}

func TestEquivalenceEdgeCases(t *testing.T) {
	p0 := []float64{0.5, 0.5, 0}
	res, err := Equivalence([]float64{5000, 5000, 0}, p0, 0.1, 0.01)
	if err != nil || !res.Holds || res.PerEndpoint[2] != 0 || len(res.Notes) != 1 {
		t.Errorf("probability-0 endpoint without traffic: %+v, %v", res, err)
	}
	res, err = Equivalence([]float64{5000, 4999, 1}, p0, 0.1, 0.01)
	if err != nil || res.Holds || res.Worst != 2 || res.P != 1 {
		t.Errorf("probability-0 endpoint with traffic: %+v, %v", res, err)
	}
	// A share of 0.95 with δ = 0.1 has no upper side: only the lower test counts.
	res, err = Equivalence([]float64{9600, 400}, []float64{0.95, 0.05}, 0.5, 0.01)
	if err != nil || res.PerEndpoint[0] != binomUpper(9600, 10000, 0.475) {
		t.Errorf("share near 1: %+v, %v", res, err)
	}
	for _, c := range []struct {
		counts, p0   []float64
		delta, alpha float64
	}{
		{[]float64{1, 2}, []float64{1}, 0.1, 0.05},
		{[]float64{1, 2}, []float64{0.5, 0.5}, 0, 0.05},
		{[]float64{1, 2}, []float64{0.5, 0.5}, 0.1, 0.5},
		{[]float64{1.5, 2}, []float64{0.5, 0.5}, 0.1, 0.05},
		{[]float64{1, 2}, []float64{0.5, 0.6}, 0.1, 0.05},
	} {
		if _, err := Equivalence(c.counts, c.p0, c.delta, c.alpha); !IsInvalidArgument(err) {
			t.Errorf("Equivalence(%v, %v, %g, %g): error %v, want an invalid argument", c.counts, c.p0, c.delta, c.alpha, err)
		}
	}
	if n := EquivalenceSampleSize([]float64{0.5, 0.5}, 0.1, 0.05, 1); n != -1 {
		t.Errorf("EquivalenceSampleSize at power 1 = %d, want -1", n)
	}
}

// TestEquivalenceSampleSizeOperatingPoint prints the equivalence sizes at
// the suite's operating point next to the fixed chi-square's.
func TestEquivalenceSampleSizeOperatingPoint(t *testing.T) {
	for _, k := range []int{2, 3, 5, 20} {
		p0 := Uniform(k)
		fixed := ChiSquareSampleSize(EffectW2(p0, OneOffAlternative(k, 0.1)), k-1, operatingAlpha, DefaultPower)
		n5, n10 := EquivalenceSampleSize(p0, 0.05, operatingAlpha, DefaultPower), EquivalenceSampleSize(p0, 0.1, operatingAlpha, DefaultPower)
		if !(n5 > n10 && n10 > 0) {
			t.Errorf("k=%d: sizes %d (δ 5 %%) and %d (δ 10 %%)", k, n5, n10)
		}
		t.Logf("k=%d: equivalence n %d (δ = 5 %%), %d (δ = 10 %%); fixed chi-square n %d (MDE 10 %%)", k, n5, n10, fixed)
	}
}
