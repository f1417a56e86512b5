package stats

// The truncated sequential likelihood-ratio test of a distribution check.
//
// Why it is valid. Let p0 be the null over the cells (endpoints) and p1a,
// a = 1..A, the simple alternatives (each endpoint's share off by a relative
// ±MDE). After n probes with counts x, LR_a(n) = Π_i (p1a_i/p0_i)^x_i. Under
// H0 each probe multiplies LR_a by p1a_i/p0_i, whose mean under p0 is
// Σ_i p1a_i = 1, so LR_a is a non-negative martingale of mean 1, and so is
// the mixture M(n) = (1/A) Σ_a LR_a(n). Ville's inequality gives
// P0(sup_n M(n) >= c) <= 1/c for every c > 0, whatever the looks and however
// the test stops. Hence:
//
//   - Rejecting at a look when M >= 1/AlphaSeq has probability at most AlphaSeq
//     under H0 (exact bound, no approximation). Since M >= max_a LR_a / A, this
//     rejects whenever max_a LR_a >= A/AlphaSeq, the union-bound rule, and
//     sometimes earlier: the mixture is never less powerful.
//   - pSeq = min(1, min over the looks seen of 1/M) is anytime valid:
//     P0(pSeq <= u) <= P0(sup M >= 1/u) <= u for every u in (0, 1].
//   - At NMax without a decision the chi-square GOF gives pFinal, and pFinal = 1
//     when the test stopped earlier; P0(pFinal <= v) <= P0(chi-square p-value of
//     the counts at NMax <= v), which is v to the chi-square's approximation.
//   - The reported P = min(1, pSeq·α/AlphaSeq, pFinal·α/AlphaFinal) with
//     AlphaSeq + AlphaFinal = α is valid at every level u:
//     P0(P <= u) <= P0(pSeq <= u·AlphaSeq/α) + P0(pFinal <= u·AlphaFinal/α) <= u.
//     So Holm may use P at any of its steps. At u = α, P <= α exactly when the
//     test rejected (SeqReject), so the decision and the p-value agree.
//
// Power. Under alternative a, 1/LR_a is a non-negative mean-one martingale,
// so P_a(LR_a ever <= B) <= B. The test accepts only when every LR_a <= B, so
// P_a(accept before NMax) <= B. The rest of the power (reaching the
// rejection boundary before NMax, or the final chi-square) is measured by a
// seeded Monte Carlo at the least favourable alternatives, and NMax is the
// smallest look from which on that power stays at or above the target plus
// two Monte Carlo standard errors.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// seqTuning holds the design choices of DesignSequential that are not part
// of its contract; defaultSeqTuning was chosen with BenchmarkSequentialTuning.
type seqTuning struct {
	lookDiv    float64 // the look step is ceil(FixedN / lookDiv)
	firstFrac  float64 // the first look is the first multiple of the step at or above firstFrac · FixedN
	acceptFrac float64 // B = acceptFrac · (1 - power)
	seqShare   float64 // AlphaSeq = seqShare · α
	reps       int     // Monte Carlo replications per simulated alternative
	reps0      int     // Monte Carlo replications under P0 (for E0[N] only)
	horizon    float64 // simulated looks reach horizon · FixedN (before maxN), or 4 times that if needed
	marginSE   float64 // NMax must reach the power plus marginSE Monte Carlo standard errors
	gateBeta   float64 // omnibus designs only: per-look quantile of the MDE's noncentral χ² below which X² must lie to accept
}

var defaultSeqTuning = seqTuning{lookDiv: 60, firstFrac: 0.25, acceptFrac: 0.9, seqShare: 0.5, reps: 4000, reps0: 2000, horizon: 2, marginSE: 2}

// omnibusSeqTuning is defaultSeqTuning with the omnibus acceptance gate.
var omnibusSeqTuning = func() seqTuning {
	t := defaultSeqTuning
	t.gateBeta = 0.0001
	return t
}()

// seqSeed seeds the design's Monte Carlo; designs are deterministic.
const seqSeed = 0x6b70_7369_6d00_5351

