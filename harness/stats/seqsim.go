package stats

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// seqTally holds what the Monte Carlo of a design needs per look: how many
// runs rejected and accepted at it, and how many were still undecided there
// with a chi-square that would reject if the test were truncated there. One
// pass thus gives the power and the expected n of every truncation at once.
type seqTally struct {
	reps             int
	rej, acc, chiRej []int
}

// simulate runs reps sequential tests on draws from truth over all the
// design's looks (equal steps), without truncation.
func (d *SeqDesign) simulate(r *rand.Rand, truth []float64, reps int) seqTally {
	kmax := len(d.Looks)
	t := seqTally{reps: reps, rej: make([]int, kmax), acc: make([]int, kmax), chiRej: make([]int, kmax)}
	counts := make([]float64, len(d.P0))
	inc := make([]int, len(d.P0))
	for range reps {
		clear(counts)
		prev := 0
		for i, look := range d.Looks {
			SampleMultinomial(r, look-prev, truth, inc)
			prev = look
			for c, x := range inc {
				counts[c] += float64(x)
			}
			n := float64(look)
			x2 := d.pearsonX2(counts, n)
			switch d.fastBoundary(i, counts, n, x2) {
			case SeqReject:
				t.rej[i]++
			case SeqAccept:
				t.acc[i]++
			default:
				if x2 >= d.critical {
					t.chiRej[i]++
				}
				continue
			}
			break
		}
	}
	return t
}

// add returns the tally of both sets of runs.
func (t seqTally) add(u seqTally) seqTally {
	if t.reps == 0 {
		return u
	}
	out := seqTally{reps: t.reps + u.reps}
	for _, p := range []struct {
		dst  *[]int
		a, b []int
	}{{&out.rej, t.rej, u.rej}, {&out.acc, t.acc, u.acc}, {&out.chiRej, t.chiRej, u.chiRej}} {
		*p.dst = make([]int, len(p.a))
		for i := range p.a {
			(*p.dst)[i] = p.a[i] + p.b[i]
		}
	}
	return out
}

// power is the rejection rate of the test truncated after k looks.
func (t seqTally) power(k int) float64 {
	rejected := t.chiRej[k-1]
	for i := range k {
		rejected += t.rej[i]
	}
	return float64(rejected) / float64(t.reps)
}

// expectedN is the mean number of observations of the test truncated after k looks.
func (t seqTally) expectedN(looks []int, k int) float64 {
	var total float64
	decided := 0
	for i := range k - 1 {
		stopped := t.rej[i] + t.acc[i]
		decided += stopped
		total += float64(stopped) * float64(looks[i])
	}
	total += float64(t.reps-decided) * float64(looks[k-1])
	return total / float64(t.reps)
}

// chooseTruncation returns the smallest number of looks from which on the
// power at every simulated alternative stays at or above target, or
// kmax and capped = true if none does.
func (d *SeqDesign) chooseTruncation(alts []seqTally, kmax int, target float64) (k int, capped bool) {
	worst := func(k int) float64 {
		w := 1.0
		for _, t := range alts {
			w = min(w, t.power(k))
		}
		return w
	}
	k = kmax + 1
	for k > 1 && worst(k-1) >= target {
		k--
	}
	if k > kmax {
		return kmax, true
	}
	return k, false
}

// seqDesignString is a one-line summary for logs and notes.
func (d *SeqDesign) String() string {
	return fmt.Sprintf("sequential LR: k=%d MDE=%g alpha=%.3g power=%g looks=%d first=%d NMax=%d B=%.4g A=%d FixedN=%d E0[N]=%.0f E1[N]=%.0f achieved=%.4f±%.4f capped=%v omnibus=%v",
		len(d.P0), d.MDE, d.Alpha, d.Power, len(d.Looks), d.Looks[0], d.Looks[len(d.Looks)-1], math.Exp(d.LogAccept),
		len(d.Alternatives), d.FixedN, d.ExpectedN0, d.ExpectedN1, d.Achieved, d.AchievedSE, d.Capped, d.Omnibus)
}
