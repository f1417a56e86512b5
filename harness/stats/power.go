package stats

import (
	"math"

	"gonum.org/v1/gonum/mathext"
	"gonum.org/v1/gonum/stat/distuv"
)

// ncx2Tol bounds the Poisson mass left out of the noncentral chi-square
// mixture, absolutely; ncx2RelTol relative to the sum so far, so that small
// tails keep their digits.
const (
	ncx2Tol    = 1e-12
	ncx2RelTol = 1e-15
)

// NoncentralChiSquareSurvival returns P(X > x) for X noncentral chi-square
// with k degrees of freedom and noncentrality lambda (the mean is k+lambda).
//
// It sums the Poisson(lambda/2)-weighted mixture of central chi-square
// survival functions outward from the Poisson mode, until the Poisson mass
// left out on each side is below 1e-12 and below 1e-15 of the sum so far
// (bounded by a geometric series), so the result is accurate to 1e-12
// absolute and, down to about 1e-290, to some 1e-12 relative (the
// precision of gonum's incomplete gamma functions). gonum has no noncentral
// chi-square. It returns NaN for k <= 0, lambda < 0 or NaN arguments.
func NoncentralChiSquareSurvival(x, k, lambda float64) float64 {
	return ncx2(x, k, lambda, true)
}

// NoncentralChiSquareCDF returns P(X <= x) for X noncentral chi-square
// with k degrees of freedom and noncentrality lambda, summed like
// NoncentralChiSquareSurvival (so small CDF values keep their relative precision).
func NoncentralChiSquareCDF(x, k, lambda float64) float64 {
	return ncx2(x, k, lambda, false)
}

func ncx2(x, k, lambda float64, upper bool) float64 {
	if math.IsNaN(x) || !(k > 0) || !(lambda >= 0) || math.IsInf(k, 0) || math.IsInf(lambda, 0) {
		return math.NaN()
	}
	if x <= 0 || math.IsInf(x, 1) {
		if (x <= 0) == upper {
			return 1
		}
		return 0
	}
	central := func(df float64) float64 {
		if upper {
			return mathext.GammaIncRegComp(df/2, x/2)
		}
		return mathext.GammaIncReg(df/2, x/2)
	}
	if lambda == 0 {
		return central(k)
	}
	mu := lambda / 2
	j0 := math.Floor(mu)
	lg, _ := math.Lgamma(j0 + 1)
	w0 := math.Exp(-mu + j0*math.Log(mu) - lg)
	sum := w0 * central(k+2*j0)
	// Downward from the mode: w(j-1) = w(j) j/mu, and the mass below i is at
	// most w(i) r/(1-r) with r = i/mu < 1.
	w := w0
	for j := j0; j > 0; j-- {
		w *= j / mu
		i := j - 1
		sum += w * central(k+2*i)
		if r := i / mu; ncx2Done(w*r/(1-r), sum) {
			break
		}
	}
	// Upward: w(j+1) = w(j) mu/(j+1), and the mass above i is at most
	// w(i) r/(1-r) with r = mu/(i+1) < 1.
	w = w0
	for j := j0; ; j++ {
		w *= mu / (j + 1)
		i := j + 1
		sum += w * central(k+2*i)
		if r := mu / (i + 1); ncx2Done(w*r/(1-r), sum) {
			break
		}
	}
	return min(max(sum, 0), 1)
}

// ncx2Done reports whether Poisson mass left out, at most bound, is
// negligible against the sum so far (or underflows).
func ncx2Done(bound, sum float64) bool {
	return bound < ncx2Tol/2 && (bound < ncx2RelTol*sum || bound < 1e-300)
}

// chiSquareCritical returns the upper-alpha critical value of the central
// chi-square with df degrees of freedom (computed from the survival side so
// that tiny alphas keep their precision).
func chiSquareCritical(df int, alpha float64) float64 {
	return 2 * mathext.GammaIncRegCompInv(float64(df)/2, alpha)
}

func powerArgsValid(n int, w2 float64, df int, alpha float64) bool {
	return n >= 0 && w2 >= 0 && !math.IsInf(w2, 0) && df >= 1 && alpha > 0 && alpha < 1
}

// noncentralPower is the power at noncentrality lambda for the central
// critical value crit, exactly (noncentral chi-square) or by Patnaik.
type noncentralPower func(lambda float64, df int, crit float64) float64

func exactPower(lambda float64, df int, crit float64) float64 {
	return NoncentralChiSquareSurvival(crit, float64(df), lambda)
}

func patnaikPower(lambda float64, df int, crit float64) float64 {
	k := float64(df)
	c := (k + 2*lambda) / (k + lambda)
	nu := (k + lambda) * (k + lambda) / (k + 2*lambda)
	return distuv.ChiSquared{K: nu}.Survival(crit / c)
}

// ChiSquarePower returns the power of a chi-square test with df degrees of
// freedom at level alpha after n observations when the effect size is w2
// (EffectW2, Cohen's w squared): the noncentral chi-square survival, with
// noncentrality n·w2, at the central critical value. It returns NaN for
// invalid arguments.
func ChiSquarePower(n int, w2 float64, df int, alpha float64) float64 {
	if !powerArgsValid(n, w2, df, alpha) {
		return math.NaN()
	}
	return exactPower(float64(n)*w2, df, chiSquareCritical(df, alpha))
}

