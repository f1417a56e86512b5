package simulate

// TEMPORARY: replace with stats.KSUniform when i11-stats lands (brief M:
// another helper adds stats.KSUniform(ps []float64) (d, p float64) in
// harness/stats/ks.go). Until then this copy, with the same signature,
// lets the engine self-check build and be tested. Delete this file and
// ks_tmp_test.go, and call stats.KSUniform from selfcheck.go.

import (
	"math"
	"slices"
)

// ksUniform is the one-sample Kolmogorov-Smirnov test of values against
// U(0,1): d = sup |F_n(x) − x| and its p-value P(D_n ≥ d), exact by
// Marsaglia, Tsang and Wang (2003, "Evaluating Kolmogorov's distribution",
// J. Stat. Softw. 8(18)), with their own approximation in the far tail
// (n·d² > 7.24, or > 3.76 when n > 99), where it is accurate to their stated
// digits. No values: d 0, p 1.
func ksUniform(ps []float64) (d, p float64) {
	n := len(ps)
	if n == 0 {
		return 0, 1
	}
	x := slices.Clone(ps)
	slices.Sort(x)
	for i, v := range x {
		v = min(1, max(0, v))
		d = max(d, float64(i+1)/float64(n)-v, v-float64(i)/float64(n))
	}
	return d, ksSurvival(n, d)
}

// ksSurvival is P(D_n ≥ d) = 1 − K(n, d) (MTW's K).
func ksSurvival(n int, d float64) float64 {
	if d <= 0 {
		return 1
	}
	if d >= 1 {
		return 0
	}
	nf := float64(n)
	s := d * d * nf
	if s > 7.24 || (s > 3.76 && n > 99) {
		return min(1, 2*math.Exp(-(2.000071+0.331/math.Sqrt(nf)+1.409/nf)*s))
	}
	k := int(nf*d) + 1
	m := 2*k - 1
	h := float64(k) - nf*d
	hm := make([]float64, m*m)
	for i := range m {
		for j := range m {
			if i-j+1 >= 0 {
				hm[i*m+j] = 1
			}
		}
	}
	for i := range m {
		hm[i*m] -= math.Pow(h, float64(i+1))
		hm[(m-1)*m+i] -= math.Pow(h, float64(m-i))
	}
	if 2*h-1 > 0 {
		hm[(m-1)*m] += math.Pow(2*h-1, float64(m))
	}
	for i := range m {
		for j := range m {
			for g := 1; g <= i-j+1; g++ {
				hm[i*m+j] /= float64(g)
			}
		}
	}
	q, e := ksPower(hm, 0, m, n)
	v := q[(k-1)*m+k-1]
	for i := 1; i <= n; i++ {
		v = v * float64(i) / nf
		if v < 1e-140 {
			v *= 1e140
			e -= 140
		}
	}
	cdf := v * math.Pow(10, float64(e))
	return min(1, max(0, 1-cdf))
}

// ksPower is MTW's mPower: a^n with a decimal exponent kept apart.
func ksPower(a []float64, ea, m, n int) ([]float64, int) {
	if n == 1 {
		return slices.Clone(a), ea
	}
	v, ev := ksPower(a, ea, m, n/2)
	b := ksMul(v, v, m)
	eb := 2 * ev
	if n%2 == 0 {
		v, ev = b, eb
	} else {
		v, ev = ksMul(a, b, m), ea+eb
	}
	if v[(m/2)*m+m/2] > 1e140 {
		for i := range v {
			v[i] *= 1e-140
		}
		ev += 140
	}
	return v, ev
}

func ksMul(a, b []float64, m int) []float64 {
	c := make([]float64, m*m)
	for i := range m {
		for l := range m {
			x := a[i*m+l]
			if x == 0 {
				continue
			}
			for j := range m {
				c[i*m+j] += x * b[l*m+j]
			}
		}
	}
	return c
}
