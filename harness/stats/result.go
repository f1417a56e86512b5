package stats

import (
	"errors"
	"fmt"
	"strings"
)

// Defaults of a run, from the statistics reference (shared/reference/statistics.md).
const (
	// DefaultFamilyAlpha is the family-wise error rate of a run, controlled with Holm.
	DefaultFamilyAlpha = 0.001
	// DefaultPower is the power each check is sized for at its minimum detectable effect.
	DefaultPower = 0.99
	// MinExpected is the smallest expected count a goodness-of-fit cell may have;
	// smaller cells are merged before testing.
	MinExpected = 5.0
)

// ErrInvalidArgument is wrapped by every error caused by a malformed input
// (mismatched lengths, negative or non-finite counts, probabilities that do not sum to 1).
var ErrInvalidArgument = errors.New("invalid argument")

// ErrTooFewObservations is wrapped when the observations are too few for the
// test to say anything (for example, merging cells below MinExpected leaves a
// single cell).
var ErrTooFewObservations = errors.New("too few observations")

// IsInvalidArgument reports whether err was caused by a malformed input.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsTooFewObservations reports whether err says the sample was too small to test.
func IsTooFewObservations(err error) bool { return errors.Is(err, ErrTooFewObservations) }

// Alternative selects the alternative hypothesis of a one-parameter test.
type Alternative int

const (
	// TwoSided tests p != p0.
	TwoSided Alternative = iota
	// Greater tests p > p0.
	Greater
	// Less tests p < p0.
	Less
)

// String returns the name R uses for the alternative: "two-sided", "greater" or "less".
func (a Alternative) String() string {
	switch a {
	case TwoSided:
		return "two-sided"
	case Greater:
		return "greater"
	case Less:
		return "less"
	}
	return fmt.Sprintf("Alternative(%d)", int(a))
}

func (a Alternative) valid() bool { return a == TwoSided || a == Greater || a == Less }

// Cell is one row of the observed-against-expected table of a test, after
// merging: Index lists the original cells (endpoints) it holds.
type Cell struct {
	Index    []int   `json:"index"`
	Observed float64 `json:"observed"`
	Expected float64 `json:"expected"`
}

// Result is the outcome of one test, with everything a verdict must report
// except the level used and the seed, which belong to the caller.
//
// All numbers are finite, so a Result always encodes as JSON.
type Result struct {
	// Test names the test, e.g. "chi-square goodness of fit".
	Test string `json:"test"`
	// Alternative is set for one-parameter tests ("two-sided", "greater", "less").
	Alternative string `json:"alternative,omitempty"`
	// Statistic is the test statistic (Pearson's X², the G statistic, or the
	// number of successes for the binomial test).
	Statistic float64 `json:"statistic"`
	// DF is the degrees of freedom (cells after merging, less one); 0 for exact tests.
	DF int `json:"df"`
	// P is the p-value. It is 0 when an impossible outcome was observed.
	P float64 `json:"p"`
	// N is the number of observations.
	N float64 `json:"n"`
	// EffectSize is Cohen's w = sqrt(X²/N), computed with Pearson's formula
	// over the tested cells whatever the test, so results are comparable.
	EffectSize float64 `json:"effect_size"`
	// MaxAbsDeviation is max_i |observed_i/N - p_i| over the original cells.
	MaxAbsDeviation float64 `json:"max_abs_deviation"`
	// Cells is the observed-against-expected table after merging; impossible
	// cells appear with Expected 0.
	Cells []Cell `json:"cells"`
	// Impossible lists the original cells that have probability 0 but
	// received observations (traffic to a not-ready endpoint, say).
	Impossible []int `json:"impossible,omitempty"`
	// Notes says what was done to the data (merges, dropped cells) and why.
	Notes []string `json:"notes,omitempty"`
}

// Rejects reports whether the test rejects its null hypothesis at level
// alpha, that is whether P <= alpha.
func (r Result) Rejects(alpha float64) bool { return r.P <= alpha }

// Table returns the observed-against-expected table as sorted, line-oriented
// text, one cell per line, for reports and golden files.
func (r Result) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: statistic=%.6g df=%d p=%.6g n=%g w=%.4g\n", r.Test, r.Statistic, r.DF, r.P, r.N, r.EffectSize)
	for _, c := range r.Cells {
		fmt.Fprintf(&b, "cell %v observed=%g expected=%.6g\n", c.Index, c.Observed, c.Expected)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	return b.String()
}
