package stats

import (
	"math"
	"testing"
)

// relClose reports whether got is within a relative tol of want (absolute
// when want is 0).
func relClose(got, want, tol float64) bool {
	if want == 0 {
		return math.Abs(got) <= tol
	}
	return math.Abs(got-want) <= tol*math.Abs(want)
}

func checkRel(t *testing.T, name string, got, want, tol float64) {
	t.Helper()
	if !relClose(got, want, tol) {
		t.Errorf("%s = %.17g, want %.17g (relative tolerance %g)", name, got, want, tol)
	}
}

// mcReps returns reps, or a quarter of it under the race detector (which
// slows these Monte Carlo loops some tenfold and finds nothing more in them
// after the first few hundred).
func mcReps(reps int) int {
	if raceDetector {
		return reps / 4
	}
	return reps
}
