package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runSoak(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(append([]string{"soak"}, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

const soakScenario = "../../../scenarios/soak.yaml"

func TestSoakUsage(t *testing.T) {
	for _, args := range [][]string{
		{},                      // no file
		{soakScenario, "extra"}, // two files
		{soakScenario},          // no --mode
		{soakScenario, "--mode", "ipvs"},
		{soakScenario, "--mode", "iptables", "--events", "0"},
		{soakScenario, "--mode", "iptables", "--events", "-5"},
		{soakScenario, "--mode", "iptables", "--fail-apply-every", "1"},
		{soakScenario, "--mode", "iptables", "--fail-apply-every", "-1"},
		{soakScenario, "--mode", "iptables", "--iptables-backend", "xt"},
		{soakScenario, "--mode", "nftables", "--layout", "slow"},
		{soakScenario, "--mode", "iptables", "--interval", "-1s"},
		{soakScenario, "--mode", "iptables", "--timeout", "0s"},
		{soakScenario, "--mode", "iptables", "-o", "xml"},
		{soakScenario, "--mode", "iptables", "--no-such-flag"},
	} {
		if code, _, errs := runSoak(args...); code != ExitBadInput {
			t.Errorf("sim soak %v: exit %d, want %d (stderr %q)", args, code, ExitBadInput, errs)
		}
	}
}

// A bad scenario is exit 2 with file:line, before the root check: nothing
// is created for bad input, as root or not.
func TestSoakBadScenario(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: kpsim.dev/v1alpha1\nkind: Scenario\nmetadata: {name: bad}\ncluster:\n  nodeCount: 2\ngenerate:\n  services: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, euid := range []int{0, 1000} {
		old := geteuid
		geteuid = func() int { return euid }
		code, _, errs := runSoak(bad, "--mode", "iptables")
		geteuid = old
		if code != ExitBadInput || !strings.Contains(errs, "bad.yaml:7:") {
			t.Errorf("euid %d: bad scenario: exit %d, stderr %q; want %d and bad.yaml:7:...", euid, code, errs, ExitBadInput)
		}
	}
	if code, _, errs := runSoak(filepath.Join(dir, "missing.yaml"), "--mode", "iptables"); code != ExitBadInput {
		t.Errorf("missing file: exit %d, want %d (stderr %q)", code, ExitBadInput, errs)
	}
}

func TestSoakNeedsRoot(t *testing.T) {
	old := geteuid
	geteuid = func() int { return 1000 }
	t.Cleanup(func() { geteuid = old })
	code, _, errs := runSoak(soakScenario, "--mode", "iptables", "--events", "10")
	if code != ExitEnvironment || !strings.Contains(errs, "needs root") {
		t.Errorf("soak as non-root: exit %d, stderr %q; want %d and a message saying root is needed", code, errs, ExitEnvironment)
	}
}
