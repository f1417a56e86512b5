package iptables_test

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/iptables"
)

// TestRestoreDump renders the exact restore input of the first full sync
// (jumps merged, as calibrate.Synthetic builds it) at 100..2000 Services x
// 10 and checks that it declares a chain per Service and endpoint; with
// $KPSIM_RESTORE_DUMP_DIR set it writes each into that folder, for the
// --noflush measurements in results/calibration/noflush.
func TestRestoreDump(t *testing.T) {
	dir := os.Getenv("KPSIM_RESTORE_DUMP_DIR")
	for _, n := range []int{100, 250, 500, 1000, 2000} {
		b, err := iptables.NewBackendWithCommands(iptables.NewFakeCommands(), iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-1", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Sync(calibrate.Synthetic(n, 10), nil, true); err != nil {
			t.Fatal(err)
		}
		svc, sep := strings.Count(b.LastText, "\n:KUBE-SVC-"), strings.Count(b.LastText, "\n:KUBE-SEP-")
		if svc != n || sep != 10*n {
			t.Errorf("%d Services x 10: the restore declares %d KUBE-SVC and %d KUBE-SEP chains, want %d and %d", n, svc, sep, n, 10*n)
		}
		if dir == "" {
			continue
		}
		if err := os.WriteFile(fmt.Sprintf("%s/rules-%d.txt", dir, n), []byte(b.LastText), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
