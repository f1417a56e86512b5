package stats

import (
	"math"
	"slices"
)

// KSUniformUpper is the one-sided Kolmogorov-Smirnov test that ps are not
// stochastically smaller than U(0,1): D+ = max_i (i/n - p_(i)), with the
// exact p-value of Birnbaum and Tingey (1951),
//
//	P(D+ >= d) = d * sum_{j=0}^{floor(n(1-d))} C(n,j) (1-d-j/n)^(n-j) (d+j/n)^(j-1).
//
// A valid but conservative test (the sequential one) gives p-values that
// pile up near 1: the two-sided test rejects them, this one does not. Only
// p-values too often small, the sign of a test whose false-rejection rate
// exceeds its level, give a small p here.
func KSUniformUpper(ps []float64) (dplus, p float64) {
	n := len(ps)
	if n == 0 {
		return 0, 1
	}
	s := slices.Clone(ps)
	slices.Sort(s)
	for i, v := range s {
		dplus = max(dplus, float64(i+1)/float64(n)-v)
	}
	if dplus <= 0 {
		return 0, 1
	}
	if dplus >= 1 {
		return 1, 0
	}
	return dplus, birnbaumTingey(n, dplus)
}

func birnbaumTingey(n int, d float64) float64 {
	nf := float64(n)
	lgN, _ := math.Lgamma(nf + 1)
	sum := 0.0
	for j := 0; j <= int(math.Floor(nf*(1-d))); j++ {
		a := 1 - d - float64(j)/nf
		b := d + float64(j)/nf
		if a <= 0 {
			continue
		}
		lj, _ := math.Lgamma(float64(j) + 1)
		lnj, _ := math.Lgamma(nf - float64(j) + 1)
		sum += math.Exp(lgN - lj - lnj + (nf-float64(j))*math.Log(a) + (float64(j)-1)*math.Log(b))
	}
	return min(1, max(0, d*sum))
}
