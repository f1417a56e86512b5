package conform

import (
	"testing"

	"github.com/kpsim/kpsim/harness/internal/diagnosetest"
	"github.com/kpsim/kpsim/harness/testenv"
)

// TestDiagnoseRoundTripFresh: the round trip on a fresh run, so that the
// committed dumps (harness/diagnose/testdata/dumps) cannot drift from what
// the code produces unnoticed: per mode, the fair scenario on the correct
// dataplane and with uniform-probability, then sim diagnose's analysis of
// every dump must reach the run's verdict (diagnosetest.RoundTrip).
func TestDiagnoseRoundTripFresh(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft", "conntrack", "iptables-nft", "iptables-nft-save")
	for _, o := range []Options{
		{Mode: "iptables", IPTablesBackend: "nft"},
		{Mode: "iptables", IPTablesBackend: "nft", Faults: []string{"uniform-probability"}},
		{Mode: "nftables", NFTablesLayout: "kube-proxy"},
		{Mode: "nftables", NFTablesLayout: "kube-proxy", Faults: []string{"uniform-probability"}},
	} {
		t.Run(string(o.Mode)+"/"+func() string {
			if len(o.Faults) == 0 {
				return "correct"
			}
			return o.Faults[0]
		}(), func(t *testing.T) {
			dir, _ := dumpRun(t, "fair.yaml", o)
			res, err := diagnosetest.RoundTrip(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(res) == 0 {
				t.Fatal("no decided check")
			}
			caught := 0
			for _, r := range res {
				if r.Mismatch != "" {
					t.Errorf("%s (%s): %s", r.Check.Dir, r.Format, r.Mismatch)
				}
				if r.Failed {
					caught++
				}
			}
			if len(o.Faults) > 0 && caught == 0 {
				t.Errorf("fault %v: no check failed", o.Faults)
			}
		})
	}
}
