package differential

import (
	"testing"
)

// TestPlanRandom checks the random comparison's plan: every seed in one
// regime once, at least 500 scenarios, no small batch ever over the
// large-cluster threshold (its peaks plus the kubernetes endpoint), every
// batch's seeds distinct modulo MaxSeeds, and both regimes used.
func TestPlanRandom(t *testing.T) {
	plan := PlanRandom(1, RandomScenarios, DefaultGenConfig())
	seen := map[uint64]bool{}
	total := map[string]int{}
	for _, r := range plan {
		steps := 0
		for i, b := range r.Batches {
			mods := map[uint64]bool{}
			sum := 1
			for _, sc := range b {
				if seen[sc.Seed] {
					t.Errorf("seed %d planned twice", sc.Seed)
				}
				seen[sc.Seed] = true
				if mods[sc.Seed%MaxSeeds] {
					t.Errorf("%s batch %d: two seeds equal to %d modulo %d", r.Name, i, sc.Seed%MaxSeeds, MaxSeeds)
				}
				mods[sc.Seed%MaxSeeds] = true
				sum += sc.Peak()
				for k, v := range Features(sc) {
					total[k] += v
				}
				steps = max(steps, len(sc.Steps))
			}
			if r.Ballast == 0 && sum > LargeClusterThreshold {
				t.Errorf("small batch %d: peak %d endpoints, over %d", i, sum, LargeClusterThreshold)
			}
		}
		if r.Ballast != 0 && r.Ballast+1 <= LargeClusterThreshold {
			t.Errorf("%s regime: ballast %d leaves it small", r.Name, r.Ballast)
		}
		if r.Scenarios() == 0 {
			t.Errorf("%s regime: no scenario", r.Name)
		}
		t.Logf("%s regime: %d scenarios in %d batches", r.Name, r.Scenarios(), len(r.Batches))
	}
	for _, k := range wantFeatures() {
		if total[k] < 5 {
			t.Errorf("feature %q occurs %d times in the plan, want at least 5", k, total[k])
		}
	}
	if len(seen) != RandomScenarios || RandomScenarios < 500 {
		t.Errorf("%d scenarios planned, want %d (at least 500)", len(seen), RandomScenarios)
	}
}

// TestPeak checks Step.Peak against hand-counted slice sizes: a slice that
// shrinks counts its old size, a deleted one too, a new one its new size.
func TestPeak(t *testing.T) {
	before := map[string]int{"a": 5, "b": 3, "c": 2}
	after := map[string]int{"a": 1, "b": 7, "d": 4}
	if got, want := peak(before, after), 5+7+2+4; got != want {
		t.Errorf("peak = %d, want %d", got, want)
	}
	for seed := range uint64(200) {
		sc := Generate(seed, DefaultGenConfig())
		for i, st := range sc.Steps {
			if st.Peak < st.Endpoints || i > 0 && st.Peak < sc.Steps[i-1].Endpoints {
				t.Errorf("seed %d step %d: peak %d below the endpoints before (%d) or after (%d)", seed, i, st.Peak, sc.Steps[max(0, i-1)].Endpoints, st.Endpoints)
			}
		}
	}
}
