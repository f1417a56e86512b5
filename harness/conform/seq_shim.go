package conform

// TEMPORARY: the shape of harness/stats' sequential design (branch
// i11-stats) so that this branch builds before it lands. Replaced at merge.

import (
	"math"

	"github.com/kpsim/kpsim/harness/stats"
)

type seqDesign struct {
	P0                     []float64
	MDE, Alpha, Power      float64
	Looks                  []int
	FixedN                 int
	Achieved               float64
	ExpectedN0, ExpectedN1 float64
}

type seqDecision int

const (
	seqContinue seqDecision = iota
	seqReject
	seqAccept
)

func designSequential(p0 []float64, mde, alpha, power float64, maxN int) (*seqDesign, error) {
	w2 := stats.EffectW2(p0, oneOff(p0, mde))
	n := stats.ChiSquareSampleSize(w2, len(p0)-1, alpha, power)
	if n <= 0 || n > maxN {
		n = maxN
	}
	return &seqDesign{P0: p0, MDE: mde, Alpha: alpha, Power: power, Looks: []int{n}, FixedN: n,
		Achieved: stats.ChiSquarePower(n, w2, len(p0)-1, alpha), ExpectedN0: float64(n), ExpectedN1: float64(n)}, nil
}

type seqTest struct {
	d   *seqDesign
	i   int
	res stats.Result
}

func (d *seqDesign) start() *seqTest { return &seqTest{d: d} }

func (t *seqTest) look(counts []float64) (seqDecision, error) {
	t.i++
	if t.i < len(t.d.Looks) {
		return seqContinue, nil
	}
	r, err := stats.ChiSquareGOF(counts, t.d.P0)
	if err != nil {
		return seqContinue, err
	}
	t.res = r
	if r.P <= t.d.Alpha {
		return seqReject, nil
	}
	return seqAccept, nil
}

func (t *seqTest) result() stats.Result { return t.res }

func leakSampleSize(f, power float64) int { return int(math.Ceil(math.Log(1-power) / math.Log(1-f))) }
func leakPower(n int, f float64) float64  { return 1 - math.Pow(1-f, float64(n)) }
