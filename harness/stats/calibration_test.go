package stats

// Check the checker: over many seeded simulated runs, each test's rejection
// rate must match theory, its level α on a correct subject and its computed
// power on a faulty one, within the 99.9 % Clopper-Pearson interval of the
// observed count. Seeds are fixed, there are no retries, and each assertion
// compares with theory, so a miscalibrated test fails (TestCalibration-
// ChiSquareGOFNull shows that a wrong df is caught).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

const (
	calibrationReps       = 20000 // simulated runs per rate
	calibrationConfidence = 0.999 // of the Clopper-Pearson interval around each rate
	calibrationSeed       = 0x6b70_7369_6d00_0001
)

// newCalibrationRand returns the seeded source of one calibration case;
// stream separates cases so that they do not share draws.
func newCalibrationRand(t *testing.T, stream uint64) *rand.Rand {
	t.Helper()
	t.Logf("seed PCG(%#x, %d)", uint64(calibrationSeed), stream)
	return rand.New(rand.NewPCG(calibrationSeed, stream))
}

// rateInterval returns the observed rate and its Clopper-Pearson interval.
func rateInterval(rejections, reps int) (rate, lo, hi float64) {
	lo, hi = ClopperPearson(rejections, reps, calibrationConfidence)
	return float64(rejections) / float64(reps), lo, hi
}

// expectRate fails the test unless want lies in the 99.9 % Clopper-Pearson
// interval of rejections out of reps.
func expectRate(t *testing.T, what string, rejections, reps int, want float64) {
	t.Helper()
	rate, lo, hi := rateInterval(rejections, reps)
	verdict := "ok"
	if want < lo || want > hi {
		verdict = "FAIL"
		t.Errorf("%s: observed %d/%d = %.5f, 99.9 %% CP [%.5f, %.5f] does not hold theory %.5f", what, rejections, reps, rate, lo, hi, want)
	}
	t.Logf("%-48s observed %.5f  CP99.9 [%.5f, %.5f]  theory %.5f  %s", what, rate, lo, hi, want, verdict)
}

// expectAtMost fails the test if the whole 99.9 % interval lies above limit.
func expectAtMost(t *testing.T, what string, rejections, reps int, limit float64) {
	t.Helper()
	rate, lo, hi := rateInterval(rejections, reps)
	verdict := "ok"
	if lo > limit {
		verdict = "FAIL"
		t.Errorf("%s: observed %d/%d = %.5f, 99.9 %% CP [%.5f, %.5f] lies above %.5f", what, rejections, reps, rate, lo, hi, limit)
	}
	t.Logf("%-48s observed %.5f  CP99.9 [%.5f, %.5f]  at most %.5f  %s", what, rate, lo, hi, limit, verdict)
}

// simulateGOF draws reps multinomial samples of n from truth, tests each
// against null with test, and returns the p-values.
func simulateGOF(t *testing.T, r *rand.Rand, test func([]float64, []float64) (Result, error), n int, null, truth []float64) []Result {
	t.Helper()
	counts := make([]int, len(truth))
	obs := make([]float64, len(truth))
	results := make([]Result, calibrationReps)
	for rep := range results {
		SampleMultinomial(r, n, truth, counts)
		for i, c := range counts {
			obs[i] = float64(c)
		}
		res, err := test(obs, null)
		if err != nil {
			t.Fatal(err)
		}
		results[rep] = res
	}
	return results
}

func countRejections(results []Result, alpha float64) int {
	n := 0
	for _, r := range results {
		if r.Rejects(alpha) {
			n++
		}
	}
	return n
}

var nullCases = []struct {
	name string
	n    int
	p    []float64
}{
	{"k=3 uniform n=300", 300, Uniform(3)},
	{"k=10 uniform n=1000", 1000, Uniform(10)},
	{"k=5 weighted n=500", 500, []float64{0.1, 0.15, 0.2, 0.25, 0.3}},
}

