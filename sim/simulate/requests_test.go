package simulate

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/sim/scenario"
)

// z4 is the tolerance of the sampling tests below: four standard errors
// (a correct sampler fails one with probability about 6e-5; the seeds
// are fixed, so a test either always passes or always fails).
const z4 = 4.0

// TestDurationMeans: each request duration kind has the mean it is
// given: the sample mean within four standard errors of it (the
// theoretical variance); for the default Pareto (alpha 1.5, an infinite
// variance) the median instead, xm·2^(1/alpha), through the count below
// it (binomial, p = 1/2).
func TestDurationMeans(t *testing.T) {
	const n = 400_000
	mean := 20 * time.Millisecond
	m := float64(mean)
	dist := func(kind string, alpha, sigma float64) durDist {
		return newDurDist(&scenario.DurationDist{Kind: kind, Mean: metav1.Duration{Duration: mean}, Alpha: alpha, Sigma: sigma})
	}
	cases := []struct {
		d        durDist
		variance float64
	}{
		{dist("exponential", 0, 0), m * m},
		{dist("pareto", 3, 0), math.Pow(m*2/3, 2) * 3 / (4 * 1)}, // xm² α / ((α−1)² (α−2))
		{dist("lognormal", 0, 1), (math.E - 1) * m * m},          // (e^σ² − 1) mean²
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		sum := 0.0
		for range n {
			sum += float64(c.d.draw(r))
		}
		got, se := sum/n, math.Sqrt(c.variance/n)
		if math.Abs(got-m) > z4*se {
			t.Errorf("%s: mean %.0f ns, want %.0f ± %.0f", c.d.desc, got, m, z4*se)
		}
	}
	p := dist("pareto", scenario.DefaultParetoAlpha, 0)
	median := p.b * math.Pow(2, 1/p.a)
	below := 0
	for range n {
		if float64(p.draw(r)) < median {
			below++
		}
	}
	if sd := math.Sqrt(n / 4.0); math.Abs(float64(below)-n/2) > z4*sd {
		t.Errorf("pareto alpha 1.5: %d of %d below the median %.0f ns, want %d ± %.0f", below, n, median, n/2, z4*sd)
	}
	if d := dist("fixed", 0, 0); d.draw(r) != int64(mean) {
		t.Errorf("fixed: %d, want %d", d.draw(r), mean)
	}
}

// TestPooledLifetimes: each pool slot's connections follow one another
// without a gap from the start to the end of the run, every lifetime but
// the first (a uniform fraction of one) and the last (cut by the run's
// end) within maxAge × [0.9, 1.1]; the client's connections take
// successive source ports; without a maxAge a slot has one connection,
// for the whole run.
func TestPooledLifetimes(t *testing.T) {
	span := int64(100 * time.Second)
	maxAge := int64(10 * time.Second)
	g := &reqGroup{gp: groupPlan{targets: []int32{0, 1}}, size: 3, maxAge: maxAge}
	rn := &reqNode{}
	rn.pooled(g, 0, span, rand.New(rand.NewPCG(3, 4)))
	if len(rn.slots) != 6 {
		t.Fatalf("%d slots, want 2 targets × 3", len(rn.slots))
	}
	for j, sl := range rn.slots {
		cs := rn.conns[sl.lo:sl.hi]
		if cs[0].t != 0 || cs[len(cs)-1].end != span || cs[0].svc != int32(j/3) {
			t.Errorf("slot %d: from %d to %d on %d, want 0 to the run's end on %d", j, cs[0].t, cs[len(cs)-1].end, cs[0].svc, j/3)
		}
		if first := cs[0].end - cs[0].t; first > maxAge*11/10 {
			t.Errorf("slot %d: first lifetime %d, above 1.1 × maxAge", j, first)
		}
		for i := 1; i < len(cs); i++ {
			if cs[i].t != cs[i-1].end {
				t.Errorf("slot %d: connection %d opens at %d, its predecessor closed at %d", j, i, cs[i].t, cs[i-1].end)
			}
			if life := cs[i].end - cs[i].t; i < len(cs)-1 && (life < maxAge*9/10 || life > maxAge*11/10) {
				t.Errorf("slot %d: lifetime %d outside maxAge × [0.9, 1.1]", j, life)
			}
		}
	}
	for i := 1; i < len(rn.conns); i++ {
		if p, q := rn.conns[i-1].port, rn.conns[i].port; q != p+1 && !(p == ephemeralLo+ephemeralN-1 && q == ephemeralLo) {
			t.Fatalf("ports %d then %d: not successive", p, q)
		}
	}
	kept := &reqGroup{gp: groupPlan{targets: []int32{0}}, size: 2}
	rn = &reqNode{}
	rn.pooled(kept, 0, span, rand.New(rand.NewPCG(3, 4)))
	if len(rn.conns) != 2 || rn.conns[0].end != span || rn.conns[1].end != span {
		t.Errorf("without maxAge: %+v, want two connections for the whole run", rn.conns)
	}
}

// TestLeastBusyPick: a request goes to the connection of its target's pool
// with the fewest requests in flight, the first on a tie; requests that
// ended no longer count, nor do those of a connection the slot has left.
func TestLeastBusyPick(t *testing.T) {
	g := &reqGroup{gp: groupPlan{targets: []int32{0, 1}}, size: 3, leastBusy: true}
	q := &replay{slots: make([]slotAcc, 6)}
	start := func(j int, end int64) {
		q.slots[j].inflight++
		heap.Push(&q.busy, busyReq{end: end, slot: int32(j), id: q.slots[j].id})
	}
	if j := q.pick(g, 1, 0); j != 3 {
		t.Fatalf("idle pool: slot %d, want the first of target 1 (3)", j)
	}
	start(3, 100)
	start(4, 50)
	if j := q.pick(g, 1, 10); j != 5 {
		t.Errorf("slots 3 and 4 busy: %d, want 5", j)
	}
	start(5, 200)
	if j := q.pick(g, 1, 60); j != 4 {
		t.Errorf("slot 4's request ended at 50: %d, want 4", j)
	}
	q.slots[3].id, q.slots[3].inflight = 7, 0 // slot 3 moved on to a new connection
	if j := q.pick(g, 1, 120); j != 3 {
		t.Errorf("slot 3's old request is on its old connection: %d, want 3", j)
	}
	if j := q.pick(g, 0, 120); j != 0 {
		t.Errorf("target 0: %d, want 0", j)
	}
	rr := &reqGroup{gp: g.gp, size: 3}
	q.rr = make([]int, 2)
	for i, want := range []int{3, 4, 5, 3} {
		if j := q.pick(rr, 1, int64(i)); j != want {
			t.Errorf("round-robin request %d: slot %d, want %d", i, j, want)
		}
	}
}
