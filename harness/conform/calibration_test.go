package conform

import (
	"context"
	"testing"

	"github.com/kpsim/kpsim/harness/stats"
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
		runs = 20 // the race detector makes each run ten times slower
	}
	for _, mode := range []string{"iptables", "nftables", "ipvs"} {
		t.Run(mode, func(t *testing.T) {
			c, err := Calibrate(context.Background(), files, Options{Mode: mode}, runs, 20261201, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(c)
			if c.P <= 0.001 {
				t.Errorf("the harness's false-failure rate exceeds the family alpha %g (exact binomial p = %.3g): %s", stats.DefaultFamilyAlpha, c.P, c)
			}
			if c.Errored > 0 {
				t.Errorf("%d simulated runs had errors on a lossless machine: %v", c.Errored, c.ErrorMessages)
			}
		})
	}
}
