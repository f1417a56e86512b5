package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cost"
)

func sample() *Report {
	hist := make([]Bin, 4)
	for i := range hist {
		hist[i] = Bin{Lo: float64(i) / 10, Hi: float64(i+1) / 10, Count: i}
	}
	m := Mode{
		Mode:        "nftables",
		Connections: Connections{Total: 1234567, Accepted: 1234000, Dropped: 500, Rejected: 67},
		Rules:       Rules{Measure: "objects", ObjectsMax: 100, ObjectsTotal: 200},
		Sync:        Sync{Variant: "kube-proxy", P50Seconds: 1.5, P99Seconds: 2, FullSeconds: 2},
		SelfCheck: SelfCheck{What: SelfCheckWhat, Method: MethodChiSquare, Verdict: Pass, ServicePorts: 3, WorstP: 0.01, WorstPServicePort: "a/b",
			Histogram: hist, Uniformity: &Uniformity{N: 3, D: 0.2, P: 0.9, Expected: 0.15, Histogram: hist},
			Findings: []string{"nftables: the p-values are uniform"}},
		Flapping: Flapping{Steps: []StepWindow{{Step: 1, AtSeconds: 1, WindowP50Seconds: 0.5, WindowMaxSeconds: 0.9}}},
		Timeline: &Timeline{ServicePort: "a/b", BinSeconds: 0.5, Eligible: []int{3, 2, 3}, Connections: []int64{5, 5, 5}, Misrouted: []int64{0, 2, 0}},
	}
	return &Report{
		Scenario: "x", File: "x.yaml", Seed: 1,
		Cluster:      &apiserver.Summary{ServicePorts: 10, Endpoints: apiserver.EndpointCounts{Total: 30}},
		Steps:        []Step{{AtSeconds: 1, Description: "1s a/b pod ready=false", ServicePorts: []string{"a/b"}}},
		Modes:        []Mode{m},
		Checks:       []Check{{Mode: "nftables", Name: "flapping:a/b", Type: "flapping", Verdict: Fail, Message: "fail on 1 of 1 client node(s): n1"}},
		Failed:       []string{"nftables/flapping:a/b"},
		Family:       Family{Alpha: 0.001, Size: 4, SelfCheckPorts: 3, UniformityTests: 1},
		Calibrations: cost.Defaults(),
	}
}

func TestWriters(t *testing.T) {
	r := sample()
	var table, md bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1,234,567", "1.50 s / 2.00 s", "flapping:a/b", "fail", "Engine self-check: the simulator's engines' draws against the oracle", "pass: chi-square, 3 ports, 0 rejected", "m = 4 tests"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Simulation: x", "**1 check(s) failed:**", "| 1 | 1.00 s |", "![flapping](flapping.png)",
		"## Engine self-check: the simulator's engines' draws against the oracle", "![p-values](p-values.png)", "- nftables: the p-values are uniform"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	dir := t.TempDir()
	files, err := r.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 7 {
		t.Errorf("wrote %v", files)
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, Files.Rules)); !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Error("rules.png is not a PNG")
	}
}

// TestWriteFilesUntested: a report whose only mode the self-check does not
// test (ipvs lc: no histogram) still draws its deviation plot (an empty
// log axis made WriteFiles fail).
func TestWriteFilesUntested(t *testing.T) {
	r := sample()
	r.Modes[0].SelfCheck = SelfCheck{What: SelfCheckWhat, Method: MethodNone, Reason: "not a draw", Verdict: Pass}
	if _, err := r.WriteFiles(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

func TestCount(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", -1234567: "-1,234,567", 12000000: "12,000,000"} {
		if got := count(in); got != want {
			t.Errorf("count(%d) = %q, want %q", in, got, want)
		}
	}
}
