package diagnosetest

import (
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/diagnose"
)

// TestJudgeRoundTrip: a passed check agrees with no finding or only the
// findings its type may meet; a failed one agrees when one of its fault's
// findings is on the port, and never on the correct dataplane.
func TestJudgeRoundTrip(t *testing.T) {
	finding := func(kinds ...string) []*diagnose.Finding {
		var out []*diagnose.Finding
		for _, k := range kinds {
			out = append(out, &diagnose.Finding{Level: diagnose.LevelFinding, Kind: k})
		}
		return out
	}
	dist := &diagnose.DumpedCheck{Type: "distribution"}
	local := &diagnose.DumpedCheck{Type: "internal-traffic-local"}
	correct := &diagnose.Manifest{}
	uniform := &diagnose.Manifest{Faults: []string{"uniform-probability"}}
	for _, c := range []struct {
		name     string
		m        *diagnose.Manifest
		r        RoundTripResult
		mismatch string // "" when the two agree, else a part of the message
	}{
		{"passed, no finding", correct, RoundTripResult{Check: dist}, ""},
		{"passed, a finding", correct, RoundTripResult{Check: dist, Findings: finding(diagnose.KindStale)}, "sim diagnose reports " + diagnose.KindStale},
		{"passed, a finding the type may meet", correct, RoundTripResult{Check: local, Findings: finding(diagnose.KindNoLocal)}, ""},
		{"passed, that finding on another type", correct, RoundTripResult{Check: dist, Findings: finding(diagnose.KindNoLocal)}, "sim diagnose reports"},
		{"failed on the correct dataplane", correct, RoundTripResult{Check: dist, Failed: true}, "a false failure"},
		{"failed, the fault's finding", uniform, RoundTripResult{Check: dist, Failed: true, Findings: finding(diagnose.KindStale, diagnose.KindUnequalRules)}, ""},
		{"failed, another finding", uniform, RoundTripResult{Check: dist, Failed: true, Findings: finding(diagnose.KindStale)}, "want one of"},
		{"failed, a fault without findings", &diagnose.Manifest{Faults: []string{"no-such-fault"}}, RoundTripResult{Check: dist, Failed: true}, "no finding is named"},
	} {
		got := judgeRoundTrip(c.m, c.r)
		if c.mismatch == "" && got != "" || c.mismatch != "" && !strings.Contains(got, c.mismatch) {
			t.Errorf("%s: %q, want %q", c.name, got, c.mismatch)
		}
	}
}