// ChiSquarePowerPatnaik is ChiSquarePower with Patnaik's approximation of
// the noncentral chi-square by a scaled central one, c·χ²(ν) with
// c = (df+2λ)/(df+λ) and ν = (df+λ)²/(df+2λ). The sample-size table of the
// statistics reference was computed this way; it is optimistic, by up to
// 7 % in n for df = 1 at power 0.99.
func ChiSquarePowerPatnaik(n int, w2 float64, df int, alpha float64) float64 {
	if !powerArgsValid(n, w2, df, alpha) {
		return math.NaN()
	}
	return patnaikPower(float64(n)*w2, df, chiSquareCritical(df, alpha))
}

// RequiredNoncentrality returns the noncentrality λ at which a chi-square
// test with df degrees of freedom at level alpha has the given power
// (exact noncentral chi-square), to a relative 1e-12; the sample size for
// effect w² is then about λ/w². It returns NaN for invalid arguments.
func RequiredNoncentrality(df int, alpha, power float64) float64 {
	return requiredNoncentrality(exactPower, df, alpha, power)
}

// RequiredNoncentralityPatnaik is RequiredNoncentrality under Patnaik's
// approximation. The reference table's sizes are round(λ/w²) of this λ.
func RequiredNoncentralityPatnaik(df int, alpha, power float64) float64 {
	return requiredNoncentrality(patnaikPower, df, alpha, power)
}

func requiredNoncentrality(pw noncentralPower, df int, alpha, power float64) float64 {
	if !powerArgsValid(0, 0, df, alpha) || !(power > 0 && power < 1) {
		return math.NaN()
	}
	crit := chiSquareCritical(df, alpha)
	if pw(0, df, crit) >= power {
		return 0
	}
	lo, hi := 0.0, 1.0
	for pw(hi, df, crit) < power {
		lo, hi = hi, 2*hi
		if hi > 1e15 {
			return math.NaN()
		}
	}
	for hi-lo > 1e-12*hi {
		mid := lo + (hi-lo)/2
		if pw(mid, df, crit) >= power {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// ChiSquareSampleSize returns the smallest n at which ChiSquarePower
// reaches power, or -1 if none can (w2 <= 0, power outside (0, 1), invalid
// arguments, or more than 2^40 observations). It is about
// RequiredNoncentrality/w2, rounded up.
func ChiSquareSampleSize(w2 float64, df int, alpha, power float64) int {
	return chiSquareSampleSize(exactPower, w2, df, alpha, power)
}

// ChiSquareSampleSizePatnaik is ChiSquareSampleSize under Patnaik's
// approximation. The reference table rounds λ/w² to the nearest integer
// instead of up, so this is the table's value or one more.
func ChiSquareSampleSizePatnaik(w2 float64, df int, alpha, power float64) int {
	return chiSquareSampleSize(patnaikPower, w2, df, alpha, power)
}

func chiSquareSampleSize(pw noncentralPower, w2 float64, df int, alpha, power float64) int {
	if !(w2 > 0) || !powerArgsValid(1, w2, df, alpha) || !(power > 0 && power < 1) {
		return -1
	}
	lambda := requiredNoncentrality(pw, df, alpha, power)
	if math.IsNaN(lambda) || lambda/w2 > 1<<40 {
		return -1
	}
	// Settle the rounding against the power function itself.
	crit := chiSquareCritical(df, alpha)
	reaches := func(n int) bool { return pw(float64(n)*w2, df, crit) >= power }
	n := max(1, int(math.Ceil(lambda/w2)))
	for n > 1 && reaches(n-1) {
		n--
	}
	for !reaches(n) {
		n++
	}
	return n
}

// EffectW2 returns the effect size w² = Σ (p1_i - p0_i)² / p0_i of the
// alternative p1 against the null p0 (Cohen's w squared; the noncentrality
// after n observations is n·w²). A cell with p0 = 0 and p1 > 0 makes it +Inf
// (an impossible outcome, detected outright). It panics if the lengths differ.
func EffectW2(p0, p1 []float64) float64 {
	if len(p0) != len(p1) {
		panic("stats: slice length mismatch")
	}
	var w2 float64
	for i := range p0 {
		d := p1[i] - p0[i]
		if d == 0 {
			continue
		}
		if p0[i] == 0 {
			return math.Inf(1)
		}
		w2 += d * d / p0[i]
	}
	return w2
}

// OneOffAlternative returns the reference's alternative over k uniform
// endpoints: endpoint 0 gets (1+delta)/k, a relative deviation delta, and the
// other k-1 share the rest evenly. Its effect size is w² = delta²/(k-1).
// It panics if k < 2 or (1+delta)/k is outside [0, 1].
func OneOffAlternative(k int, delta float64) []float64 {
	if k < 2 {
		panic("stats: OneOffAlternative needs at least two endpoints")
	}
	first := (1 + delta) / float64(k)
	if !(first >= 0 && first <= 1) {
		panic("stats: OneOffAlternative deviation takes a probability outside [0, 1]")
	}
	p := make([]float64, k)
	p[0] = first
	rest := (1 - first) / float64(k-1)
	for i := 1; i < k; i++ {
		p[i] = rest
	}
	return p
}

// Uniform returns k equal probabilities 1/k, the null of a distribution check
// over k endpoints of equal weight.
func Uniform(k int) []float64 {
	p := make([]float64, k)
	for i := range p {
		p[i] = 1 / float64(k)
	}
	return p
}
