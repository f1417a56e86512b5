package stats

import (
	"math/rand/v2"
	"testing"
)

func TestScratchGPower(t *testing.T) {
	for _, c := range []struct {
		k     int
		delta float64
	}{{10, 0.05}, {10, -0.05}, {10, 0.02}, {3, 0.05}, {5, 0.03}, {10, 0.1}} {
		null, alt := Uniform(c.k), OneOffAlternative(c.k, c.delta)
		w2 := EffectW2(null, alt)
		n := ChiSquareSampleSize(w2, c.k-1, 0.01, 0.8)
		r := rand.New(rand.NewPCG(99, uint64(c.k)))
		counts := make([]int, c.k)
		obs := make([]float64, c.k)
		const reps = 100000
		var x2, g int
		for range reps {
			SampleMultinomial(r, n, alt, counts)
			for i, v := range counts {
				obs[i] = float64(v)
			}
			a, _ := ChiSquareGOF(obs, null)
			b, _ := GTest(obs, null)
			if a.P <= 0.01 {
				x2++
			}
			if b.P <= 0.01 {
				g++
			}
		}
		t.Logf("k=%d delta=%g n=%d theory %.4f X2 %.4f G %.4f", c.k, c.delta, n, ChiSquarePower(n, w2, c.k-1, 0.01), float64(x2)/reps, float64(g)/reps)
	}
}