// SeqDesign is a truncated sequential likelihood-ratio test of a
// distribution check: the looks, both boundaries, the alpha split and the
// Monte Carlo operating characteristics. It is immutable once designed;
// Start runs one test with it.
type SeqDesign struct {
	// P0 is the null distribution over the endpoints.
	P0 []float64
	// MDE is the relative deviation of one endpoint's share the test is powered for.
	MDE float64
	// Alpha is the level of the whole test (AlphaSeq + AlphaFinal).
	Alpha float64
	// Power is the target power at the least favourable alternative.
	Power float64
	// Looks are the cumulative numbers of observations at which the test
	// looks; the last is NMax.
	Looks []int
	// LogReject is log(1/AlphaSeq): the test rejects when the log of the
	// mixture likelihood ratio reaches it.
	LogReject float64
	// LogAccept is log(B): the test accepts when every alternative's log
	// likelihood ratio is at or below it.
	LogAccept float64
	// AlphaSeq is the part of Alpha spent by the sequential boundary,
	// AlphaFinal the part spent by the chi-square at NMax.
	AlphaSeq, AlphaFinal float64
	// Alternatives are the simple alternatives p1a (each endpoint's share
	// times 1 ± MDE, the others scaled in proportion), duplicates dropped.
	Alternatives [][]float64
	// FixedN is the fixed-size chi-square's n at the same alpha and power
	// (ChiSquareSampleSize at the least favourable alternative).
	FixedN int
	// Achieved is the Monte Carlo power at the least favourable alternative
	// simulated, AchievedSE its standard error.
	Achieved, AchievedSE float64
	// ExpectedN0 and ExpectedN1 are the Monte Carlo expected numbers of
	// observations under P0 and under the least favourable alternative.
	ExpectedN0, ExpectedN1 float64
	// Reps is the number of Monte Carlo replications per simulated
	// alternative, Reps0 under P0.
	Reps, Reps0 int
	// Capped is set when maxN stopped NMax short of the target power;
	// Achieved then says how much power the design has.
	Capped bool
	// Omnibus is set for DesignSequentialOmnibus designs: the test accepts
	// only when X² is also implausible under the MDE's noncentral χ².
	Omnibus bool
	// Notes says how the design was made (least favourable alternative,
	// cap, dropped alternatives).
	Notes []string

	alts     []oneOffAlt
	positive []int // cells with p0 > 0
	zero     []int // cells with p0 = 0
	critical float64
	minW2    float64   // of the least favourable one-off alternative
	gate     []float64 // omnibus: the largest X² at each look at which the test may accept
}

// oneOffAlt is an alternative in the form its log likelihood ratio takes:
// L = x_j·lj + (n - x_j)·lrest, since every cell but j is scaled by the same factor.
type oneOffAlt struct {
	j         int
	lj, lrest float64
	w2        float64
}

// SeqDecision is the state of a sequential test after a look.
type SeqDecision int

const (
	// SeqContinue means no boundary was crossed: take the next look.
	SeqContinue SeqDecision = iota
	// SeqReject means H0 is rejected (P <= Alpha).
	SeqReject
	// SeqAccept means the test stopped keeping H0 (P > Alpha).
	SeqAccept
)

// String returns "continue", "reject" or "accept".
func (d SeqDecision) String() string {
	switch d {
	case SeqContinue:
		return "continue"
	case SeqReject:
		return "reject"
	case SeqAccept:
		return "accept"
	}
	return fmt.Sprintf("SeqDecision(%d)", int(d))
}

var seqCache = struct {
	sync.Mutex
	m map[string]*SeqDesign
}{m: map[string]*SeqDesign{}}

// DesignSequential designs the truncated sequential likelihood-ratio test of
// counts over the endpoints of p0 (probabilities summing to 1; cells of
// probability 0 are impossible outcomes) at level alpha, powered at the
// 2k one-off alternatives of relative deviation mde (0 < mde < 1) for power.
// maxN > 0 caps NMax: a design that needs more is returned capped
// (Capped set, Achieved the power it has, a note saying so); maxN <= 0 means
// no cap. Designs are deterministic (fixed Monte Carlo seed) and cached by
// their arguments; the caller gets its own copy.
//
// Cost: three Monte Carlo passes (2,000 runs under P0, 4,000 under each of
// the ±MDE alternatives on the smallest share), in chunks of 1,000 runs on
// as many goroutines as there are chunks; a run costs O(k) per look (a
// multinomial draw by conditional binomials, the 2k likelihood ratios in
// closed form) and takes about ten looks. Measured on this 2-core machine
// with other jobs running (BenchmarkDesignSequential): 0.12 s wall for
// k = 5, 0.39 s for k = 50, 0.53 s for k = 200 (CPU about 0.14, 0.5 and
// 0.7 s). The cache keeps every design made (a handful per run).
func DesignSequential(p0 []float64, mde, alpha, power float64, maxN int) (*SeqDesign, error) {
	return cachedDesign(p0, mde, alpha, power, maxN, defaultSeqTuning)
}

