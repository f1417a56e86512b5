package stats

import (
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// probSumTol is how far from 1 the expected values may sum and still be read
// as probabilities; otherwise they must be counts summing to N within it (relatively).
const probSumTol = 1e-9

// ChiSquareGOF runs Pearson's chi-square goodness-of-fit test of observed
// counts against expected, which holds either probabilities (summing to 1
// within 1e-9) or expected counts (summing to the observed total within a
// relative 1e-9); anything else is an error.
//
// Cells whose expected count is below MinExpected are merged, smallest with
// next smallest, until every cell reaches it; each merge is named in Notes.
// A cell of probability 0 that received observations is an impossible
// outcome: P is 0, the cell is listed in Result.Impossible, and the statistic
// is computed over the other cells. Cells of probability 0 without
// observations are left out. The statistic is gonum's stat.ChiSquare, with
// df = cells - 1 and P from distuv.ChiSquared.Survival.
func ChiSquareGOF(observed, expected []float64) (Result, error) {
	return goodnessOfFit(pearson, observed, expected)
}

// GTest runs the log-likelihood-ratio (G) goodness-of-fit test,
// G = 2 Σ O ln(O/E), with the same inputs, merging, impossible-cell rule and
// Result as ChiSquareGOF.
func GTest(observed, expected []float64) (Result, error) {
	return goodnessOfFit(likelihoodRatio, observed, expected)
}

type gofKind int

const (
	pearson gofKind = iota
	likelihoodRatio
)

func (k gofKind) name() string {
	if k == likelihoodRatio {
		return "G-test goodness of fit"
	}
	return "chi-square goodness of fit"
}

// group is a cell after merging.
type group struct {
	index    []int
	observed float64
	expected float64
}

func goodnessOfFit(kind gofKind, observed, expected []float64) (Result, error) {
	res := Result{Test: kind.name()}
	probs, n, err := gofProbabilities(observed, expected)
	if err != nil {
		return res, fmt.Errorf("could not run %s: %w", kind.name(), err)
	}
	res.N = n

	var groups []group
	var empty []int
	for i, p := range probs {
		dev := math.Abs(observed[i]/n - p)
		res.MaxAbsDeviation = max(res.MaxAbsDeviation, dev)
		switch {
		case p > 0:
			groups = append(groups, group{index: []int{i}, observed: observed[i], expected: n * p})
		case observed[i] > 0:
			res.Impossible = append(res.Impossible, i)
		default:
			empty = append(empty, i)
		}
	}
	if len(empty) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("cells %v have probability 0 and no observations: left out", empty))
	}
	for _, i := range res.Impossible {
		res.Notes = append(res.Notes, fmt.Sprintf("cell %d has probability 0 but received %g observations: impossible outcome, p = 0", i, observed[i]))
	}

	possible := len(groups)
	groups, notes := mergeSmallCells(groups)
	res.Notes = append(res.Notes, notes...)
	for _, g := range groups {
		res.Cells = append(res.Cells, Cell{Index: g.index, Observed: g.observed, Expected: g.expected})
	}
	for _, i := range res.Impossible {
		res.Cells = append(res.Cells, Cell{Index: []int{i}, Observed: observed[i], Expected: 0})
	}

	impossible := len(res.Impossible) > 0
	if len(groups) < 2 {
		switch {
		case possible == 1:
			// A single possible cell: nothing to fit, only the impossible-outcome check.
			res.Notes = append(res.Notes, "a single cell has positive probability: the test reduces to the impossible-outcome check")
			res.P = 1
		case impossible:
			res.Notes = append(res.Notes, "too few observations to test the possible cells")
		default:
			return res, fmt.Errorf("could not run %s: %g observations leave fewer than two cells with an expected count of %g: %w",
				kind.name(), n, MinExpected, ErrTooFewObservations)
		}
		if impossible {
			res.P = 0
		}
		return res, nil
	}

	obs := make([]float64, len(groups))
	exp := make([]float64, len(groups))
	for i, g := range groups {
		obs[i], exp[i] = g.observed, g.expected
	}
	chi2 := stat.ChiSquare(obs, exp)
	res.EffectSize = math.Sqrt(chi2 / n)
	res.DF = len(groups) - 1
	switch kind {
	case pearson:
		res.Statistic = chi2
	case likelihoodRatio:
		res.Statistic = gStatistic(obs, exp)
	}
	res.P = distuv.ChiSquared{K: float64(res.DF)}.Survival(res.Statistic)
	if impossible {
		res.P = 0
	}
	return res, nil
}

// gofProbabilities validates the inputs and returns the cell probabilities
// and the number of observations.
func gofProbabilities(observed, expected []float64) ([]float64, float64, error) {
	if len(observed) != len(expected) {
		return nil, 0, fmt.Errorf("%d observed cells but %d expected: %w", len(observed), len(expected), ErrInvalidArgument)
	}
	if len(observed) == 0 {
		return nil, 0, fmt.Errorf("no cells: %w", ErrInvalidArgument)
	}
	var n, s float64
	for i := range observed {
		o, e := observed[i], expected[i]
		if o < 0 || math.IsNaN(o) || math.IsInf(o, 0) {
			return nil, 0, fmt.Errorf("observed count %g of cell %d is not a finite non-negative number: %w", o, i, ErrInvalidArgument)
		}
		if e < 0 || math.IsNaN(e) || math.IsInf(e, 0) {
			return nil, 0, fmt.Errorf("expected value %g of cell %d is not a finite non-negative number: %w", e, i, ErrInvalidArgument)
		}
		n += o
		s += e
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("no observations: %w", ErrTooFewObservations)
	}
	isProb := math.Abs(s-1) <= probSumTol
	isCount := math.Abs(s-n) <= probSumTol*n
	if !isProb && !isCount {
		return nil, 0, fmt.Errorf("expected values sum to %.12g: neither probabilities (sum 1) nor counts (sum %g, the observed total): %w",
			s, n, ErrInvalidArgument)
	}
	probs := make([]float64, len(expected))
	for i, e := range expected {
		probs[i] = e / s
	}
	return probs, n, nil
}

// mergeSmallCells merges the cell of smallest expected count with the next
// smallest until every cell reaches MinExpected or one cell is left. Cells
// come back in the order of their first original index.
func mergeSmallCells(groups []group) ([]group, []string) {
	merged := false
	for len(groups) > 1 {
		slices.SortStableFunc(groups, func(a, b group) int {
			if a.expected != b.expected {
				if a.expected < b.expected {
					return -1
				}
				return 1
			}
			return a.index[0] - b.index[0]
		})
		if groups[0].expected >= MinExpected {
			break
		}
		a, b := groups[0], groups[1]
		m := group{
			index:    slices.Sorted(slices.Values(append(slices.Clone(a.index), b.index...))),
			observed: a.observed + b.observed,
			expected: a.expected + b.expected,
		}
		groups = append([]group{m}, groups[2:]...)
		merged = true
	}
	slices.SortFunc(groups, func(a, b group) int { return a.index[0] - b.index[0] })
	var notes []string
	if merged {
		for _, g := range groups {
			if len(g.index) > 1 {
				notes = append(notes, fmt.Sprintf("merged cells %v (expected count %.4g together): every cell needs an expected count of at least %g",
					g.index, g.expected, MinExpected))
			}
		}
	}
	return groups, notes
}

// gStatistic returns 2 Σ O ln(O/E), with 0 ln 0 = 0.
func gStatistic(obs, exp []float64) float64 {
	var g float64
	for i, o := range obs {
		if o > 0 {
			g += o * math.Log(o/exp[i])
		}
	}
	return max(2*g, 0)
}
