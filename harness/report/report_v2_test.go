package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// v2 is a run with every kind of verdict: a pass with a share table and
// intervals, a failure, an environment error, a plain error, a check not run
// and an environment setup error.
func v2() *Run {
	table := []Row{
		{Outcome: "10.244.0.10:8080", Observed: 3100, Expected: 3000, CILow: 0.32, CIHigh: 0.36},
		{Outcome: "10.244.0.11:8080", Observed: 2950, Expected: 3000, CILow: 0.31, CIHigh: 0.345},
		{Outcome: "10.244.1.10:8080", Observed: 2950, Expected: 3000, CILow: 0.31, CIHigh: 0.345},
		{Outcome: "DROP (lost)", Observed: 0, Expected: 0},
	}
	return &Run{Mode: "iptables", Kernel: "6.18", Seed: 7, FamilyAlpha: 0.001, Suites: []*Suite{
		{Scenario: "dist", Checks: []*Check{
			{Name: "web @ node-a", Type: "distribution", Verdict: Pass, Test: "chi-square", P: 0.4, N: 9000, Table: table,
				Loss: &Loss{Sent: 9000, Arrived: 9000, Decided: 9000}, Independence: "independent: 1 block, 9,000 probes, 9,000 new conntrack entries"},
			{Name: "api @ node-a", Type: "distribution", Verdict: Fail, P: 1e-9, N: 9000},
			{Name: "api @ node-b", Type: "distribution", Verdict: Error, ErrorKind: KindEnvironment, Message: "observation lost 12 probes on node-b",
				Loss: &Loss{Sent: 9000, Arrived: 8988, Lost: 12, Missed: 12, Decided: 9000}},
			{Name: "db @ node-a", Type: "distribution", Verdict: Error, Message: "no client pod"},
			{Name: "aff / expiry", Type: "affinity", Verdict: NotRun, Message: "timeoutSeconds 10800 exceeds the 10 s the harness waits"},
		}},
		{Scenario: "env", SetupError: "could not build the namespaces", SetupErrorKind: KindEnvironment},
	}}
}

func TestVerdictKinds(t *testing.T) {
	r := v2()
	if got := strings.Join(r.Failed(), ","); got != "dist/api @ node-a,dist/db @ node-a" {
		t.Errorf("Failed = %s, want the failure and the non-environment error only", got)
	}
	env := r.EnvironmentErrors()
	if len(env) != 2 || !strings.Contains(env[0], "observation lost 12 probes on node-b") || !strings.HasPrefix(env[1], "env/setup: ") {
		t.Errorf("EnvironmentErrors = %q", env)
	}
	if ran, notRun := r.Verdicts(); ran != 4 || notRun != 1 {
		t.Errorf("Verdicts = %d ran, %d not run, want 4, 1", ran, notRun)
	}
}

func TestJUnitSkipped(t *testing.T) {
	var buf bytes.Buffer
	if err := v2().WriteJUnit(&buf); err != nil {
		t.Fatal(err)
	}
	var js junitSuites
	if err := xml.Unmarshal(buf.Bytes(), &js); err != nil {
		t.Fatal(err)
	}
	if js.Skipped != 1 || js.Failures != 1 || js.Errors != 3 {
		t.Errorf("skipped %d failures %d errors %d, want 1, 1, 3", js.Skipped, js.Failures, js.Errors)
	}
	if !strings.Contains(buf.String(), `<skipped message="timeoutSeconds 10800`) || !strings.Contains(buf.String(), `type="environment"`) {
		t.Errorf("JUnit lacks the skipped element or the environment type:\n%s", buf.String())
	}
}

func TestMarkdownV2(t *testing.T) {
	var md bytes.Buffer
	if err := v2().WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	s := md.String()
	for _, want := range []string{"**2 failed**", "4 verdicts ran, 1 not run (reasons listed)", "timeoutSeconds 10800 exceeds",
		"Environment errors", "observation lost 12 probes on node-b", "| 12 (12) |", "[0.32000, 0.36000]", "independent: 1 block"} {
		if !strings.Contains(s, want) {
			t.Errorf("markdown lacks %q:\n%s", want, s)
		}
	}
	var js bytes.Buffer
	if err := v2().WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Run
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	c := back.Suites[0].Checks[2]
	if c.Loss == nil || c.Loss.Missed != 12 || c.ErrorKind != KindEnvironment || back.Suites[0].Checks[0].Table[0].CIHigh != 0.36 {
		t.Errorf("json round trip lost fields: %+v", c)
	}
}

func TestWritePlots(t *testing.T) {
	dir := t.TempDir()
	if err := v2().WritePlots(dir); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Only the check with a share table gets a plot.
	if len(entries) != 1 || entries[0].Name() != "dist--web___node-a.png" {
		t.Fatalf("plots: %v", entries)
	}
	f, err := os.Open(filepath.Join(dir, entries[0].Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 500 || b.Dy() < 300 {
		t.Errorf("plot is %v", b)
	}
}