// DesignSequentialOmnibus is DesignSequential for a test that keeps its
// power at every alternative as far from p0 as the MDE (in w²), not only at
// the one-off ones, as the fixed chi-square does: the test accepts only
// when, besides every one-off likelihood ratio being at most B, Pearson's
// X² lies below the 0.01 % quantile of the noncentral χ²(k-1, n·w²) of the
// MDE at that look, and the Monte Carlo that sets NMax also simulates an
// alternative that moves every share ("spread", see spreadAlternative).
// The rejection rule, and so the level and the p-value, are unchanged. It
// saves fewer probes than DesignSequential and costs more to design (the
// runs at the spread alternative go to NMax): about 3 s for k = 50 (see
// README.md).
func DesignSequentialOmnibus(p0 []float64, mde, alpha, power float64, maxN int) (*SeqDesign, error) {
	return cachedDesign(p0, mde, alpha, power, maxN, omnibusSeqTuning)
}

func cachedDesign(p0 []float64, mde, alpha, power float64, maxN int, tune seqTuning) (*SeqDesign, error) {
	key := fmt.Sprintf("%s|%+v", seqKey(p0, mde, alpha, power, maxN), tune)
	seqCache.Lock()
	d, ok := seqCache.m[key]
	seqCache.Unlock()
	if !ok {
		var err error
		d, err = designSequential(p0, mde, alpha, power, maxN, tune)
		if err != nil {
			return nil, err
		}
		seqCache.Lock()
		seqCache.m[key] = d
		seqCache.Unlock()
	}
	return d.clone(), nil
}

func seqKey(p0 []float64, mde, alpha, power float64, maxN int) string {
	var b strings.Builder
	for _, p := range p0 {
		b.WriteString(strconv.FormatFloat(p, 'g', -1, 64))
		b.WriteByte(',')
	}
	fmt.Fprintf(&b, "|%g|%g|%g|%d", mde, alpha, power, maxN)
	return b.String()
}

func (d *SeqDesign) clone() *SeqDesign {
	c := *d
	c.P0 = slices.Clone(d.P0)
	c.Looks = slices.Clone(d.Looks)
	c.Alternatives = make([][]float64, len(d.Alternatives))
	for i, a := range d.Alternatives {
		c.Alternatives[i] = slices.Clone(a)
	}
	c.Notes = slices.Clone(d.Notes)
	c.gate = slices.Clone(d.gate)
	return &c
}

func designSequential(p0 []float64, mde, alpha, power float64, maxN int, tune seqTuning) (*SeqDesign, error) {
	d, err := newSeqDesign(p0, mde, alpha, power, tune)
	if err != nil {
		return nil, err
	}
	// The least favourable alternatives: for each sign, the one of smallest
	// w² (the smallest share), which the noncentral theory and the
	// likelihood-ratio drift KL(p1||p0) ≈ w²/2 both make the hardest to
	// detect. For uniform shares all alternatives of a sign are alike.
	worst := d.leastFavourable()
	truths := [][]float64{d.P0}
	for _, a := range worst {
		truths = append(truths, d.Alternatives[a])
	}
	var spread []float64
	if tune.gateBeta > 0 {
		d.Omnibus = true
		spread = d.spreadAlternative()
		truths = append(truths, spread)
	}
	// Runs that wander undecided are simulated up to the horizon, which
	// is most of the cost; a short horizon is tried first and a longer one
	// only if the power is not reached within it.
	for _, horizon := range []float64{tune.horizon, 4 * tune.horizon} {
		looks, limited := d.lookSchedule(tune, horizon, maxN)
		d.Looks = looks
		if d.Omnibus {
			d.gate = d.acceptGates(looks, tune.gateBeta)
		}
		tallies := d.simulateAll(truths, tune)
		target := power + tune.marginSE*math.Sqrt(power*(1-power)/float64(tune.reps))
		k, capped := d.chooseTruncation(tallies[1:], len(looks), target)
		if capped && !limited && horizon == tune.horizon {
			continue
		}
		d.finish(tallies, looks, k, worst, spread, tune)
		if capped {
			why := fmt.Sprintf("maxN %d", maxN)
			if !limited {
				why = fmt.Sprintf("the simulated horizon of %g times FixedN", horizon)
			}
			d.Capped = true
			d.Notes = append(d.Notes, fmt.Sprintf("NMax capped at %d by %s: power %.4f at the MDE, short of %.4g",
				d.Looks[len(d.Looks)-1], why, d.Achieved, power))
		}
		break
	}
	return d, nil
}

