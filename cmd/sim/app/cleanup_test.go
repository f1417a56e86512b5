package app

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
)

func runCleanup(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(append([]string{"cleanup"}, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

func TestCleanupNeedsRoot(t *testing.T) {
	old := geteuid
	geteuid = func() int { return 1000 }
	t.Cleanup(func() { geteuid = old })
	code, _, errs := runCleanup()
	if code != ExitEnvironment || !strings.Contains(errs, "needs root") {
		t.Errorf("cleanup as non-root: exit %d, stderr %q; want %d and a message saying root is needed", code, errs, ExitEnvironment)
	}
}

func TestCleanupUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--prefix", "cni-"},
		{"--prefix", "kpsim-abc"},
		{"-o", "xml"},
		{"extra-arg"},
	} {
		if code, _, errs := runCleanup(args...); code != ExitBadInput {
			t.Errorf("sim cleanup %v: exit %d, want %d (stderr %q)", args, code, ExitBadInput, errs)
		}
	}
}

func skipUnlessRootForCleanup(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
}

func TestCleanupNothing(t *testing.T) {
	skipUnlessRootForCleanup(t)
	id, err := netns.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCleanup("--prefix", netns.RunPrefix(id))
	if code != ExitOK || !strings.Contains(out, "nothing to clean up") {
		t.Errorf("exit %d, out %q, stderr %q", code, out, errs)
	}
	code, out, _ = runCleanup("--prefix", netns.RunPrefix(id), "-o", "json", "--dry-run")
	var rep netns.CleanupReport
	if code != ExitOK || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Items) != 0 {
		t.Errorf("json: exit %d, out %q", code, out)
	}
}

// TestCleanupLiveRun builds a one-node topology in this (live) process: a
// plain cleanup skips it, --force removes it.
func TestCleanupLiveRun(t *testing.T) {
	skipUnlessRootForCleanup(t)
	cfg := &netns.Config{Nodes: []netns.NodeConfig{{
		Name:      "node-1",
		Addr:      netip.MustParsePrefix("198.18.0.1/16"),
		PodCIDR:   netip.MustParsePrefix("10.244.0.0/24"),
		Gateway:   netip.MustParseAddr("10.244.0.1"),
		Endpoints: []netip.Addr{netip.MustParseAddr("10.244.0.2")},
	}}}
	var err error
	if cfg.RunID, err = netns.NewRunID(); err != nil {
		t.Fatal(err)
	}
	topo, err := netns.Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Close() })
	prefix := netns.RunPrefix(cfg.RunID)

	code, out, errs := runCleanup("--prefix", prefix)
	if code != ExitOK || strings.Count(out, netns.ActionSkipped) != 3 || !strings.Contains(out, "3 skipped") || strings.Contains(out, "removed") {
		t.Errorf("live run: exit %d, stderr %q, out:\n%s", code, errs, out)
	}
	code, out, errs = runCleanup("--prefix", prefix, "--force", "-o", "json")
	var rep netns.CleanupReport
	if err := json.Unmarshal([]byte(out), &rep); code != ExitOK || err != nil {
		t.Fatalf("--force: exit %d, stderr %q, out %q", code, errs, out)
	}
	kinds := map[string]int{}
	for _, it := range rep.Items {
		if it.Action != netns.ActionRemoved || !it.Alive || it.PID != os.Getpid() {
			t.Errorf("--force item %+v", it)
		}
		kinds[it.Kind]++
	}
	if kinds[netns.KindNetns] != 3 || kinds[netns.KindMarker] != 1 {
		t.Errorf("--force removed %v, want 3 namespaces and the marker", kinds)
	}
	if _, err := os.Stat(netns.NetnsDir + "/" + netns.NodeName(cfg.RunID, "node-1")); !os.IsNotExist(err) {
		t.Errorf("node namespace still there after --force: %v", err)
	}
}
