package stats

import (
	"math/rand/v2"
	"testing"
)

func benchmarkObserved(k, n int) []float64 {
	r := rand.New(rand.NewPCG(1, 2))
	counts := make([]int, k)
	SampleMultinomial(r, n, Uniform(k), counts)
	obs := make([]float64, k)
	for i, c := range counts {
		obs[i] = float64(c)
	}
	return obs
}

func BenchmarkChiSquareGOF10(b *testing.B) {
	obs, p := benchmarkObserved(10, 42034), Uniform(10)
	for b.Loop() {
		if _, err := ChiSquareGOF(obs, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGTest10(b *testing.B) {
	obs, p := benchmarkObserved(10, 42034), Uniform(10)
	for b.Loop() {
		if _, err := GTest(obs, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSampleMultinomial10(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	p, out := Uniform(10), make([]int, 10)
	for b.Loop() {
		SampleMultinomial(r, 42034, p, out)
	}
}

func BenchmarkBinomialTest1e7(b *testing.B) {
	for b.Loop() {
		if _, err := BinomialTest(3_002_000, 10_000_000, 0.3, TwoSided); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkChiSquareSampleSize(b *testing.B) {
	w2 := EffectW2(Uniform(10), OneOffAlternative(10, 0.1))
	for b.Loop() {
		ChiSquareSampleSize(w2, 9, 0.001/30, 0.99)
	}
}