// lookSchedule returns the looks up to horizon·FixedN or maxN, and whether
// maxN limited them: equal steps of FixedN/lookDiv from the first multiple
// of the step at or above firstFrac·FixedN: fewer looks (round trips for
// the harness, time for the Monte Carlo) for about 1 % more E0[N], since
// under P0 few runs could stop earlier (README.md has the figures).
func (d *SeqDesign) lookSchedule(tune seqTuning, horizon float64, maxN int) (looks []int, limited bool) {
	step := max(1, int(math.Ceil(float64(d.FixedN)/tune.lookDiv)))
	first := max(1, int(math.Ceil(tune.firstFrac*float64(d.FixedN)/float64(step)))) * step
	last := int(math.Ceil(horizon * float64(d.FixedN)))
	if maxN > 0 && maxN < last {
		last, limited = maxN, true
	}
	for n := min(first, last); n <= last; n += step {
		looks = append(looks, n)
	}
	return looks, limited
}

// finish truncates the design after k looks and records its Monte Carlo
// operating characteristics; tallies are P0's, then those of the one-off
// alternatives in worst, then (omnibus) the spread alternative's.
func (d *SeqDesign) finish(tallies []seqTally, looks []int, k int, worst []int, spread []float64, tune seqTuning) {
	d.Looks = looks[:k]
	if d.gate != nil {
		d.gate = d.gate[:k]
	}
	d.ExpectedN0 = tallies[0].expectedN(looks, k)
	d.Achieved = 1
	what := ""
	for i, t := range tallies[1:] {
		if pw := t.power(k); pw <= d.Achieved {
			d.Achieved = pw
			d.ExpectedN1 = t.expectedN(looks, k)
			if i < len(worst) {
				j := d.alts[worst[i]].j
				what = fmt.Sprintf("endpoint %d's share times %g", j, d.Alternatives[worst[i]][j]/d.P0[j])
			} else {
				what = fmt.Sprintf("every share moved (spread, w² %.4g)", EffectW2(d.P0, spread))
			}
		}
	}
	d.AchievedSE = math.Sqrt(d.Achieved * (1 - d.Achieved) / float64(tune.reps))
	d.Notes = append(d.Notes, fmt.Sprintf("least favourable alternative simulated: %s (power %.4f ± %.4f, %d runs)",
		what, d.Achieved, d.AchievedSE, tune.reps))
}

// spreadAlternative returns the alternative that moves every share of
// positive probability (in index order, alternately up and down by the same
// relative amount, the last left alone if their number is odd), renormalised,
// with the w² of the least favourable one-off alternative.
func (d *SeqDesign) spreadAlternative() []float64 {
	at := func(e float64) []float64 {
		p1 := make([]float64, len(d.P0))
		var sum float64
		for n, i := range d.positive {
			s := 0.0
			if n < len(d.positive)/2*2 {
				s = float64(1 - 2*(n%2))
			}
			p1[i] = d.P0[i] * (1 + s*e)
			sum += p1[i]
		}
		for i := range p1 {
			p1[i] /= sum
		}
		return p1
	}
	lo, hi := 0.0, 1.0
	for range 60 {
		mid := (lo + hi) / 2
		if EffectW2(d.P0, at(mid)) < d.minW2 {
			lo = mid
		} else {
			hi = mid
		}
	}
	return at(hi)
}

// acceptGates returns, for each look, the beta-quantile of the noncentral
// χ²(k-1, n·minW2): below it X² is implausible under an alternative as far
// as the MDE, and the omnibus test may accept.
func (d *SeqDesign) acceptGates(looks []int, beta float64) []float64 {
	df := float64(len(d.positive) - 1)
	gates := make([]float64, len(looks))
	for i, n := range looks {
		lambda := float64(n) * d.minW2
		lo, hi := 0.0, df+lambda+10*math.Sqrt(2*(df+2*lambda))+10
		for hi-lo > 1e-6*hi {
			mid := (lo + hi) / 2
			if NoncentralChiSquareCDF(mid, df, lambda) < beta {
				lo = mid
			} else {
				hi = mid
			}
		}
		gates[i] = lo
	}
	return gates
}

