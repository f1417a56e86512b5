package conform

import (
	"testing"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/testenv"
)

// TestConformanceNFTables: in both nftables layouts, every named fault fails
// the run with the check that should catch it (the correct dataplane passing:
// make conformance).
func TestConformanceNFTables(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft", "conntrack", "iptables-nft")
	for _, layout := range []string{"kube-proxy", "fast"} {
		t.Run(layout, func(t *testing.T) {
			for _, f := range proxy.AllFaults() {
				run := runDir(t, Options{Mode: "nftables", NFTablesLayout: layout, Faults: []string{string(f)}}, FaultCatches[f])
				caught := false
				for _, s := range run.Suites {
					for _, c := range s.Checks {
						caught = caught || (c.Verdict == report.Fail && c.Type == FaultCatches[f])
					}
				}
				if !caught {
					t.Errorf("%s layout, fault %s: no %s check failed (failed: %v)", layout, f, FaultCatches[f], run.Failed())
				}
			}
		})
	}
}
