package stats

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSampleBinomial checks both samplers (inversion for n·p < 10, BTRS
// otherwise, and the p > 0.5 reflection) against the exact pmf with the
// chi-square test of this package, and their means against n·p.
func TestSampleBinomial(t *testing.T) {
	const draws = 20000
	r := rand.New(rand.NewPCG(20240601, 1))
	for _, c := range []struct {
		n int
		p float64
	}{{1, 0.5}, {20, 0.1}, {1000, 0.003}, {100, 0.3}, {60, 0.9}, {1_000_000, 0.5}, {50_000_000, 0.0007}} {
		counts := map[int]float64{}
		var sum float64
		for range draws {
			x := SampleBinomial(r, c.n, c.p)
			if x < 0 || x > c.n {
				t.Fatalf("Binomial(%d, %g) gave %d", c.n, c.p, x)
			}
			counts[x]++
			sum += float64(x)
		}
		mean, sd := float64(c.n)*c.p, math.Sqrt(float64(c.n)*c.p*(1-c.p)/draws)
		if z := (sum/draws - mean) / sd; math.Abs(z) > 4.5 {
			t.Errorf("Binomial(%d, %g): mean %.6g, want %.6g (z = %.2f)", c.n, c.p, sum/draws, mean, z)
		}
		// Cells: every outcome within 6 sd, plus the two tails.
		s := math.Sqrt(float64(c.n) * c.p * (1 - c.p))
		lo, hi := max(0, int(mean-6*s-1)), min(c.n, int(mean+6*s+1))
		obs := []float64{0}
		exp := []float64{binomLower(lo-1, c.n, c.p)}
		for x := lo; x <= hi; x++ {
			obs = append(obs, counts[x])
			exp = append(exp, math.Exp(logBinomPMF(x, c.n, c.p)))
		}
		obs = append(obs, 0)
		exp = append(exp, binomUpper(hi+1, c.n, c.p))
		for x, v := range counts {
			if x < lo {
				obs[0] += v
			} else if x > hi {
				obs[len(obs)-1] += v
			}
		}
		var total float64
		for _, e := range exp {
			total += e
		}
		for i := range exp {
			exp[i] /= total // absorb the 1e-15 rounding of the pmf sum
		}
		res, err := ChiSquareGOF(obs, exp)
		if err != nil {
			t.Fatal(err)
		}
		if res.P < 0.001 {
			t.Errorf("Binomial(%d, %g): histogram does not fit the pmf: %s", c.n, c.p, res.Table())
		}
	}
}

func TestSampleMultinomial(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	p := []float64{2, 0, 1, 1, 0} // unnormalised weights, zero cells
	out := make([]int, len(p))
	const n, reps = 1000, 5000
	var sums [5]float64
	for range reps {
		SampleMultinomial(r, n, p, out)
		total := 0
		for i, x := range out {
			total += x
			sums[i] += float64(x)
		}
		if total != n || out[1] != 0 || out[4] != 0 {
			t.Fatalf("draw %v", out)
		}
	}
	for i, w := range []float64{0.5, 0, 0.25, 0.25, 0} {
		mean := sums[i] / reps
		sd := math.Sqrt(n * w * (1 - w) / reps)
		if math.Abs(mean-n*w) > 4.5*sd+1e-9 {
			t.Errorf("cell %d: mean %v, want %v", i, mean, n*w)
		}
	}
	SampleMultinomial(r, 0, p, out)
	for _, x := range out {
		if x != 0 {
			t.Errorf("n = 0 gave %v", out)
		}
	}
}
