package iptables_test

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/iptables"
)

// TestRestoreDump writes the exact restore input of the first full sync (jumps
// merged, as calibrate.Synthetic builds it) at 100..2000 Services x 10 into
// $KPSIM_RESTORE_DUMP_DIR, for the --noflush measurements in
// results/calibration/noflush (skipped without the variable).
func TestRestoreDump(t *testing.T) {
	dir := os.Getenv("KPSIM_RESTORE_DUMP_DIR")
	if dir == "" {
		t.Skip()
	}
	for _, n := range []int{100, 250, 500, 1000, 2000} {
		b, err := iptables.NewBackendWithCommands(iptables.NewFakeCommands(), iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-1", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Sync(calibrate.Synthetic(n, 10), nil, true); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(fmt.Sprintf("%s/rules-%d.txt", dir, n), []byte(b.LastText), 0o644)
	}
}
