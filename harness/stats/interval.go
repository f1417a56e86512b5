package stats

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// SimultaneousIntervals returns Clopper-Pearson intervals for the share of
// each cell (counts[i] of their total n) that hold together with
// probability at least conf: each is at level 1 - (1-conf)/k (Bonferroni
// over the k cells). Counts must be non-negative integers with a positive
// total and conf in (0, 1); otherwise every bound is NaN.
func SimultaneousIntervals(counts []float64, conf float64) (lo, hi []float64) {
	k := len(counts)
	lo, hi = make([]float64, k), make([]float64, k)
	n, ok := integerTotal(counts)
	if !ok || !(conf > 0 && conf < 1) {
		for i := range lo {
			lo[i], hi[i] = math.NaN(), math.NaN()
		}
		return lo, hi
	}
	each := 1 - (1-conf)/float64(k)
	for i, c := range counts {
		lo[i], hi[i] = ClopperPearson(int(c), n, each)
	}
	return lo, hi
}

// integerTotal returns the total of counts if they are all non-negative
// integers and it is positive.
func integerTotal(counts []float64) (int, bool) {
	var n float64
	for _, c := range counts {
		if !(c >= 0) || math.IsInf(c, 0) || c != math.Trunc(c) {
			return 0, false
		}
		n += c
	}
	return int(n), n >= 1 && n < 1<<53
}

// EquivalenceResult is the outcome of Equivalence.
type EquivalenceResult struct {
	// Holds is set when every share is shown to lie within (1 ± Delta)·p0_i
	// at level Alpha (P <= Alpha).
	Holds bool `json:"holds"`
	// P is the largest of the per-endpoint TOST p-values: the p-value of the
	// intersection-union test.
	P float64 `json:"p"`
	// PerEndpoint holds each endpoint's TOST p-value, max(P(X >= x | lower
	// bound), P(X <= x | upper bound)).
	PerEndpoint []float64 `json:"per_endpoint"`
	// Worst is the endpoint with the largest p-value; WorstLo and WorstHi its
	// Clopper-Pearson interval at 1 - 2·Alpha (inside the margin exactly
	// when that endpoint passes), WorstMarginLo and WorstMarginHi its margin.
	Worst         int     `json:"worst"`
	WorstLo       float64 `json:"worst_lo"`
	WorstHi       float64 `json:"worst_hi"`
	WorstMarginLo float64 `json:"worst_margin_lo"`
	WorstMarginHi float64 `json:"worst_margin_hi"`
	// Delta is the relative margin, Alpha the level, N the observations.
	Delta float64 `json:"delta"`
	Alpha float64 `json:"alpha"`
	N     float64 `json:"n"`
	// Notes says how endpoints of probability 0 were treated.
	Notes []string `json:"notes,omitempty"`
}

