package stats

import (
	"testing"
	"time"
)

func TestSeqExplore(t *testing.T) {
	for _, tune := range []seqTuning{
		{lookDiv: 40, firstFrac: 0.2, acceptFrac: 0.9, seqShare: 0.5, reps: 4000, horizon: 8},
		{lookDiv: 40, firstFrac: 0.2, acceptFrac: 0.7, seqShare: 0.5, reps: 4000, horizon: 8},
		{lookDiv: 60, firstFrac: 0.25, acceptFrac: 0.9, seqShare: 0.5, reps: 4000, horizon: 8},
		{lookDiv: 40, firstFrac: 0.2, acceptFrac: 0.9, seqShare: 0.8, reps: 4000, horizon: 8},
	} {
		for _, k := range []int{2, 3, 5, 20, 50} {
			t0 := time.Now()
			d, err := designSequential(Uniform(k), 0.1, 0.001/40, 0.99, 0, tune)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v %v ratio %.2f  NMax/FixedN %.2f (%v)", tune, d, float64(d.FixedN)/d.ExpectedN0, float64(d.Looks[len(d.Looks)-1])/float64(d.FixedN), time.Since(t0))
		}
	}
}