// TestCalibrationChiSquareGOFNull: on a correct subject the false-rejection
// rate of ChiSquareGOF is α (0.05 and 0.01). The same p-values recomputed
// with a wrong df (k instead of k-1) must fall outside, which shows the
// check can fail.
func TestCalibrationChiSquareGOFNull(t *testing.T) {
	for ci, c := range nullCases {
		t.Run(c.name, func(t *testing.T) {
			r := newCalibrationRand(t, uint64(100+ci))
			results := simulateGOF(t, r, ChiSquareGOF, c.n, c.p, c.p)
			for _, alpha := range []float64{0.05, 0.01} {
				expectRate(t, fmt.Sprintf("chi-square, alpha %g", alpha), countRejections(results, alpha), len(results), alpha)
			}
			// Teeth: a test that used df = k would be caught.
			wrong := 0
			for _, res := range results {
				if (distuv.ChiSquared{K: float64(res.DF + 1)}).Survival(res.Statistic) <= 0.05 {
					wrong++
				}
			}
			rate, lo, hi := rateInterval(wrong, len(results))
			t.Logf("%-48s observed %.5f  CP99.9 [%.5f, %.5f]  theory 0.05000  caught=%v", "wrong df (k), alpha 0.05", rate, lo, hi, 0.05 < lo || 0.05 > hi)
			if lo <= 0.05 && 0.05 <= hi {
				t.Errorf("a chi-square test with the wrong df was not caught: rate %.5f", rate)
			}
		})
	}
}

// TestCalibrationGTestNull: the same for the G-test.
func TestCalibrationGTestNull(t *testing.T) {
	for ci, c := range nullCases {
		t.Run(c.name, func(t *testing.T) {
			r := newCalibrationRand(t, uint64(200+ci))
			results := simulateGOF(t, r, GTest, c.n, c.p, c.p)
			for _, alpha := range []float64{0.05, 0.01} {
				expectRate(t, fmt.Sprintf("G-test, alpha %g", alpha), countRejections(results, alpha), len(results), alpha)
			}
		})
	}
}

// powerCases are local alternatives (small delta), where the noncentral
// chi-square is the right theory for both Pearson's X² and G.
var powerCases = []struct {
	k     int
	delta float64
	alpha float64
}{
	{3, 0.05, 0.01},
	{10, 0.03, 0.01},
	{5, 0.03, 0.001},
}

// TestPowerGOF: under OneOffAlternative, with n sized for power 0.8 by
// ChiSquareSampleSize, the detection rate of ChiSquareGOF and of GTest is
// ChiSquarePower(n, ...). Patnaik's power is logged beside it.
func TestPowerGOF(t *testing.T) {
	for ci, c := range powerCases {
		t.Run(fmt.Sprintf("k=%d delta=%g alpha=%g", c.k, c.delta, c.alpha), func(t *testing.T) {
			null, alt := Uniform(c.k), OneOffAlternative(c.k, c.delta)
			w2 := EffectW2(null, alt)
			n := ChiSquareSampleSize(w2, c.k-1, c.alpha, 0.8)
			want := ChiSquarePower(n, w2, c.k-1, c.alpha)
			t.Logf("n = %d, w² = %.6g, computed power %.5f (Patnaik %.5f)", n, w2, want, ChiSquarePowerPatnaik(n, w2, c.k-1, c.alpha))
			for ti, test := range []struct {
				name string
				f    func([]float64, []float64) (Result, error)
			}{{"chi-square", ChiSquareGOF}, {"G-test", GTest}} {
				r := newCalibrationRand(t, uint64(300+10*ci+ti))
				results := simulateGOF(t, r, test.f, n, null, alt)
				expectRate(t, test.name+" power", countRejections(results, c.alpha), len(results), want)
			}
		})
	}
}

// TestPowerAtReferenceSizes measures the real power of the reference's
// design (alpha 0.001, power 0.99, delta 10 %) at the exact noncentral size
// and at the table's (Patnaik) size. The noncentral chi-square is a
// first-order theory: for an endpoint that gets more than its share the
// variance of the statistic grows with delta and the real power falls a
// little short (about 0.1-0.5 points at power 0.99 for delta 5-20 %, more
// for G than for X²). The test bounds that shortfall at one point.
func TestPowerAtReferenceSizes(t *testing.T) {
	const alpha, power, delta = 0.001, 0.99, 0.10
	for ci, k := range []int{3, 10} {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			null, alt := Uniform(k), OneOffAlternative(k, delta)
			w2 := EffectW2(null, alt)
			for si, size := range []struct {
				name string
				n    int
			}{{"exact size", ChiSquareSampleSize(w2, k-1, alpha, power)}, {"table size", referenceTable[k][1]}} {
				want := ChiSquarePower(size.n, w2, k-1, alpha)
				for ti, test := range []struct {
					name string
					f    func([]float64, []float64) (Result, error)
				}{{"chi-square", ChiSquareGOF}, {"G-test", GTest}} {
					r := newCalibrationRand(t, uint64(600+100*ci+10*si+ti))
					results := simulateGOF(t, r, test.f, size.n, null, alt)
					rej := countRejections(results, alpha)
					rate, lo, hi := rateInterval(rej, len(results))
					t.Logf("%-10s n=%-6d %-10s observed %.5f  CP99.9 [%.5f, %.5f]  noncentral %.5f", size.name, size.n, test.name, rate, lo, hi, want)
					if hi < want-0.01 {
						t.Errorf("%s, %s: real power %.5f falls more than a point short of %.5f", size.name, test.name, rate, want)
					}
				}
			}
		})
	}
}

