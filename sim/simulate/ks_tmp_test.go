package simulate

// TEMPORARY: goes with ks_tmp.go (replace with stats.KSUniform when
// i11-stats lands).

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestKSUniformExact: for one value D = max(u, 1−u) and P(D ≥ d) =
// 2(1−d); for n = 100 the tabulated 5 % critical value is 0.1340
// (Marsaglia, Tsang and Wang's K(100, 0.134) ≈ 0.95).
func TestKSUniformExact(t *testing.T) {
	for _, u := range []float64{0.1, 0.3, 0.75, 0.99} {
		d, p := ksUniform([]float64{u})
		want := 2 * (1 - math.Max(u, 1-u))
		if math.Abs(d-math.Max(u, 1-u)) > 1e-12 || math.Abs(p-want) > 1e-9 {
			t.Errorf("u = %g: d %g p %g, want d %g p %g", u, d, p, math.Max(u, 1-u), want)
		}
	}
	if p := ksSurvival(100, 0.1340); math.Abs(p-0.05) > 0.002 {
		t.Errorf("P(D_100 ≥ 0.134) = %g, want about 0.05", p)
	}
	if d, p := ksUniform(nil); d != 0 || p != 1 {
		t.Errorf("no values: %g %g", d, p)
	}
}

// TestKSUniformSize: over 2,000 seeded samples of 200 uniform values the
// test rejects at 0.05 about 5 % of the time (binomial 99.9 % bounds), and
// it rejects a sample skewed towards 0.
func TestKSUniformSize(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	rej := 0
	ps := make([]float64, 200)
	for range 2000 {
		for i := range ps {
			ps[i] = r.Float64()
		}
		if _, p := ksUniform(ps); p <= 0.05 {
			rej++
		}
	}
	if rej < 67 || rej > 136 {
		t.Errorf("%d of 2000 rejections at 0.05, want about 100", rej)
	}
	for i := range ps {
		ps[i] = math.Pow(r.Float64(), 3)
	}
	if d, p := ksUniform(ps); p > 1e-6 {
		t.Errorf("skewed sample: d %g p %g", d, p)
	}
}
