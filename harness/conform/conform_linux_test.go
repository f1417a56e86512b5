package conform

import (
	"context"
	"slices"
	"testing"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/scenario"
)

const conformanceDir = "../../scenarios/conformance"

// runDir runs the conformance scenarios (the many-endpoints scenario is
// left to make conformance, which runs the binary without the race detector:
// designing its 50-endpoint sequential test under -race takes half a
// minute) whose checks include one of types (all when none is given).
func runDir(t *testing.T, o Options, types ...string) *report.Run {
	t.Helper()
	all, err := filesIn(conformanceDir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range smallScenarios(all) {
		l, err := scenario.LoadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range l.Scenario.Checks {
			if len(types) == 0 || slices.Contains(types, c.Type) {
				files = append(files, f)
				break
			}
		}
	}
	run, err := Run(context.Background(), files, o)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// The correct dataplane passing every check is make conformance's job: it
// runs the whole suite (many-endpoints included) in the four iptables and
// nftables configurations with the binary make test built, and writes their
// JUnit. The Go tests run the faults, under the race detector in make test.

// TestConformanceFaults: every named fault fails the run, and among the
// failed checks is the one that should catch it.
func TestConformanceFaults(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "iptables-nft-restore", "conntrack")
	for _, f := range proxy.AllFaults() {
		want, ok := FaultCatches[f]
		if !ok {
			t.Errorf("fault %s has no check declared to catch it", f)
			continue
		}
		t.Run(string(f), func(t *testing.T) {
			// The scenarios with a check of the type that must catch it.
			run := runDir(t, Options{Mode: "iptables", Faults: []string{string(f)}}, want)
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

// TestEstablishedLocalMasquerade: the established-flow checks under
// internalTrafficPolicy Local and masqueradeAll pass on the correct
// dataplane (the two that cannot test anything there not run, with the
// reason), and the UDP flows still catch no-conntrack-cleanup.
func TestEstablishedLocalMasquerade(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "iptables-nft-restore", "conntrack")
	file := "../../scenarios/testdata/established/local-masquerade.yaml"
	run, err := Run(context.Background(), []string{file}, Options{Mode: "iptables"})
	if err != nil {
		t.Fatal(err)
	}
	notRun := 0
	for _, c := range run.Suites[0].Checks {
		switch c.Verdict {
		case report.NotRun:
			notRun++
		case report.Pass:
		default:
			t.Errorf("%s: %s: %s", c.Name, c.Verdict, c.Message)
		}
	}
	if notRun != 2 {
		t.Errorf("%d verdicts not run, want 2 (the terminating phase and the UDP affinity move: one local endpoint)", notRun)
	}
	run, err = Run(context.Background(), []string{file}, Options{Mode: "iptables", Faults: []string{string(proxy.FaultNoConntrackCleanup)}})
	if err != nil {
		t.Fatal(err)
	}
	caught := false
	for _, c := range run.Suites[0].Checks {
		caught = caught || (c.Verdict == report.Fail && c.Type == scenario.CheckUDPFlow)
	}
	if !caught {
		t.Errorf("no-conntrack-cleanup passed every udp-flow phase under Local and masqueradeAll (failed: %v)", run.Failed())
	}
}
