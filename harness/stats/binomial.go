package stats

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// binomRelErr is the relative tolerance of the two-sided exact binomial
// test: outcomes whose probability is within it of the observed one count as
// "as extreme" (R's binom.test uses the same 1 + 1e-7).
const binomRelErr = 1 + 1e-7

// BinomialTest runs the exact binomial test of k successes in n trials
// against success probability p. TwoSided sums the probabilities of all
// outcomes no more likely than k (within a relative 1e-7, as R's
// binom.test); Greater gives P(X >= k), Less P(X <= k).
//
// Probabilities are computed in log space with Loader's saddle-point
// expansion and the tails summed outward from k, so the test stays accurate
// for n of 1e7 and more. When p is 0 or 1 the test is deterministic: an
// outcome that p forbids gives P = 0 whatever the alternative (where R's
// one-sided tests would give 1) and is listed in Result.Impossible (cell 0
// holds the successes, cell 1 the failures); any other outcome gives P = 1.
func BinomialTest(k, n int, p float64, alt Alternative) (Result, error) {
	res := Result{Test: "exact binomial", Alternative: alt.String()}
	switch {
	case n < 1:
		return res, fmt.Errorf("could not run exact binomial test: %d trials: %w", n, ErrTooFewObservations)
	case k < 0 || k > n:
		return res, fmt.Errorf("could not run exact binomial test: %d successes out of %d trials: %w", k, n, ErrInvalidArgument)
	case !(p >= 0 && p <= 1):
		return res, fmt.Errorf("could not run exact binomial test: probability %g is outside [0, 1]: %w", p, ErrInvalidArgument)
	case !alt.valid():
		return res, fmt.Errorf("could not run exact binomial test: unknown alternative %d: %w", int(alt), ErrInvalidArgument)
	}
	nf, kf := float64(n), float64(k)
	res.Statistic = kf
	res.N = nf
	res.MaxAbsDeviation = math.Abs(kf/nf - p)
	res.Cells = []Cell{
		{Index: []int{0}, Observed: kf, Expected: nf * p},
		{Index: []int{1}, Observed: nf - kf, Expected: nf * (1 - p)},
	}
	if p == 0 || p == 1 {
		res.Notes = append(res.Notes, fmt.Sprintf("p = %g: the outcome is deterministic and the effect size undefined", p))
		res.P = 1
		switch {
		case p == 0 && k > 0:
			res.Impossible = []int{0}
		case p == 1 && k < n:
			res.Impossible = []int{1}
		}
		if len(res.Impossible) > 0 {
			res.P = 0
			res.Notes = append(res.Notes, "an outcome of probability 0 was observed: p = 0")
		}
		return res, nil
	}
	res.EffectSize = math.Abs(kf/nf-p) / math.Sqrt(p*(1-p))
	res.P = binomPValue(k, n, p, alt)
	return res, nil
}

