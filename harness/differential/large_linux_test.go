//go:build differential_large

package differential

import "testing"

// TestDifferentialLarge compares scenarios/30000-services.yaml on its first
// node in both modes. It is opt-in (make test does not build it): a run
// takes minutes per mode here. Run it with
//
//	flock /tmp/kpsim-heavy.lock go test -tags differential_large -run Large ./harness/differential/
func TestDifferentialLarge(t *testing.T) {
	bin := requireDifferential(t)
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			diffs := newDifferences(t, mode, "large")
			defer diffs.flush()
			compareFile(t, bin, mode, "../../scenarios/30000-services.yaml", 1, diffs)
		})
	}
}
