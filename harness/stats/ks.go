package stats

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
)

// ksExactMaxN is the largest sample for which KSUniform computes the exact
// distribution; above it Stephens' corrected asymptotic is within 2 %
// relative (at n = 100; less in the tail and for larger n) and far cheaper.
const ksExactMaxN = 100

// KSUniform runs the one-sample Kolmogorov-Smirnov test of ps against the
// uniform distribution on [0, 1], for example of p-values that should be
// uniform on a correct subject. d is sup |F_n(x) - x| and p = P(D_n >= d).
//
// For n <= 100 the p-value is exact, by the matrix method of Marsaglia,
// Tsang and Wang, "Evaluating Kolmogorov's distribution", J. Stat. Softw. 8
// (2003), which R's ks.test also uses, with their approximation
// 2·exp(-(2.000071 + 0.331/√n + 1.409/n)·n·d²) in the far right tail
// (n·d² > 7.24, p below about 1e-6), and the closed form 2(1-d)^n for
// d >= 1 - 1/n. Above, it is the asymptotic Kolmogorov distribution at
// Stephens' corrected statistic (√n + 0.12 + 0.11/√n)·d. Values outside [0, 1]
// or NaN, or an empty sample, give NaN for both.
func KSUniform(ps []float64) (d, p float64) {
	n := len(ps)
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	s := slices.Clone(ps)
	for _, v := range s {
		if !(v >= 0 && v <= 1) {
			return math.NaN(), math.NaN()
		}
	}
	slices.Sort(s)
	nf := float64(n)
	for i, v := range s {
		d = max(d, float64(i+1)/nf-v, v-float64(i)/nf)
	}
	if n <= ksExactMaxN {
		return d, ksExactSurvival(n, d)
	}
	sq := math.Sqrt(nf)
	return d, kolmogorovSurvival((sq + 0.12 + 0.11/sq) * d)
}

// ksExactSurvival returns P(D_n >= d) for the one-sample statistic.
func ksExactSurvival(n int, d float64) float64 {
	nf := float64(n)
	switch {
	case d >= 1:
		return 0
	case d <= 0.5/nf:
		return 1
	case d >= 1-1/nf:
		return math.Min(1, 2*math.Pow(1-d, nf))
	}
	if s := d * d * nf; s > 7.24 || (s > 3.76 && n > 99) {
		return 2 * math.Exp(-(2.000071+0.331/math.Sqrt(nf)+1.409/nf)*s)
	}
	return min(1, max(0, 1-ksExactCDF(n, d)))
}

// ksExactCDF returns P(D_n < d) by Marsaglia, Tsang and Wang's method: an
// element of the n-th power of an m×m matrix, m = 2k-1 with k = ⌊n·d⌋+1,
// times n!/n^n, with powers of 10 kept apart so nothing overflows.
func ksExactCDF(n int, d float64) float64 {
	nf := float64(n)
	k := int(nf*d) + 1
	m := 2*k - 1
	h := float64(k) - nf*d
	H := mat.NewDense(m, m, nil)
	for i := range m {
		for j := range m {
			if i-j+1 >= 0 {
				H.Set(i, j, 1)
			}
		}
	}
	for i := range m {
		H.Set(i, 0, H.At(i, 0)-math.Pow(h, float64(i+1)))
		H.Set(m-1, i, H.At(m-1, i)-math.Pow(h, float64(m-i)))
	}
	if 2*h-1 > 0 {
		H.Set(m-1, 0, H.At(m-1, 0)+math.Pow(2*h-1, float64(m)))
	}
	for i := range m {
		for j := range m {
			if g := i - j + 1; g > 0 {
				lg, _ := math.Lgamma(float64(g + 1))
				H.Set(i, j, H.At(i, j)/math.Exp(lg))
			}
		}
	}
	Q, eQ := ksMatrixPower(H, n)
	s := Q.At(k-1, k-1)
	for i := 1; i <= n; i++ {
		s = s * float64(i) / nf
		if s < 1e-140 {
			s *= 1e140
			eQ -= 140
		}
	}
	return s * math.Pow(10, float64(eQ))
}

// ksMatrixPower returns A^n as V·10^e, rescaling whenever the centre
// element exceeds 1e140.
func ksMatrixPower(A *mat.Dense, n int) (*mat.Dense, int) {
	if n == 1 {
		return mat.DenseCopyOf(A), 0
	}
	V, eV := ksMatrixPower(A, n/2)
	var B mat.Dense
	B.Mul(V, V)
	e := 2 * eV
	if n%2 == 1 {
		var C mat.Dense
		C.Mul(A, &B)
		B = C
	}
	m, _ := B.Dims()
	if B.At(m/2, m/2) > 1e140 {
		B.Scale(1e-140, &B)
		e += 140
	}
	return &B, e
}

// kolmogorovSurvival returns Q(λ) = P(K >= λ) = 2 Σ_{j>=1} (-1)^{j-1} e^{-2j²λ²}
// of the Kolmogorov distribution, by that series for λ >= 1 and by the
// Jacobi-transformed series 1 - (√(2π)/λ) Σ e^{-(2j-1)²π²/(8λ²)} below,
// where it converges faster.
func kolmogorovSurvival(lambda float64) float64 {
	if lambda <= 0 {
		return 1
	}
	if lambda < 1 {
		var s float64
		for j := 1; j <= 20; j++ {
			t := math.Exp(-float64((2*j-1)*(2*j-1)) * math.Pi * math.Pi / (8 * lambda * lambda))
			s += t
			if t < 1e-17*s {
				break
			}
		}
		return min(1, max(0, 1-math.Sqrt(2*math.Pi)/lambda*s))
	}
	var s float64
	sign := 1.0
	for j := 1; j <= 100; j++ {
		t := math.Exp(-2 * float64(j*j) * lambda * lambda)
		s += sign * t
		if t < 1e-17*s {
			break
		}
		sign = -sign
	}
	return min(1, max(0, 2*s))
}
