package conform

import (
	"net/netip"
	"testing"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/upstream"
)

// TestControlPlanePrefix: the last host address of the first node's
// network, refused when a node holds it.
func TestControlPlanePrefix(t *testing.T) {
	cfg := &netns.Config{Nodes: []netns.NodeConfig{{Name: "a", Addr: netip.MustParsePrefix("192.168.1.10/24")}, {Name: "b", Addr: netip.MustParsePrefix("192.168.1.11/24")}}}
	p, err := controlPlanePrefix(cfg)
	if err != nil || p != netip.MustParsePrefix("192.168.1.254/24") {
		t.Errorf("got %v, %v; want 192.168.1.254/24", p, err)
	}
	cfg.Nodes[1].Addr = netip.MustParsePrefix("192.168.1.254/24")
	if _, err := controlPlanePrefix(cfg); err == nil {
		t.Error("a node on the control plane's address must be an error")
	}
	if _, err := controlPlanePrefix(&netns.Config{}); err == nil {
		t.Error("no node must be an error")
	}
}

// TestSyncFigures: the first full sync from the full histogram (the sync
// histogram when the release has none); the partial sync from the partial
// histogram's delta, else the sync histogram's.
func TestSyncFigures(t *testing.T) {
	if got := firstFull(upstream.Metrics{Syncs: 1, SyncSeconds: 2.5, FullSyncs: 1, FullSyncSeconds: 2.4}); got != 2.4 {
		t.Errorf("full = %v, want 2.4", got)
	}
	if got := firstFull(upstream.Metrics{Syncs: 1, SyncSeconds: 2.5}); got != 2.5 {
		t.Errorf("full without the full histogram = %v, want 2.5", got)
	}
	a := upstream.Metrics{Syncs: 1, SyncSeconds: 2.5, PartialSyncs: 0}
	if got := partialOf(a, upstream.Metrics{Syncs: 2, SyncSeconds: 2.75, PartialSyncs: 1, PartialSyncSeconds: 0.2}); got != 0.2 {
		t.Errorf("partial = %v, want 0.2", got)
	}
	if got := partialOf(a, upstream.Metrics{Syncs: 3, SyncSeconds: 3.5}); got != 0.5 {
		t.Errorf("partial from the sync histogram = %v, want 0.5", got)
	}
}
