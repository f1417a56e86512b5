//go:build race

package stats

// raceDetector is set under -race, where the Monte Carlo tests of the
// sequential, equivalence and KS code run a quarter of their replications
// (same seeds, wider intervals, the same assertions).
const raceDetector = true
