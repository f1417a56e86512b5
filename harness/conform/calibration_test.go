package conform

import (
	"context"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
)

// TestHarnessCalibration runs the whole conformance suite on a correct
// dataplane, in every mode, through the run's own code on the simulated
// machine (machine_sim.go: the engines' rules, conntrack and affinity
// memory, the prober's block plan, the run's sizing, sequential looks,
// decisions and Holm over the run's m), and tests the false-failure rate
// against the family alpha with an exact binomial test at level 0.001.
// Seeded: the same code gives the same count. The large calibration
// (10,000 runs per mode) is `sim conform --calibrate`; its result is in
// results/harness-calibration/.
func TestHarnessCalibration(t *testing.T) {
	files, err := filesIn(conformanceDir)
	if err != nil {
		t.Fatal(err)
	}
	runs := 300
	if raceEnabled {
		// The race detector makes each run (and designing the 50-endpoint
		// check's sequential test) ten times slower: a few runs of the
		// small scenarios exercise the code for races; `make conformance`
		// runs the calibration without it.
		runs, files = 3, smallScenarios(files)
	}
	for _, mode := range cluster.Modes() {
		t.Run(string(mode), func(t *testing.T) {
			c, err := Calibrate(context.Background(), files, Options{Mode: mode}, runs, 20261201, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(c)
			if c.P <= 0.001 {
				t.Errorf("the harness's false-failure rate exceeds the family alpha %g (exact binomial p = %.3g): %s", stats.DefaultFamilyAlpha, c.P, c)
			}
			if c.Mismatched > 0 {
				t.Errorf("%d runs made another number of verdicts than the %d planned (m): %v", c.Mismatched, c.Verdicts, c.ErrorMessages)
			}
			if c.Errored > 0 {
				t.Errorf("%d simulated runs had errors on a lossless machine: %v", c.Errored, c.ErrorMessages)
			}
		})
	}
}

// smallScenarios leaves out the many-endpoints scenario.
func smallScenarios(files []string) []string {
	var out []string
	for _, f := range files {
		if !strings.Contains(f, "many-endpoints") {
			out = append(out, f)
		}
	}
	return out
}
