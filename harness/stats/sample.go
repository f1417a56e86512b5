package stats

import (
	"math"
	"math/rand/v2"
)

// SampleMultinomial draws n observations over the cells of p and writes the
// counts to out, by sequential conditional binomial draws (SampleBinomial),
// so a draw costs O(len(p)) whatever n. p holds non-negative weights that
// need not be normalised; the caller owns r and reports its seed. It panics
// if len(out) != len(p), n < 0, or p has a negative, non-finite or all-zero weight.
func SampleMultinomial(r *rand.Rand, n int, p []float64, out []int) {
	if len(out) != len(p) {
		panic("stats: slice length mismatch")
	}
	if n < 0 {
		panic("stats: negative number of draws")
	}
	var total float64
	last := -1
	for i, w := range p {
		if !(w >= 0) || math.IsInf(w, 0) {
			panic("stats: weight is negative or not finite")
		}
		total += w
		if w > 0 {
			last = i
		}
	}
	if last < 0 {
		panic("stats: all weights are zero")
	}
	left, rest := n, total
	for i, w := range p {
		switch {
		case left == 0 || w == 0:
			out[i] = 0
		case i == last:
			out[i] = left
			left = 0
		default:
			q := 1.0 // rest can fall to w or below only through rounding
			if rest > w {
				q = w / rest
			}
			x := SampleBinomial(r, left, q)
			out[i] = x
			left -= x
			rest -= w
		}
	}
}

// SampleBinomial draws from Binomial(n, p) with the random source r:
// inversion when min(p, 1-p)·n < 10, otherwise Hörmann's BTRS
// transformed-rejection sampler (1993), which is exact and takes O(1) time.
// It panics if n < 0 or p is outside [0, 1].
func SampleBinomial(r *rand.Rand, n int, p float64) int {
	if n < 0 || !(p >= 0 && p <= 1) {
		panic("stats: invalid binomial parameters")
	}
	if n == 0 || p == 0 {
		return 0
	}
	if p == 1 {
		return n
	}
	if p > 0.5 {
		return n - SampleBinomial(r, n, 1-p)
	}
	if float64(n)*p < 10 {
		return binomialInversion(r, n, p)
	}
	return binomialBTRS(r, n, p)
}

// binomialInversion walks the cumulative distribution from 0; for n·p < 10
// it takes a handful of steps. A walk that runs off the end through rounding
// starts again.
func binomialInversion(r *rand.Rand, n int, p float64) int {
	q := 1 - p
	s := p / q
	a := float64(n+1) * s
	r0 := math.Exp(float64(n) * math.Log1p(-p))
	for {
		u := r.Float64()
		pr := r0
		x := 0
		for u > pr {
			u -= pr
			x++
			if x > n {
				break
			}
			pr *= a/float64(x) - s
		}
		if x <= n {
			return x
		}
	}
}

// binomialBTRS is algorithm BTRS of W. Hörmann, "The generation of binomial
// random variates", J. Stat. Comput. Simul. 46 (1993), for p <= 0.5 and
// n·p >= 10; the acceptance test uses the exact log-pmf ratio.
func binomialBTRS(r *rand.Rand, n int, p float64) int {
	nf := float64(n)
	spq := math.Sqrt(nf * p * (1 - p))
	b := 1.15 + 2.53*spq
	a := -0.0873 + 0.0248*b + 0.01*p
	c := nf*p + 0.5
	vr := 0.92 - 4.2/b
	alpha := (2.83 + 5.1/b) * spq
	m := int(math.Floor((nf + 1) * p))
	// The log-pmf at the mode is needed only when the squeeze fails, so it is
	// computed then (once): most draws return before, and the draws are the
	// same as with an eager computation.
	lpm, haveLpm := 0.0, false
	for {
		u := r.Float64() - 0.5
		v := r.Float64()
		us := 0.5 - math.Abs(u)
		kf := math.Floor((2*a/us+b)*u + c)
		if kf < 0 || kf > nf {
			continue
		}
		k := int(kf)
		if us >= 0.07 && v <= vr {
			return k
		}
		v = math.Log(v * alpha / (a/(us*us) + b))
		if !haveLpm {
			lpm, haveLpm = logBinomPMF(m, n, p), true
		}
		if v <= logBinomPMF(k, n, p)-lpm {
			return k
		}
	}
}