// newSeqDesign validates the arguments and builds the alternatives,
// boundaries and FixedN.
func newSeqDesign(p0 []float64, mde, alpha, power float64, tune seqTuning) (*SeqDesign, error) {
	switch {
	case !(mde > 0 && mde < 1):
		return nil, fmt.Errorf("could not design sequential test: MDE %g is outside (0, 1): %w", mde, ErrInvalidArgument)
	case !(alpha > 0 && alpha < 1):
		return nil, fmt.Errorf("could not design sequential test: alpha %g is outside (0, 1): %w", alpha, ErrInvalidArgument)
	case !(power > 0 && power < 1):
		return nil, fmt.Errorf("could not design sequential test: power %g is outside (0, 1): %w", power, ErrInvalidArgument)
	}
	d := &SeqDesign{P0: slices.Clone(p0), MDE: mde, Alpha: alpha, Power: power, Reps: tune.reps, Reps0: tune.reps0}
	var sum float64
	for i, p := range p0 {
		if !(p >= 0 && p <= 1) {
			return nil, fmt.Errorf("could not design sequential test: probability %g of cell %d is outside [0, 1]: %w", p, i, ErrInvalidArgument)
		}
		sum += p
		if p > 0 {
			d.positive = append(d.positive, i)
		} else {
			d.zero = append(d.zero, i)
		}
	}
	if math.Abs(sum-1) > probSumTol {
		return nil, fmt.Errorf("could not design sequential test: probabilities sum to %.12g, not 1: %w", sum, ErrInvalidArgument)
	}
	if len(d.positive) < 2 {
		return nil, fmt.Errorf("could not design sequential test: %d cells of positive probability, need 2: %w", len(d.positive), ErrInvalidArgument)
	}
	d.AlphaSeq = tune.seqShare * alpha
	d.AlphaFinal = alpha - d.AlphaSeq
	d.LogReject = -math.Log(d.AlphaSeq)
	d.LogAccept = math.Log(tune.acceptFrac * (1 - power))
	d.critical = chiSquareCritical(len(d.positive)-1, d.AlphaFinal)
	d.buildAlternatives()
	if len(d.alts) == 0 {
		return nil, fmt.Errorf("could not design sequential test: no share can move by a relative %g inside [0, 1]: %w", mde, ErrInvalidArgument)
	}
	minW2 := math.Inf(1)
	for _, a := range d.alts {
		minW2 = min(minW2, a.w2)
	}
	d.minW2 = minW2
	d.FixedN = ChiSquareSampleSize(minW2, len(d.positive)-1, alpha, power)
	if d.FixedN < 1 {
		return nil, fmt.Errorf("could not design sequential test: no fixed sample size reaches power %g at w² = %g: %w", power, minW2, ErrInvalidArgument)
	}
	return d, nil
}

// buildAlternatives makes the one-off alternatives: p1 = p0 with
// p0[j]·(1 + s·MDE) and every other cell scaled by the same factor
// c = (1 - p0[j](1+s·MDE))/(1 - p0[j]). With three or more positive cells no
// two coincide: (j, s) = (j', s') with j != j' needs c(j, s) = 1 + s·MDE
// (cell j and a third cell are scaled alike), which solves only for MDE = 0.
// With two equal shares (j, +) equals (the other, -) and is dropped. An
// alternative that would take a share to 1 or above is left out and noted.
func (d *SeqDesign) buildAlternatives() {
	for _, j := range d.positive {
		for _, s := range []float64{1, -1} {
			pj := d.P0[j] * (1 + s*d.MDE)
			if pj >= 1 {
				d.Notes = append(d.Notes, fmt.Sprintf("alternative endpoint %d times %g left out: share above 1", j, 1+s*d.MDE))
				continue
			}
			c := (1 - pj) / (1 - d.P0[j])
			p1 := make([]float64, len(d.P0))
			for _, i := range d.positive {
				p1[i] = d.P0[i] * c
			}
			p1[j] = pj
			if len(d.positive) == 2 && slices.ContainsFunc(d.Alternatives, func(q []float64) bool { return sameDistribution(p1, q) }) {
				continue
			}
			d.Alternatives = append(d.Alternatives, p1)
			d.alts = append(d.alts, oneOffAlt{j: j, lj: math.Log1p(s * d.MDE), lrest: math.Log(c), w2: EffectW2(d.P0, p1)})
		}
	}
}

