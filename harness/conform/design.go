package conform

import (
	"github.com/kpsim/kpsim/harness/stats"
)

// tester is a distribution check's test, fed cumulative counts per endpoint
// look by look.
type tester interface {
	look(counts []float64) (stats.SeqDecision, error)
	result() stats.Result
}

// distributionDesign is how a distribution check samples and tests.
type distributionDesign struct {
	looks    []int
	fixedN   int     // the fixed-size chi-square's n at the same alpha and power
	achieved float64 // power at the check's MDE
	expected float64 // expected n on a correct dataplane
	newTest  func() tester
}

// designFor sizes a distribution check over shares p0 for power at a
// relative mde at alpha: sequential unless fixed.
func designFor(p0 []float64, mde, alpha, power float64, fixed bool) (distributionDesign, error) {
	if fixed {
		w2 := stats.EffectW2(p0, oneOff(p0, mde))
		n := stats.ChiSquareSampleSize(w2, len(p0)-1, alpha, power)
		if n <= 0 || n > maxProbesPerCheck {
			n = maxProbesPerCheck
		}
		return distributionDesign{looks: []int{n}, fixedN: n, achieved: stats.ChiSquarePower(n, w2, len(p0)-1, alpha), expected: float64(n),
			newTest: func() tester { return &fixedTest{p0: p0, alpha: alpha} }}, nil
	}
	d, err := stats.DesignSequentialOmnibus(p0, mde, alpha, power, maxProbesPerCheck)
	if err != nil {
		return distributionDesign{}, err
	}
	return distributionDesign{looks: d.Looks, fixedN: d.FixedN, achieved: d.Achieved, expected: d.ExpectedN0,
		newTest: func() tester { return seqTester{d.Start()} }}, nil
}

// fixedTest is the fixed-size chi-square: one look.
type fixedTest struct {
	p0    []float64
	alpha float64
	res   stats.Result
}

func (t *fixedTest) look(counts []float64) (stats.SeqDecision, error) {
	r, err := stats.ChiSquareGOF(counts, t.p0)
	if err != nil {
		return stats.SeqContinue, err
	}
	t.res = r
	if r.P <= t.alpha {
		return stats.SeqReject, nil
	}
	return stats.SeqAccept, nil
}

func (t *fixedTest) result() stats.Result { return t.res }

// seqTester adapts stats' sequential test.
type seqTester struct{ t *stats.SeqTest }

func (s seqTester) look(counts []float64) (stats.SeqDecision, error) { return s.t.Look(counts) }
func (s seqTester) result() stats.Result                             { return s.t.Result() }