// binomPValue returns the p-value of the exact test for 0 < p < 1.
func binomPValue(k, n int, p float64, alt Alternative) float64 {
	switch alt {
	case Greater:
		return binomUpper(k, n, p)
	case Less:
		return binomLower(k, n, p)
	}
	m := float64(n) * p
	kf := float64(k)
	if kf == m {
		return 1
	}
	ld := logBinomPMF(k, n, p) + math.Log(binomRelErr)
	var pv float64
	if kf < m {
		// Outcomes above the mean that are no more likely than k form a tail [j, n]:
		// the pmf does not increase on [ceil(m), n].
		lo, hi := int(math.Ceil(m)), n+1 // find the smallest j in [lo, n] with pmf(j) <= d
		for lo < hi {
			mid := lo + (hi-lo)/2
			if logBinomPMF(mid, n, p) <= ld {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		pv = binomLower(k, n, p) + binomUpper(lo, n, p)
	} else {
		// Outcomes below the mean no more likely than k form a tail [0, j]:
		// the pmf does not decrease on [0, floor(m)].
		lo, hi := -1, int(math.Floor(m)) // find the largest j in [0, floor(m)] with pmf(j) <= d
		for lo < hi {
			mid := hi - (hi-lo)/2
			if logBinomPMF(mid, n, p) <= ld {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		pv = binomLower(lo, n, p) + binomUpper(k, n, p)
	}
	return min(pv, 1)
}

// ClopperPearson returns the exact (Clopper-Pearson) confidence interval
// for a binomial proportion with k successes in n trials, from quantiles of
// distuv.Beta. For k = 0 the lower bound is 0, for k = n the upper bound is 1.
// It returns NaN bounds for k outside [0, n], n < 1, or a confidence outside (0, 1).
func ClopperPearson(k, n int, confidence float64) (lo, hi float64) {
	if n < 1 || k < 0 || k > n || !(confidence > 0 && confidence < 1) {
		return math.NaN(), math.NaN()
	}
	a := (1 - confidence) / 2
	kf, nf := float64(k), float64(n)
	lo, hi = 0, 1
	if k > 0 {
		lo = distuv.Beta{Alpha: kf, Beta: nf - kf + 1}.Quantile(a)
	}
	if k < n {
		// The upper bound as 1 - (lower quantile of the mirrored Beta), which
		// keeps its precision when confidence is close to 1.
		hi = 1 - distuv.Beta{Alpha: nf - kf, Beta: kf + 1}.Quantile(a)
	}
	return lo, hi
}

// BinomialPower returns the exact power of BinomialTest at level alpha with n
// trials when the null probability is p0 and the true one p1: the
// probability under p1 of the outcomes the test rejects (P <= alpha).
// With p1 = p0 it is the exact size of the test, which is at most alpha.
// It returns NaN for invalid arguments.
func BinomialPower(n int, p0, p1, alpha float64, alt Alternative) float64 {
	if n < 1 || !(p0 >= 0 && p0 <= 1) || !(p1 >= 0 && p1 <= 1) || !(alpha > 0 && alpha < 1) || !alt.valid() {
		return math.NaN()
	}
	lowMax, highMin := binomRejectionRegion(n, p0, alpha, alt)
	return binomLower(lowMax, n, p1) + binomUpper(highMin, n, p1)
}

// binomRejectionRegion returns the rejection region of the exact test as
// [0, lowMax] ∪ [highMin, n]; lowMax = -1 or highMin = n+1 mark an empty side.
func binomRejectionRegion(n int, p0, alpha float64, alt Alternative) (lowMax, highMin int) {
	lowMax, highMin = -1, n+1
	switch p0 {
	case 0: // deterministic: the forbidden outcomes reject, whatever the alternative
		return lowMax, 1
	case 1:
		return n - 1, highMin
	}
	pval := func(k int) float64 { return binomPValue(k, n, p0, alt) }
	m := float64(n) * p0
	if alt != Greater {
		// p-values do not decrease as k rises towards the mean.
		hi := n
		if alt == TwoSided {
			hi = int(math.Ceil(m)) - 1
		}
		lo := -1
		for lo < hi {
			mid := hi - (hi-lo)/2
			if pval(mid) <= alpha {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		lowMax = lo
	}
	if alt != Less {
		// p-values do not increase as k rises away from the mean.
		lo := 0
		if alt == TwoSided {
			lo = int(math.Floor(m)) + 1
		}
		hi := n + 1
		for lo < hi {
			mid := lo + (hi-lo)/2
			if pval(mid) <= alpha {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		highMin = lo
	}
	return lowMax, highMin
}

// BinomialSampleSize returns the smallest number of trials at which
// BinomialPower reaches power, or -1 if none can (p1 = p0, p1 on the wrong
// side of a one-sided test, invalid arguments, or more than 2^40 trials). Exact power is saw-toothed in n: the
// search bisects for a crossing and then scans the 2 % (at least 64 values)
// below it for an earlier one, and a slightly larger n can fall just short,
// so report BinomialPower at the n actually used.
func BinomialSampleSize(p0, p1, alpha, power float64, alt Alternative) int {
	if !(power > 0 && power < 1) || p0 == p1 || math.IsNaN(BinomialPower(1, p0, p1, alpha, alt)) ||
		(alt == Greater && p1 < p0) || (alt == Less && p1 > p0) {
		return -1
	}
	// The normal approximation tells cheaply whether the size is out of reach.
	a := alpha
	if alt == TwoSided {
		a /= 2
	}
	za, zb := distuv.UnitNormal.Quantile(1-a), distuv.UnitNormal.Quantile(power)
	approx := (za*math.Sqrt(p0*(1-p0)) + zb*math.Sqrt(p1*(1-p1))) / (p1 - p0)
	if approx*approx > 1<<40 {
		return -1
	}
	pw := func(n int) float64 { return BinomialPower(n, p0, p1, alpha, alt) }
	n := smallestReaching(pw, power)
	if n < 0 {
		return -1
	}
	scan := max(64, n/50)
	best := n
	for m := n - 1; m >= max(1, n-scan); m-- {
		if pw(m) >= power {
			best = m
		}
	}
	return best
}

// smallestReaching returns the smallest n >= 1 with f(n) >= target, assuming
// f increases with n (or at least that bisection is a fair guess), or -1 if
// none below 2^40 does.
func smallestReaching(f func(int) float64, target float64) int {
	if f(1) >= target {
		return 1
	}
	lo, hi := 1, 2
	for f(hi) < target {
		lo, hi = hi, hi*2
		if hi > 1<<40 {
			return -1
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if f(mid) >= target {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// logBinomPMF returns log P(X = k) for X ~ Binomial(n, p), by Loader's
// saddle-point expansion (as R's dbinom), accurate to a few ulps of the
// probability even for n of 1e9, where lgamma differences lose digits.
func logBinomPMF(k, n int, p float64) float64 {
	if k < 0 || k > n {
		return math.Inf(-1)
	}
	q := 1 - p
	switch {
	case p == 0:
		if k == 0 {
			return 0
		}
		return math.Inf(-1)
	case p == 1:
		if k == n {
			return 0
		}
		return math.Inf(-1)
	case k == 0:
		return float64(n) * math.Log1p(-p)
	case k == n:
		return float64(n) * math.Log(p)
	}
	nf, kf := float64(n), float64(k)
	lc := stirlerr(nf) - stirlerr(kf) - stirlerr(nf-kf) - bd0(kf, nf*p) - bd0(nf-kf, nf*q)
	lf := math.Log(2*math.Pi) + math.Log(kf) + math.Log1p(-kf/nf)
	return lc - 0.5*lf
}

// stirlerr returns log(n!) - log(sqrt(2πn) (n/e)^n), the error of Stirling's formula.
func stirlerr(n float64) float64 {
	const (
		s0 = 1.0 / 12
		s1 = 1.0 / 360
		s2 = 1.0 / 1260
		s3 = 1.0 / 1680
		s4 = 1.0 / 1188
	)
	if n <= 15 {
		lg, _ := math.Lgamma(n + 1)
		return lg - (n+0.5)*math.Log(n) + n - 0.5*math.Log(2*math.Pi)
	}
	nn := n * n
	switch {
	case n > 500:
		return (s0 - s1/nn) / n
	case n > 80:
		return (s0 - (s1-s2/nn)/nn) / n
	case n > 35:
		return (s0 - (s1-(s2-s3/nn)/nn)/nn) / n
	}
	return (s0 - (s1-(s2-(s3-s4/nn)/nn)/nn)/nn) / n
}

// bd0 returns x log(x/np) + np - x without the cancellation of the direct
// formula when x is close to np (Loader 2000).
func bd0(x, np float64) float64 {
	if math.Abs(x-np) < 0.1*(x+np) {
		v := (x - np) / (x + np)
		s := (x - np) * v
		ej := 2 * x * v
		v *= v
		for j := 1; j < 1000; j++ {
			ej *= v
			s1 := s + ej/float64(2*j+1)
			if s1 == s {
				return s1
			}
			s = s1
		}
	}
	return x*math.Log(x/np) + np - x
}

// binomMode returns floor((n+1)p) clipped to [0, n]: the pmf does not
// decrease up to it and does not increase after it.
func binomMode(n int, p float64) int {
	return min(max(int(math.Floor(float64(n+1)*p)), 0), n)
}

// binomLower returns P(X <= k).
func binomLower(k, n int, p float64) float64 {
	switch {
	case k < 0:
		return 0
	case k >= n || p == 0:
		return 1
	case p == 1:
		return 0
	}
	if k <= binomMode(n, p) {
		return binomTailSum(k, n, p, false)
	}
	return max(1-binomTailSum(k+1, n, p, true), 0)
}

// binomUpper returns P(X >= k).
func binomUpper(k, n int, p float64) float64 {
	switch {
	case k <= 0:
		return 1
	case k > n || p == 0:
		return 0
	case p == 1:
		return 1
	}
	if k >= binomMode(n, p) {
		return binomTailSum(k, n, p, true)
	}
	return max(1-binomTailSum(k-1, n, p, false), 0)
}

// binomTailSum sums the pmf from k outward (upward if up, else downward),
// which the callers guarantee is away from the mode, so terms only shrink.
// The sum is kept relative to pmf(k) so that it neither underflows nor overflows.
func binomTailSum(k, n int, p float64, up bool) float64 {
	lp := logBinomPMF(k, n, p)
	if math.IsInf(lp, -1) {
		return 0
	}
	r := p / (1 - p)
	s, t := 1.0, 1.0
	if up {
		for i := k; i < n; i++ {
			t *= float64(n-i) / float64(i+1) * r
			s += t
			if t < 1e-17*s {
				break
			}
		}
	} else {
		for i := k; i > 0; i-- {
			t *= float64(i) / float64(n-i+1) / r
			s += t
			if t < 1e-17*s {
				break
			}
		}
	}
	return math.Min(math.Exp(lp+math.Log(s)), 1)
}
