package stats

import (
	"fmt"
	"math"
	"testing"
)

// TestKSExactValues: P(D_n >= d) against values computed independently in
// exact rational arithmetic with the same algorithm (mpmath/fractions), the
// example of Marsaglia, Tsang and Wang (K(10, 0.274) = 0.6284796154565043),
// and closed forms: P(D_n < d) = n!(2d - 1/n)^n for 1/(2n) <= d <= 1/n, and
// P(D_n >= d) = 2(1-d)^n for d >= 1 - 1/n.
func TestKSExactValues(t *testing.T) {
	for _, c := range []struct {
		n    int
		d, p float64
	}{
		{10, 0.274, 1 - 0.62847961545650433},
		{20, 0.2, 0.35272017362341607},
		{50, 0.1, 0.6623112704658185},
		{100, 0.12, 0.10330374901820255},
		{7, 0.3, 0.46626387699002969},
		{30, 0.25, 0.03872415670110451},
		{5, 0.15, 1 - 120*math.Pow(0.3-0.2, 5)},
		{8, 0.1, 1 - 40320*math.Pow(0.2-0.125, 8)},
		{5, 0.9, 2 * math.Pow(0.1, 5)},
		{1, 0.75, 0.5},
	} {
		checkRel(t, fmt.Sprintf("P(D_%d >= %g)", c.n, c.d), ksExactSurvival(c.n, c.d), c.p, 1e-9)
	}
}

// TestKSAsymptotic: the Kolmogorov distribution from both series against
// mpmath's (30 digits, alternating series with acceleration), and Stephens'
// corrected asymptotic against the exact distribution at n = 100, where it
// is within 2 % (1.7 % at p = 0.52, less in the tail).
func TestKSAsymptotic(t *testing.T) {
	for _, c := range []struct{ lambda, p float64 }{
		{1.2238, 0.10002342783567782}, {1.3581, 0.049999630431667434}, {1.6276, 0.010001537333060768},
		{0.8276, 0.49995841656354728}, {0.5, 0.96394524366487511}, {0.3, 0.99999069419866549}, {2.5, 7.4533063441573419e-06},
	} {
		checkRel(t, fmt.Sprintf("Q(%g)", c.lambda), kolmogorovSurvival(c.lambda), c.p, 1e-10)
	}
	// Both series agree where they meet.
	checkRel(t, "Q(1) by the two series", kolmogorovSurvival(1), kolmogorovSurvival(math.Nextafter(1, 0)), 1e-12)
	for _, c := range []struct{ d, tol float64 }{{0.08, 0.02}, {0.12, 0.01}, {0.16, 0.01}} {
		sq := 10.0
		checkRel(t, fmt.Sprintf("Stephens at n=100, d=%g", c.d), kolmogorovSurvival((sq+0.12+0.11/sq)*c.d), ksExactSurvival(100, c.d), c.tol)
	}
}

// TestKSUniformStatistic: d of a small sample by hand, and NaN for bad input.
func TestKSUniformStatistic(t *testing.T) {
	d, p := KSUniform([]float64{0.9, 0.1, 0.5})
	// Sorted 0.1, 0.5, 0.9: D+ = max(1/3-0.1, 2/3-0.5, 1-0.9) = 0.2333, D- = max(0.1, 0.5-1/3, 0.9-2/3) = 0.2333.
	checkRel(t, "d", d, 0.9-2.0/3, 1e-12)
	checkRel(t, "p", p, ksExactSurvival(3, d), 0)
	for _, bad := range [][]float64{nil, {0.5, -0.1}, {math.NaN()}, {1.5}} {
		if d, p := KSUniform(bad); !math.IsNaN(d) || !math.IsNaN(p) {
			t.Errorf("KSUniform(%v) = %g, %g, want NaN", bad, d, p)
		}
	}
}

// TestCalibrationKSUniform: on uniform samples the rejection rate is α, for
// the exact (n = 20, 100) and the asymptotic (n = 101, 500) p-values; on a
// sample from Beta(1.3, 1) at n = 500 it is well above α, so the test has teeth.
func TestCalibrationKSUniform(t *testing.T) {
	for ci, n := range []int{20, 100, 101, 500} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			r := newCalibrationRand(t, uint64(800+ci))
			reps := mcReps(calibrationReps)
			if n > 100 {
				reps /= 2
			}
			ps := make([]float64, n)
			rej := map[float64]int{}
			for range reps {
				for i := range ps {
					ps[i] = r.Float64()
				}
				_, p := KSUniform(ps)
				for _, a := range []float64{0.05, 0.01} {
					if p <= a {
						rej[a]++
					}
				}
			}
			for _, a := range []float64{0.05, 0.01} {
				expectRate(t, fmt.Sprintf("KS, alpha %g", a), rej[a], reps, a)
			}
		})
	}
	r := newCalibrationRand(t, 810)
	ps := make([]float64, 500)
	rejected := 0
	for range 1000 {
		for i := range ps {
			ps[i] = math.Pow(r.Float64(), 1/1.3) // Beta(1.3, 1)
		}
		if _, p := KSUniform(ps); p <= 0.01 {
			rejected++
		}
	}
	expectAtLeast(t, "KS against Beta(1.3, 1), n = 500, alpha 0.01", rejected, 1000, 0.5)
}
