package stats

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestKSUniformUpperExact: the exact tail against values computed by hand
// for n = 1 (P(D+ >= d) = 1 - (1 - d)... = d for one p-value: D+ = 1 - p)
// and against Smirnov's limit exp(-2 n d^2) for large n.
func TestKSUniformUpperExact(t *testing.T) {
	for _, p := range []float64{0.1, 0.5, 0.9} {
		d, got := KSUniformUpper([]float64{p})
		if math.Abs(d-(1-p)) > 1e-12 || math.Abs(got-p) > 1e-9 {
			t.Errorf("n=1, p=%g: D+ %g (want %g), P %g (want %g)", p, d, 1-p, got, p)
		}
	}
	n, d := 2000, 0.03
	if got, lim := birnbaumTingey(n, d), math.Exp(-2*float64(n)*d*d); math.Abs(got-lim)/lim > 0.1 {
		t.Errorf("n=%d d=%g: exact %g, Smirnov's limit %g", n, d, got, lim)
	}
}

// TestKSUniformUpperCalibration: on uniform p-values the test rejects at
// its level; on p-values squeezed towards 0 it rejects nearly always, and
// towards 1 (a conservative test) almost never.
func TestKSUniformUpperCalibration(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	const reps, n, alpha = 4000, 30, 0.05
	rej, small, large := 0, 0, 0
	ps := make([]float64, n)
	for k := 0; k < reps; k++ {
		for i := range ps {
			ps[i] = r.Float64()
		}
		if _, p := KSUniformUpper(ps); p <= alpha {
			rej++
		}
		for i := range ps {
			ps[i] = math.Pow(r.Float64(), 2) // stochastically smaller
		}
		if _, p := KSUniformUpper(ps); p <= alpha {
			small++
		}
		for i := range ps {
			ps[i] = math.Sqrt(r.Float64()) // stochastically larger
		}
		if _, p := KSUniformUpper(ps); p <= alpha {
			large++
		}
	}
	lo, hi := ClopperPearson(rej, reps, 0.999)
	if lo > alpha || hi < alpha*0.6 {
		t.Errorf("uniform: rejected %d of %d (CI %.4f-%.4f), level %g", rej, reps, lo, hi, alpha)
	}
	if float64(small)/reps < 0.9 {
		t.Errorf("p-values squeezed to 0: rejected only %d of %d", small, reps)
	}
	if float64(large)/reps > 0.001 {
		t.Errorf("conservative p-values: rejected %d of %d", large, reps)
	}
	t.Logf("uniform %d, squeezed %d, conservative %d of %d", rej, small, large, reps)
}
