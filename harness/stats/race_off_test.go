//go:build !race

package stats

// raceDetector is set under -race; see race_on_test.go.
const raceDetector = false
