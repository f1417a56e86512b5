package conform

import (
	"context"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/testenv"
)

const conformanceDir = "../../scenarios/conformance"

func runDir(t *testing.T, o Options) *report.Run {
	t.Helper()
	files, err := filesIn(conformanceDir)
	if err != nil {
		t.Fatal(err)
	}
	run, err := Run(context.Background(), files, o)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// TestConformanceCorrect: the correct dataplane passes every check, on both
// iptables backends.
func TestConformanceCorrect(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "iptables-nft-restore", "iptables-legacy-restore", "conntrack")
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) {
			run := runDir(t, Options{Mode: "iptables", IPTablesBackend: backend})
			if f := run.Failed(); len(f) > 0 {
				for _, s := range run.Suites {
					for _, c := range s.Checks {
						if c.Verdict != report.Pass {
							t.Log(c.Summary())
						}
					}
				}
				t.Fatalf("the correct dataplane failed %d checks: %v", len(f), f)
			}
			checks := 0
			for _, s := range run.Suites {
				checks += len(s.Checks)
			}
			t.Logf("%s: %d checks passed in %s", backend, checks, run.Duration)
		})
	}
}

// TestConformanceFaults: every named fault fails the run, and among the
// failed checks is the one that should catch it.
func TestConformanceFaults(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "iptables-nft-restore", "conntrack")
	for _, f := range dataplane.AllFaults() {
		want, ok := FaultCatches[f]
		if !ok {
			t.Errorf("fault %s has no check declared to catch it", f)
			continue
		}
		t.Run(string(f), func(t *testing.T) {
			run := runDir(t, Options{Mode: "iptables", Faults: []string{string(f)}})
			failed := run.Failed()
			if len(failed) == 0 {
				t.Fatalf("fault %s passed every check", f)
			}
			caught := false
			for _, s := range run.Suites {
				for _, c := range s.Checks {
					if c.Verdict == report.Fail && c.Type == want {
						caught = true
					}
				}
			}
			if !caught {
				t.Errorf("fault %s failed %v but no %s check", f, failed, want)
			}
			t.Logf("%s: %d checks failed, including %s", f, len(failed), want)
		})
	}
}