// TestCalibrationBinomialTest: the exact binomial test is conservative. Its
// exact size (BinomialPower with p1 = p0) is at most α and the observed
// rejection rate matches it; under p1 the rate matches BinomialPower.
func TestCalibrationBinomialTest(t *testing.T) {
	const alpha = 0.05
	cases := []struct {
		n      int
		p0, p1 float64
	}{
		{50, 2.0 / 3, 0.5}, // affinity expiry with 3 endpoints
		{400, 0.1, 0.14},
	}
	for ci, c := range cases {
		for _, alt := range []Alternative{TwoSided, Greater, Less} {
			t.Run(fmt.Sprintf("n=%d p0=%.3g %s", c.n, c.p0, alt), func(t *testing.T) {
				r := newCalibrationRand(t, uint64(400+10*ci)+uint64(alt))
				size := BinomialPower(c.n, c.p0, c.p0, alpha, alt)
				if size > alpha {
					t.Errorf("exact size %v > alpha %v", size, alpha)
				}
				// The fault on the side this alternative looks at (mirrored around p0).
				p1 := c.p1
				switch alt {
				case Greater:
					p1 = max(c.p1, 2*c.p0-c.p1)
				case Less:
					p1 = min(c.p1, 2*c.p0-c.p1)
				}
				power := BinomialPower(c.n, c.p0, p1, alpha, alt)
				var null, hits int
				for range calibrationReps {
					res, err := BinomialTest(SampleBinomial(r, c.n, c.p0), c.n, c.p0, alt)
					if err != nil {
						t.Fatal(err)
					}
					if res.Rejects(alpha) {
						null++
					}
					res, err = BinomialTest(SampleBinomial(r, c.n, p1), c.n, c.p0, alt)
					if err != nil {
						t.Fatal(err)
					}
					if res.Rejects(alpha) {
						hits++
					}
				}
				expectAtMost(t, fmt.Sprintf("size, alpha %g", alpha), null, calibrationReps, alpha)
				expectRate(t, "size against exact size", null, calibrationReps, size)
				expectRate(t, fmt.Sprintf("power at p1 = %.3g", p1), hits, calibrationReps, power)
			})
		}
	}
}

// TestCalibrationHolm: under the global null with m = 10 independent
// uniform p-values, Holm's family-wise rejection rate is at most α_F (in
// fact 1-(1-α_F/m)^m under independence); with 3 false nulls it still
// rejects a true null at most at rate α_F. A run of 10 chi-square checks on
// a correct subject, corrected with Holm, keeps the same rate.
func TestCalibrationHolm(t *testing.T) {
	const m, alphaF = 10, 0.05
	r := newCalibrationRand(t, 500)
	ps := make([]float64, m)
	global, partial := 0, 0
	for range calibrationReps {
		for i := range ps {
			ps[i] = r.Float64()
		}
		for _, rej := range Holm(ps, alphaF) {
			if rej {
				global++
				break
			}
		}
		// Checks 0-2 are false nulls with small p-values.
		for i := range 3 {
			ps[i] = math.Pow(r.Float64(), 30)
		}
		for i, rej := range Holm(ps, alphaF) {
			if rej && i >= 3 {
				partial++
				break
			}
		}
	}
	theory := 1 - math.Pow(1-alphaF/m, m)
	expectAtMost(t, "global null FWER", global, calibrationReps, alphaF)
	expectRate(t, "global null FWER against 1-(1-a/m)^m", global, calibrationReps, theory)
	expectAtMost(t, "3 false nulls: FWER over the 7 true", partial, calibrationReps, alphaF)

	// A whole run: 10 distribution checks (k = 4, n = 400) of a correct subject.
	p := Uniform(4)
	counts := make([]int, 4)
	obs := make([]float64, 4)
	runs := 0
	for range calibrationReps {
		for i := range ps {
			SampleMultinomial(r, 400, p, counts)
			for j, c := range counts {
				obs[j] = float64(c)
			}
			res, err := ChiSquareGOF(obs, p)
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = res.P
		}
		for _, rej := range Holm(ps, alphaF) {
			if rej {
				runs++
				break
			}
		}
	}
	expectAtMost(t, "run of 10 chi-square checks: false failures", runs, calibrationReps, alphaF)
	expectRate(t, "run of 10 chi-square checks against 1-(1-a/m)^m", runs, calibrationReps, theory)
}
