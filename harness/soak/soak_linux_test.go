package soak

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
)

// TestSoakNamespaces runs a short soak in real namespaces (nftables mode,
// every 5th apply failing): the kernels must equal the fresh render, every
// failed sync must be an injected one and have recovered, and nothing of
// either run may be left. `make soak` runs the long ones.
func TestSoakNamespaces(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "nft", "ipset", "flock", "awk")
	pathBefore := os.Getenv("PATH")
	var log strings.Builder
	res, err := Run(context.Background(), "../../scenarios/soak.yaml", Options{Mode: "nftables", Events: 150, FailApplyEvery: 5, Interval: 5 * time.Millisecond, Log: &log})
	if err != nil {
		t.Fatalf("soak: %v\n%s", err, log.String())
	}
	if !res.Passed() {
		for _, n := range res.PerNode {
			t.Logf("%s: %d diff lines %q, sync errors %q", n.Name, n.DiffLines, n.Diff, n.SyncErrors)
		}
		t.Fatalf("soak failed: %v", res.Failed)
	}
	if res.FailuresInjected == 0 || res.Recoveries != res.FailuresInjected || res.DiffLines != 0 || len(res.Leaks) != 0 {
		t.Errorf("%d failures injected, %d recoveries, %d diff lines, leaks %v", res.FailuresInjected, res.Recoveries, res.DiffLines, res.Leaks)
	}
	if res.Syncs < 10 || res.Events != 150 {
		t.Errorf("%d syncs for %d events: the sync loop did not run", res.Syncs, res.Events)
	}
	if os.Getenv("PATH") != pathBefore {
		t.Errorf("PATH not restored: %q", os.Getenv("PATH"))
	}
	// Run's own check found no namespace or marker of its runs (Leaks);
	// look again from here.
	if len(res.RunIDs) != 2 {
		t.Fatalf("run IDs %v: want the soak's and the reference's", res.RunIDs)
	}
	entries, _ := os.ReadDir(netns.NetnsDir)
	for _, e := range entries {
		for _, id := range res.RunIDs {
			if strings.HasPrefix(e.Name(), netns.RunPrefix(id)) {
				t.Errorf("namespace %s left", e.Name())
			}
		}
	}
}
