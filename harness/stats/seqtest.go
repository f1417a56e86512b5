package stats

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrSeqDone is wrapped when Look is called on a test that has already
// decided or used its last look.
var ErrSeqDone = errors.New("sequential test already decided")

// SeqTest is one run of a sequential design: feed it the cumulative counts
// at each look until it decides.
type SeqTest struct {
	d          *SeqDesign
	look       int // looks taken
	counts     []float64
	decision   SeqDecision
	logM, maxL float64 // at the last look
	maxLogM    float64 // over the looks so far
	final      *Result // the chi-square at NMax, if it ran
	impossible []int
}

// Start begins a run of the test.
func (d *SeqDesign) Start() *SeqTest {
	return &SeqTest{d: d, maxLogM: math.Inf(-1), logM: math.Inf(-1), maxL: math.Inf(-1)}
}

// Look takes the cumulative counts per endpoint at the next look (their sum
// must be Looks[i], and no count may fall) and returns the decision: reject
// when the mixture likelihood ratio reaches 1/AlphaSeq, accept when every
// alternative's likelihood ratio is at most B, and at NMax without either
// the chi-square GOF at AlphaFinal. Traffic to a cell of probability 0 rejects
// at once (P = 0). Calling Look after a decision is an error (ErrSeqDone).
func (t *SeqTest) Look(counts []float64) (SeqDecision, error) {
	d := t.d
	if t.decision != SeqContinue || t.look >= len(d.Looks) {
		return t.decision, fmt.Errorf("could not take look %d: %w (%s)", t.look+1, ErrSeqDone, t.decision)
	}
	if err := t.checkCounts(counts); err != nil {
		return SeqContinue, fmt.Errorf("could not take look %d of %d: %w", t.look+1, len(d.Looks), err)
	}
	t.counts = slices.Clone(counts)
	t.look++
	for _, i := range d.zero {
		if counts[i] > 0 {
			t.impossible = append(t.impossible, i)
		}
	}
	if len(t.impossible) > 0 {
		t.decision = SeqReject
		return t.decision, nil
	}
	n := float64(d.Looks[t.look-1])
	t.maxL = d.maxLogLR(counts, n)
	t.logM = d.logMixture(counts, n, t.maxL)
	t.maxLogM = max(t.maxLogM, t.logM)
	t.decision = d.boundary(t.look-1, t.logM, t.maxL, d.pearsonX2(counts, n))
	if t.decision != SeqContinue || t.look < len(d.Looks) {
		return t.decision, nil
	}
	res, err := ChiSquareGOF(counts, d.P0)
	if err != nil {
		return SeqContinue, fmt.Errorf("could not run the final chi-square of the sequential test: %w", err)
	}
	t.final = &res
	t.decision = SeqAccept
	if res.P <= d.AlphaFinal {
		t.decision = SeqReject
	}
	return t.decision, nil
}

func (t *SeqTest) checkCounts(counts []float64) error {
	d := t.d
	if len(counts) != len(d.P0) {
		return fmt.Errorf("%d counts for %d endpoints: %w", len(counts), len(d.P0), ErrInvalidArgument)
	}
	var sum float64
	for i, c := range counts {
		if !(c >= 0) || math.IsInf(c, 0) || c != math.Trunc(c) {
			return fmt.Errorf("count %g of endpoint %d is not a non-negative integer: %w", c, i, ErrInvalidArgument)
		}
		if t.counts != nil && c < t.counts[i] {
			return fmt.Errorf("count of endpoint %d fell from %g to %g; counts are cumulative: %w", i, t.counts[i], c, ErrInvalidArgument)
		}
		sum += c
	}
	if want := float64(d.Looks[t.look]); sum != want {
		return fmt.Errorf("counts sum to %g, the look is at %g: %w", sum, want, ErrInvalidArgument)
	}
	return nil
}

// Final returns the chi-square goodness-of-fit result at NMax, or nil if
// the test stopped earlier (or has not reached it yet).
func (t *SeqTest) Final() *Result {
	if t.final == nil {
		return nil
	}
	r := *t.final
	return &r
}

// Decision returns the decision so far (SeqContinue before the first look).
func (t *SeqTest) Decision() SeqDecision { return t.decision }

// Result returns the test's outcome as a Result: Test "sequential LR
// (truncated)", Statistic the log mixture likelihood ratio at the last look
// (the quantity compared with LogReject), P the valid p-value
// min(1, pSeq·α/AlphaSeq, pFinal·α/AlphaFinal) (see the file comment), N the
// observations used, DF the positive cells less one, and the
// observed-against-expected table without merging. Before a decision it
// describes the looks so far, and its P is still valid.
func (t *SeqTest) Result() Result {
	d := t.d
	res := Result{Test: "sequential LR (truncated)", DF: len(d.positive) - 1}
	if !math.IsInf(t.logM, 0) {
		res.Statistic = t.logM
	}
	if t.counts == nil {
		res.P = 1
		res.Notes = []string{"no look taken"}
		return res
	}
	n := float64(d.Looks[t.look-1])
	res.N = n
	for i, p := range d.P0 {
		res.MaxAbsDeviation = max(res.MaxAbsDeviation, math.Abs(t.counts[i]/n-p))
		res.Cells = append(res.Cells, Cell{Index: []int{i}, Observed: t.counts[i], Expected: n * p})
	}
	res.EffectSize = math.Sqrt(d.pearsonX2(t.counts, n) / n)
	pSeq := min(1, math.Exp(-t.maxLogM))
	pFinal := 1.0
	if t.final != nil {
		pFinal = t.final.P
	}
	res.P = min(1, pSeq*d.Alpha/d.AlphaSeq, pFinal*d.Alpha/d.AlphaFinal)
	res.Notes = append(res.Notes, fmt.Sprintf("%s at look %d of %d (n = %g of NMax %d); max log LR %.4g, log mixture LR %.4g (reject at %.4g, accept at max <= %.4g); pSeq %.4g, pFinal %.4g",
		t.decision, t.look, len(d.Looks), n, d.Looks[len(d.Looks)-1], t.maxL, t.logM, d.LogReject, d.LogAccept, pSeq, pFinal))
	if t.final != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("final chi-square at NMax: X² = %.6g, df %d, p = %.6g against AlphaFinal %.3g", t.final.Statistic, t.final.DF, t.final.P, d.AlphaFinal))
		res.Notes = append(res.Notes, t.final.Notes...)
	}
	if len(t.impossible) > 0 {
		res.P = 0
		res.Impossible = slices.Clone(t.impossible)
		res.Notes = append(res.Notes, fmt.Sprintf("cells %v have probability 0 but received observations: impossible outcome, p = 0", t.impossible))
	}
	return res
}
