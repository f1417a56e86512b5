package app

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/sim/cluster"
)

const legacyRef = `[{"mode":"iptables","variant":"legacy","machine":"qemu microVM (harness/vm), TCG","points":[
 {"services":100,"endpointsPerService":10,"fullSyncSeconds":%s,"runs":3},
 {"services":300,"endpointsPerService":10,"fullSyncSeconds":%s,"runs":3}]}]`

func writeRef(t *testing.T, name, a, b string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	text := strings.Replace(strings.Replace(legacyRef, "%s", a, 1), "%s", b, 1)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Bad flags and bad reference files are bad input (exit 2), caught before
// anything is measured or booted.
func TestCalibrateIPVSFlagErrors(t *testing.T) {
	good := writeRef(t, "vm.json", "2", "6")
	nft := filepath.Join(t.TempDir(), "nft.json")
	os.WriteFile(nft, []byte(`[{"mode":"iptables","variant":"nft","points":[{"services":100,"fullSyncSeconds":1}]}]`), 0o644)
	two := filepath.Join(t.TempDir(), "two.json")
	os.WriteFile(two, []byte(`[{"mode":"iptables","variant":"nft","points":[{"services":100,"fullSyncSeconds":1}]},{"mode":"iptables","variant":"legacy","points":[{"services":100,"fullSyncSeconds":1}]}]`), 0o644)
	empty := filepath.Join(t.TempDir(), "empty.json")
	os.WriteFile(empty, []byte(`[{"mode":"nftables","variant":"fast","points":[]}]`), 0o644)
	notJSON := filepath.Join(t.TempDir(), "x.json")
	os.WriteFile(notJSON, []byte("not json"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "ipvs", "--backend", "nft,legacy"}, "one --backend"},
		{[]string{"--mode", "ipvs", "--backend", "xdp"}, "one --backend"},
		{[]string{"--mode", "ipvs", "--subject", "kube-proxy"}, "not ipvs"},
		{[]string{"--vm", "--subject", "kube-proxy"}, "--vm"},
		{[]string{"--mode", "ipvs", "--vm", "--reference-vm", good}, "go together"},
		{[]string{"--mode", "iptables", "--reference-vm", good, "--reference-host", good}, "add --vm"},
		{[]string{"--mode", "ipvs", "--vm", "--reference-vm", good, "--reference-host", "/does/not/exist.json"}, "could not read"},
		{[]string{"--mode", "ipvs", "--vm", "--reference-vm", good, "--reference-host", nft}, "the references differ"},
		{[]string{"--mode", "ipvs", "--vm", "--reference-vm", good, "--reference-host", two}, "holds one calibration"},
		{[]string{"--mode", "ipvs", "--vm", "--reference-vm", good, "--reference-host", empty}, "has no points"},
		{[]string{"--mode", "ipvs", "--vm", "--reference-vm", notJSON, "--reference-host", good}, "not a calibration"},
		{[]string{"--mode", "ipvs", "--vm", "--sizes", "0"}, "out of range"},
		{[]string{"--mode", "ipvs", "--vm", "--runs", "0"}, "must be positive"},
	} {
		code, _, errs := run(append([]string{"calibrate"}, tc.args...)...)
		if code != ExitBadInput || !strings.Contains(errs, tc.want) {
			t.Errorf("sim calibrate %v: exit %d, stderr %q; want %d naming %q", tc.args, code, errs, ExitBadInput, tc.want)
		}
	}
}

// The guest runs the same calibration, written to the results share.
func TestCalibrateArgs(t *testing.T) {
	f := calibrateFlags{mode: modeFlag{cluster.ModeIPVS}, sizes: []int{100, 300}, endpoints: 10, runs: 3, backends: []string{"nft"}}
	got := strings.Join(calibrateArgs(&f), " ")
	want := "calibrate --mode ipvs --sizes 100,300 --endpoints 10 --runs 3 --write /results/" + vmCalibrationFile + " --backend nft"
	if got != want {
		t.Errorf("guest args %q, want %q", got, want)
	}
	f.mode.m, f.layouts = cluster.ModeNFTables, []string{"fast"}
	if args := calibrateArgs(&f); !slices.Contains(args, "--layout") || slices.Contains(args, "--backend") {
		t.Errorf("nftables guest args %v", args)
	}
}

// The references' ratio lands in every calibration's emulation.
func TestApplyEmulation(t *testing.T) {
	f := calibrateFlags{refVM: writeRef(t, "vm.json", "2", "9"), refHost: writeRef(t, "host.json", "0.25", "1")}
	out := []*calibrate.Calibration{{Mode: cluster.ModeIPVS, Variant: "netlink"}}
	var errb bytes.Buffer
	if err := applyEmulation(Streams{Err: &errb}, &f, out); err != nil {
		t.Fatal(err)
	}
	// Ratios 8 and 9: the upper median 9, range 8-9.
	e := out[0].Emulation
	if e == nil || e.Ratio != 9 || e.Low != 8 || e.High != 9 || !strings.Contains(e.Method, "TCG") {
		t.Fatalf("emulation %+v", e)
	}
	if !strings.Contains(errb.String(), "100 x 10: VM 2.000 s, host 0.250 s, ratio 8.00") {
		t.Errorf("per-size ratios not printed: %s", errb.String())
	}
}