func sameDistribution(p, q []float64) bool {
	for i := range p {
		if math.Abs(p[i]-q[i]) > 1e-12 {
			return false
		}
	}
	return true
}

// leastFavourable returns, for each sign present, the alternative of smallest w².
func (d *SeqDesign) leastFavourable() []int {
	best := map[bool]int{}
	for i, a := range d.alts {
		up := a.lj > 0
		if b, ok := best[up]; !ok || a.w2 < d.alts[b].w2 {
			best[up] = i
		}
	}
	var out []int
	for _, up := range []bool{true, false} {
		if i, ok := best[up]; ok {
			out = append(out, i)
		}
	}
	return out
}

// maxLogLR returns the largest log likelihood ratio over the alternatives
// after n observations with the given counts.
func (d *SeqDesign) maxLogLR(counts []float64, n float64) float64 {
	m := math.Inf(-1)
	for _, a := range d.alts {
		xj := counts[a.j]
		m = max(m, xj*a.lj+(n-xj)*a.lrest)
	}
	return m
}

// logMixture returns log((1/A) Σ_a LR_a), computed around the maximum maxL.
func (d *SeqDesign) logMixture(counts []float64, n, maxL float64) float64 {
	var s float64
	for _, a := range d.alts {
		xj := counts[a.j]
		s += math.Exp(xj*a.lj + (n-xj)*a.lrest - maxL)
	}
	return maxL + math.Log(s/float64(len(d.alts)))
}

// boundary is the decision of the sequential boundaries alone at look
// (0-based), from the log mixture and largest likelihood ratios and
// Pearson's X² (used only by omnibus designs).
func (d *SeqDesign) boundary(look int, logM, maxL, x2 float64) SeqDecision {
	switch {
	case logM >= d.LogReject:
		return SeqReject
	case maxL <= d.LogAccept && (d.gate == nil || x2 <= d.gate[look]):
		return SeqAccept
	}
	return SeqContinue
}

// fastBoundary is boundary without the mixture when the maximum already
// decides (log M lies in [maxL - log A, maxL]); the Monte Carlo uses it.
func (d *SeqDesign) fastBoundary(look int, counts []float64, n, x2 float64) SeqDecision {
	maxL := d.maxLogLR(counts, n)
	if maxL < d.LogReject {
		return d.boundary(look, maxL, maxL, x2) // log M <= maxL < LogReject
	}
	return d.boundary(look, d.logMixture(counts, n, maxL), maxL, x2)
}

// pearsonX2 is Pearson's statistic over the positive cells (no merging: at
// the sizes designed here every expected count is far above MinExpected).
func (d *SeqDesign) pearsonX2(counts []float64, n float64) float64 {
	var x2 float64
	for _, i := range d.positive {
		e := n * d.P0[i]
		x2 += (counts[i] - e) * (counts[i] - e) / e
	}
	return x2
}

// seqChunk is the number of Monte Carlo runs per goroutine; each chunk has
// its own random stream, so the result does not depend on scheduling.
const seqChunk = 1000

// simulateAll runs the Monte Carlo under each truth (the first is P0) and
// returns one tally per truth.
func (d *SeqDesign) simulateAll(truths [][]float64, tune seqTuning) []seqTally {
	type job struct{ truth, chunk, reps int }
	var jobs []job
	for i := range truths {
		reps := tune.reps
		if i == 0 {
			reps = tune.reps0
		}
		for c := 0; c*seqChunk < reps; c++ {
			jobs = append(jobs, job{i, c, min(seqChunk, reps-c*seqChunk)})
		}
	}
	parts := make([]seqTally, len(jobs))
	var wg sync.WaitGroup
	for ji, j := range jobs {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seqSeed, uint64(1000*j.truth+j.chunk)))
			parts[ji] = d.simulate(r, truths[j.truth], j.reps)
		})
	}
	wg.Wait()
	tallies := make([]seqTally, len(truths))
	for ji, j := range jobs {
		tallies[j.truth] = tallies[j.truth].add(parts[ji])
	}
	return tallies
}
