package dataplanetest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/dataplane/trace"
)

// Expected is what a flow must trace to, as a test states it from the
// oracle (this kit does not link the oracle: the dataplane never imports
// it, test kit included): its targets as the oracle prints them ("ip:port,
// ip:port", "DROP" or "REJECT"), and whether each endpoint sees the node's
// address as the source.
type Expected struct {
	Outcome string
	Masq    func(endpoint string) bool
	Reason  string
}

// Agree holds a tracer's result for flow f against want: the same targets
// and, per endpoint, masquerade exactly where want expects the node's
// address. It returns "" when they agree.
func Agree(f Flow, res trace.Result, want Expected) string {
	var got []string
	for _, o := range res {
		if o.P <= 0 {
			continue
		}
		got = append(got, o.Target)
		if o.Target == trace.OutcomeDrop || o.Target == trace.OutcomeReject || o.Target == trace.OutcomeAccept {
			continue
		}
		if m := want.Masq(o.Target); o.Masquerade != m {
			return fmt.Sprintf("%s: %s masquerade %v, want %v (%s)", f, o.Target, o.Masquerade, m, want.Reason)
		}
	}
	slices.Sort(got)
	got = slices.Compact(got)
	if strings.Join(got, ", ") != want.Outcome {
		return fmt.Sprintf("%s: traced %s, want %s (%s)", f, strings.Join(got, ", "), want.Outcome, want.Reason)
	}
	return ""
}
