package conform

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// unit is one statistical verdict of the conformance suite: its expected
// distribution and its size.
type unit struct {
	name string
	p    []float64
	n    int
}

// suiteUnits rebuilds, without root, every distribution verdict the suite
// over scenarios/conformance makes in iptables mode: the same states (the
// timeline applied through the cluster model), the same oracle, the same
// sizing.
func suiteUnits(t *testing.T) ([]unit, float64) {
	files, err := filesIn(conformanceDir)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	var loaded []*scenario.Loaded
	for _, f := range files {
		l, err := scenario.LoadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		loaded = append(loaded, l)
		total += plannedUnits(l.Scenario)
	}
	alpha := stats.DefaultFamilyAlpha / float64(total)
	var units []unit
	for _, l := range loaded {
		m, err := cluster.OpenLoaded(context.Background(), l, nil)
		if err != nil {
			t.Fatal(err)
		}
		sc := l.Scenario
		var all []string
		for n := range m.State.Nodes {
			all = append(all, n)
		}
		collect := func(c *scenario.Check, st *cluster.State) {
			for _, nd := range clientNodes(sc, c, all) {
				for spn, sp := range st.Services {
					if spn.Namespace+"/"+spn.Name != c.Service || spn.Port != c.Port || c.Type == scenario.CheckAffinity {
						continue
					}
					want := oracle.Expect("iptables", sp, st.Endpoints[spn], nd, "")
					if want.Kind == oracle.Endpoints && len(want.Probs) > 1 {
						p := probsOf(want)
						n, _ := sizeFor(p, c.MDE, c.Power, alpha)
						units = append(units, unit{c.Name + "@" + nd, p, n})
					}
				}
			}
		}
		for i := range sc.Checks {
			collect(&sc.Checks[i], m.State)
		}
		for _, step := range cluster.Timeline(sc) {
			if _, err := m.Cluster.Apply(context.Background(), step); err != nil {
				t.Fatal(err)
			}
			waitDrainTracker(m.Tracker)
			for i := range sc.Checks {
				if c := &sc.Checks[i]; c.Type == scenario.CheckFlapping || c.Type == scenario.CheckTerminating {
					collect(c, m.State)
				}
			}
		}
		m.Close()
	}
	return units, alpha
}

func waitDrainTracker(tr *cluster.Tracker) {
	before := tr.Seq()
	for i := 0; i < 2000 && tr.Seq() == before; i++ {
		sleepMs(1)
	}
	tr.Drain()
}

// TestSuiteFalseFailureRate simulates the whole suite on a correct subject
// (every verdict's counts drawn from exactly the expected distribution) and
// counts runs with any failure after Holm at the family alpha. Target: at
// most 1 in 1,000 runs. Deterministic verdicts cannot fail on a correct,
// lossless subject and are not simulated.
func TestSuiteFalseFailureRate(t *testing.T) {
	units, alpha := suiteUnits(t)
	if len(units) < 10 {
		t.Fatalf("only %d distribution verdicts found", len(units))
	}
	const reps = 10000
	r := rand.New(rand.NewPCG(2026, 1129))
	failedRuns := 0
	ps := make([]float64, len(units))
	for rep := 0; rep < reps; rep++ {
		for i, u := range units {
			counts := make([]int, len(u.p))
			stats.SampleMultinomial(r, u.n, u.p, counts)
			obs := make([]float64, len(counts))
			for j, c := range counts {
				obs[j] = float64(c)
			}
			res, err := stats.ChiSquareGOF(obs, u.p)
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = res.P
		}
		for _, rej := range stats.Holm(ps, stats.DefaultFamilyAlpha) {
			if rej {
				failedRuns++
				break
			}
		}
	}
	lo, hi := stats.ClopperPearson(failedRuns, reps, 0.999)
	t.Logf("%d distribution verdicts (alpha per verdict %.3g, n from %d to %d): %d of %d simulated suite runs failed (rate %.5f, 99.9%% CI %.5f-%.5f); family alpha %g",
		len(units), alpha, minN(units), maxN(units), failedRuns, reps, float64(failedRuns)/reps, lo, hi, stats.DefaultFamilyAlpha)
	if lo > stats.DefaultFamilyAlpha {
		t.Errorf("the suite's false-failure rate exceeds the family alpha %g: %d of %d runs", stats.DefaultFamilyAlpha, failedRuns, reps)
	}
}

func minN(us []unit) int {
	m := us[0].n
	for _, u := range us {
		m = min(m, u.n)
	}
	return m
}

func maxN(us []unit) int {
	m := 0
	for _, u := range us {
		m = max(m, u.n)
	}
	return m
}

func sleepMs(n int) { time.Sleep(time.Duration(n) * time.Millisecond) }
