package app

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/diagnose/archive"
)

// untarExternal unpacks one of harness/diagnose's external-path fixtures
// into a temporary folder.
func untarExternal(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	if err := archive.Extract(filepath.Join("..", "..", "..", "harness", "diagnose", "testdata", "external", name+".tar.gz"), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// externalArgs are sim diagnose's arguments for node-c's last dump of a
// fixture, node-a's and node-b's as peers (named, and inferred from the
// API), and the API beside it.
func externalArgs(dir string) []string {
	d := filepath.Join(dir, "01-diagnose-external")
	at := func(check string) string { return filepath.Join(d, check, "after.iptables-save") }
	return []string{"diagnose", "--iptables-save", at("004-shop-external-ip-node-c"), "--api", filepath.Join(d, "004-shop-external-ip-node-c", "api.yaml"),
		"--peer", "node-a=" + at("002-shop-node-port-node-a"), "--peer", at("003-shop-load-balancer-node-b")}
}

// TestDiagnoseExternal: the real dumps of three nodes under an even
// balancer to a Local Service with 1, 2 and 3 pods: exit 0, the external
// section and the placement naming its cause; with the uniform-probability
// fault exit 1 on the Local split; --peer without a file is usage.
func TestDiagnoseExternal(t *testing.T) {
	code, out, errs := run(externalArgs(untarExternal(t, "kpsim-iptables-correct"))...)
	if code != ExitOK || !strings.Contains(out, "other nodes node-a=") || !strings.Contains(out, "node-b=") ||
		!strings.Contains(out, "PLACEMENT demo/web:http (externalTrafficPolicy Local): cause placement") || !strings.Contains(out, "[local-placement]") {
		t.Fatalf("correct: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(append(externalArgs(untarExternal(t, "kpsim-iptables-uniform-probability")), "-o", "markdown")...)
	if code != ExitCheckFailed || !strings.Contains(errs, "unequal-rule-shares demo/web:http (external, Local, node-c)") || !strings.Contains(out, "## External traffic") {
		t.Fatalf("fault: exit %d\n%s%s", code, out, errs)
	}
	nodeC := externalArgs(untarExternal(t, "kpsim-iptables-correct"))[:3]
	for _, bad := range []string{"node-a=", "no-such-peer.txt"} {
		code, _, errs = run(append(nodeC, "--peer", bad)...)
		if code != ExitBadInput || !strings.Contains(errs, bad) {
			t.Errorf("--peer %q: exit %d %s", bad, code, errs)
		}
	}
}