// Equivalence tests that every endpoint's share lies within a relative
// delta of its expected share, (1-delta)·p0_i < p_i < (1+delta)·p0_i, by
// two one-sided exact binomial tests per endpoint (TOST): H0_i is
// "p_i <= lower or p_i >= upper", rejected when both P(X >= x | lower) and
// P(X <= x | upper) are at most alpha. An upper bound at or above 1 makes
// that side's null empty (p-value 0).
//
// The claim "every share is within the margin" is rejected only if every
// H0_i is: an intersection-union test (Berger 1982). It needs no
// multiplicity correction: whatever the true shares, if the claim is false
// some H0_i is true, and the probability of rejecting all of them is at most
// that of rejecting this one, which is at most alpha. (The price is
// conservatism, not error.)
//
// Endpoints with p0_i = 0 are not tested by TOST (a share of exactly 0
// cannot be shown by sampling); they are the impossible-outcome check's:
// traffic to one gives p-value 1 there, none gives 0, and a note says so.
// Invalid inputs (length mismatch, counts that are not non-negative
// integers, p0 not summing to 1, delta outside (0, 1), alpha outside
// (0, 0.5)) give an error.
func Equivalence(counts, p0 []float64, delta, alpha float64) (EquivalenceResult, error) {
	res := EquivalenceResult{Delta: delta, Alpha: alpha}
	if err := equivalenceArgs(counts, p0, delta, alpha); err != nil {
		return res, fmt.Errorf("could not run equivalence test: %w", err)
	}
	n, _ := integerTotal(counts)
	res.N = float64(n)
	res.PerEndpoint = make([]float64, len(counts))
	res.Worst = -1
	for i, p := range p0 {
		x := int(counts[i])
		var pi float64
		if p == 0 {
			if x > 0 {
				pi = 1
			}
			res.Notes = append(res.Notes, fmt.Sprintf("endpoint %d has probability 0 and %d observations: impossible-outcome check, not TOST", i, x))
		} else {
			lower, upper := equivalenceMargin(p, delta)
			pi = binomUpper(x, n, lower)
			if upper < 1 {
				pi = max(pi, binomLower(x, n, upper))
			}
		}
		res.PerEndpoint[i] = pi
		if res.Worst < 0 || pi > res.P {
			res.Worst, res.P = i, pi
		}
	}
	res.Holds = res.P <= alpha
	res.WorstLo, res.WorstHi = ClopperPearson(int(counts[res.Worst]), n, 1-2*alpha)
	res.WorstMarginLo, res.WorstMarginHi = equivalenceMargin(p0[res.Worst], delta)
	return res, nil
}

func equivalenceMargin(p, delta float64) (lower, upper float64) {
	return (1 - delta) * p, min(1, (1+delta)*p)
}

func equivalenceArgs(counts, p0 []float64, delta, alpha float64) error {
	switch {
	case len(counts) != len(p0) || len(counts) == 0:
		return fmt.Errorf("%d counts for %d probabilities: %w", len(counts), len(p0), ErrInvalidArgument)
	case !(delta > 0 && delta < 1):
		return fmt.Errorf("relative margin %g is outside (0, 1): %w", delta, ErrInvalidArgument)
	case !(alpha > 0 && alpha < 0.5):
		return fmt.Errorf("alpha %g is outside (0, 0.5): %w", alpha, ErrInvalidArgument)
	}
	if _, ok := integerTotal(counts); !ok {
		return fmt.Errorf("counts %v are not non-negative integers with a positive total: %w", counts, ErrInvalidArgument)
	}
	var s float64
	for i, p := range p0 {
		if !(p >= 0 && p <= 1) {
			return fmt.Errorf("probability %g of endpoint %d is outside [0, 1]: %w", p, i, ErrInvalidArgument)
		}
		s += p
	}
	if math.Abs(s-1) > probSumTol {
		return fmt.Errorf("probabilities sum to %.12g, not 1: %w", s, ErrInvalidArgument)
	}
	return nil
}

// EquivalenceSampleSize returns the number of observations at which
// Equivalence, with shares exactly p0, shows equivalence within the
// relative margin delta at level alpha with probability at least power, by
// the normal approximation: endpoint i misses with probability about
// 2·Φ(z_{1-alpha} - delta·p0_i·sqrt(n)/sqrt(p0_i(1-p0_i))), and the misses
// are held to (1-power)/k each (Bonferroni over the k endpoints of positive
// probability, which makes the size conservative). TestEquivalenceSampleSize
// checks it by simulation. It returns -1 for invalid arguments.
func EquivalenceSampleSize(p0 []float64, delta, alpha, power float64) int {
	counts := make([]float64, len(p0))
	for i := range counts {
		counts[i] = 1
	}
	if equivalenceArgs(counts, p0, delta, alpha) != nil || !(power > 0 && power < 1) {
		return -1
	}
	k := 0
	for _, p := range p0 {
		if p > 0 {
			k++
		}
	}
	za := distuv.UnitNormal.Quantile(1 - alpha)
	zb := distuv.UnitNormal.Quantile(1 - (1-power)/float64(2*k))
	var n float64
	for _, p := range p0 {
		if p > 0 && p < 1 {
			n = max(n, math.Pow((za+zb)*math.Sqrt(p*(1-p))/(delta*p), 2))
		}
	}
	return max(1, int(math.Ceil(n)))
}
