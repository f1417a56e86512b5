package simulate

import "github.com/kpsim/kpsim/harness/stats"

// family is the report's one Holm family: every test that spends α, from
// every mode (the distribution checks' chi-square units, the engine
// self-check's service ports and its p-value uniformity tests), so that a
// correct simulator fails a report with probability at most alpha. Each
// member carries what to do with its decision; decide runs Holm once, after
// every member is in, so that m is the family's size.
type family struct {
	alpha  float64
	ps     []float64
	then   []func(rejected bool)
	counts [3]int // by memberKind
	// rejected is the number of members Holm rejected (after decide).
	rejected int
}

// memberKind names where a member of the family comes from.
type memberKind int

const (
	checkUnit memberKind = iota
	selfCheckPort
	uniformityTest
)

// add puts a p-value into the family; then is called by decide.
func (f *family) add(kind memberKind, p float64, then func(rejected bool)) {
	f.ps = append(f.ps, p)
	f.then = append(f.then, then)
	f.counts[kind]++
}

// size is m, the number of members.
func (f *family) size() int { return len(f.ps) }

// decide runs Holm at alpha over the family and hands each member its
// decision, in the order they were added.
func (f *family) decide() {
	if len(f.ps) == 0 {
		return
	}
	for i, rej := range stats.Holm(f.ps, f.alpha) {
		if rej {
			f.rejected++
		}
		if f.then[i] != nil {
			f.then[i](rej)
		}
	}
}
