package app

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const capacityScenario = "../../../sim/capacity/testdata/small.yaml"

func TestCapacityBadInputExit2(t *testing.T) {
	for _, args := range [][]string{
		{"capacity", capacityScenario, "--sizes", "1000,x"},
		{"capacity", capacityScenario, "--sizes", "0"},
		{"capacity", capacityScenario, "--sizes", ""},
		{"capacity", capacityScenario, "--slo", "programming-latency"},
		{"capacity", capacityScenario, "--slo", "programming-latency=soon"},
		{"capacity", capacityScenario, "--slo", "latency=1s"},
		{"capacity", capacityScenario, "--slo", "first-packet-rules=-3"},
		{"capacity", capacityScenario, "-o", "xml"},
		{"capacity", capacityScenario, "--nodes", "some"},
		{"capacity", capacityScenario, "--progress", "sometimes"},
		{"capacity", "does-not-exist.yaml"},
		{"capacity", "../../../scenarios/conformance/distribution.yaml", "--sizes", "100"},
		{"capacity"},
	} {
		if code, _, errs := run(args...); code != ExitBadInput {
			t.Errorf("sim %v: exit %d, want %d (stderr %q)", args, code, ExitBadInput, errs)
		}
	}
}

// TestCapacityOutputs: exit 0, each -o format, and --out writes every file.
func TestCapacityOutputs(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := run("capacity", capacityScenario, "--sizes", "100,400", "--slo", "programming-latency=1s", "--calibration", "../../../results/calibration", "--out", dir, "--progress", "never")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(out, "Largest size that meets each SLO") || !strings.Contains(out, "extrapolated") {
		t.Errorf("table lacks the SLO answers or the extrapolation marks:\n%s", out)
	}
	for _, f := range []string{"capacity.json", "capacity.md", "capacity.txt", "perfdata.json", "full-sync.png", "programming-latency.png", "objects.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("--out did not write %s: %v", f, err)
		}
	}
	code, out, _ = run("capacity", capacityScenario, "--sizes", "100", "-o", "json", "--progress", "never")
	var v struct {
		Sizes []struct {
			Services int `json:"services"`
		} `json:"sizes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || len(v.Sizes) != 1 || v.Sizes[0].Services != 100 {
		t.Errorf("-o json: exit %d, %q", code, out)
	}
	for _, o := range []string{"markdown", "perfdata"} {
		if code, out, errs := run("capacity", capacityScenario, "--sizes", "100", "-o", o, "--progress", "never"); code != 0 || out == "" {
			t.Errorf("-o %s: exit %d, %s", o, code, errs)
		}
	}
}
