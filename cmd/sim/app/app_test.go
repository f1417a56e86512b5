package app

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/testenv"
)

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(args, Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := run("version", "-o", "json")
	var v map[string]string
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v["scenarioAPIVersion"] != "kpsim.dev/v1alpha1" {
		t.Fatalf("version: code %d, out %q", code, out)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"frobnicate"},
		{"run"},
		{"run", "a.yaml", "b.yaml"},
		{"run", "--no-such-flag", "x.yaml"},
		{"run", "../../../scenarios/1000-services.yaml", "-o", "xml"},
		{"validate"},
		{"validate", "does-not-exist.yaml"},
	} {
		if code, _, errs := run(args...); code != ExitBadInput {
			t.Errorf("sim %v: exit %d, want %d (stderr %q)", args, code, ExitBadInput, errs)
		}
	}
}

// TestValidateProjectScenarios: the shipped scenarios are valid (exit 0).
func TestValidateProjectScenarios(t *testing.T) {
	code, out, errs := run("validate", "../../../scenarios/1000-services.yaml", "../../../scenarios/conformance/")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	if n := strings.Count(out, ": valid"); n < 7 {
		t.Errorf("only %d files reported valid:\n%s", n, out)
	}
}

// TestValidateCorpusExit2: every malformed scenario exits 2 and every line it
// prints is file:line:column: field: message.
func TestValidateCorpusExit2(t *testing.T) {
	files, _ := filepath.Glob("../../../sim/scenario/testdata/invalid/*.yaml")
	if len(files) < 30 {
		t.Fatalf("corpus has %d files", len(files))
	}
	for _, f := range files {
		code, out, _ := run("validate", f)
		if code != ExitBadInput {
			t.Errorf("%s: exit %d, want 2", f, code)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			rest, ok := strings.CutPrefix(line, f+":")
			if !ok || !strings.Contains(rest, ": ") || strings.Count(strings.SplitN(rest, ": ", 2)[0], ":") != 1 {
				t.Errorf("%s: line not in file:line:column form: %q", f, line)
			}
		}
	}
	// JSON output carries the same errors.
	code, out, _ := run("validate", "-o", "json", files[0])
	var res []validateResult
	if code != 2 || json.Unmarshal([]byte(out), &res) != nil || len(res) != 1 || res[0].Valid || len(res[0].Errors) == 0 {
		t.Errorf("json validate: code %d, %q", code, out)
	}
}

// TestRunDeterministic: the same seed gives byte-identical report.json,
// which is also what -o json prints; another seed gives another report.
func TestRunDeterministic(t *testing.T) {
	f := "../../../sim/simulate/testdata/medium.yaml"
	dirs := []string{t.TempDir(), t.TempDir()}
	var outs []string
	for _, d := range dirs {
		code, out, errs := run("run", f, "-o", "json", "--out", d)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		outs = append(outs, out)
	}
	a, err := os.ReadFile(filepath.Join(dirs[0], "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dirs[1], "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) || outs[0] != outs[1] {
		t.Fatal("two runs with the same seed wrote different reports")
	}
	if string(a) != outs[0] {
		t.Error("-o json printed something else than report.json")
	}
	for _, name := range []string{"report.md", "rules.png", "sync-time.png", "deviation.png", "flapping.png"} {
		if _, err := os.Stat(filepath.Join(dirs[0], name)); err != nil {
			t.Error(err)
		}
	}
	_, c, _ := run("run", f, "-o", "json", "--seed", "99", "--out", t.TempDir())
	if outs[0] == c {
		t.Error("a different seed printed the same JSON")
	}
}

// TestRun1000Services: the cluster section of the report matches the
// generator's parameters, and every mode simulated every connection.
func TestRun1000Services(t *testing.T) {
	testenv.SkipIfShort(t, "simulates 36 million connections")
	code, a, errs := run("run", "../../../scenarios/1000-services.yaml", "-o", "json", "--out", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r struct {
		Cluster struct {
			Services     int `json:"services"`
			ServicePorts int `json:"servicePorts"`
			Nodes        []any
			Policies     struct {
				ClientIPAffinity           int `json:"clientIPAffinity"`
				InternalTrafficPolicyLocal int `json:"internalTrafficPolicyLocal"`
			} `json:"policies"`
			Generated struct {
				Endpoints int `json:"endpoints"`
			} `json:"generated"`
			Endpoints struct {
				Total int `json:"total"`
			} `json:"endpoints"`
		} `json:"cluster"`
		Modes []struct {
			Mode        string `json:"mode"`
			Connections struct {
				Total int64 `json:"total"`
			} `json:"connections"`
		} `json:"modes"`
	}
	if err := json.Unmarshal([]byte(a), &r); err != nil {
		t.Fatal(err)
	}
	s := r.Cluster
	if s.Services != 1000 || s.ServicePorts != 1000 || len(s.Nodes) != 24 || s.Policies.ClientIPAffinity != 60 ||
		s.Policies.InternalTrafficPolicyLocal != 60 || s.Endpoints.Total != s.Generated.Endpoints {
		t.Errorf("counts do not match the generator: %+v", s)
	}
	if len(r.Modes) != 3 {
		t.Fatalf("%d modes, want 3", len(r.Modes))
	}
	for _, m := range r.Modes {
		if m.Connections.Total != 12_000_000 {
			t.Errorf("%s: %d connections, want 12,000,000", m.Mode, m.Connections.Total)
		}
	}
}

// TestRunCheckFailsExit1: a check that cannot hold makes sim run exit 1,
// after writing the report.
func TestRunCheckFailsExit1(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := run("run", "../../../sim/simulate/testdata/broken.yaml", "--out", dir)
	if code != ExitCheckFailed || !strings.Contains(errs, "no-endpoints:demo/two:http") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
	if !strings.Contains(out, "fail") {
		t.Errorf("the table does not show the failure:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "report.json")); err != nil {
		t.Error(err)
	}
}

func TestRunUnknownModeExit2(t *testing.T) {
	if code, _, errs := run("run", "../../../sim/simulate/testdata/flip.yaml", "--mode", "ebpf"); code != ExitBadInput {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}

// TestRunIPVSScheduler: --ipvs-scheduler replaces the scenario's
// scheduler (the rotation check names it); an unknown one is bad input.
func TestRunIPVSScheduler(t *testing.T) {
	const flip = "../../../sim/simulate/testdata/flip.yaml"
	if code, _, errs := run("run", flip, "--mode", "ipvs", "--ipvs-scheduler", "wlcx"); code != ExitBadInput || !strings.Contains(errs, "--ipvs-scheduler") {
		t.Errorf("unknown scheduler: exit %d, stderr %q", code, errs)
	}
	code, out, errs := run("run", flip, "--mode", "ipvs", "--ipvs-scheduler", "lc", "-o", "json")
	if code != 0 || !strings.Contains(out, `"reason": "lc`) {
		t.Errorf("lc: exit %d, stderr %q; the self-check should say lc is not tested", code, errs)
	}
}

func TestRunBadScenarioExit2(t *testing.T) {
	code, _, errs := run("run", "../../../sim/scenario/testdata/invalid/12-bad-target-port.yaml")
	if code != 2 || !strings.Contains(errs, "12-bad-target-port.yaml:20:23: objects[0].spec.ports[0].targetPort") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}

// TestRunWithoutOutWritesNothing: sim run without --out prints the report
// and creates no file, so a run in a checkout (any seed) leaves git status
// clean; the committed results come from make results, which passes --out.
func TestRunWithoutOutWritesNothing(t *testing.T) {
	f, err := filepath.Abs("../../../sim/simulate/testdata/medium.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	code, out, errs := run("run", f, "--seed", "7")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "no files written") || strings.Contains(out, "wrote ") {
		t.Errorf("the summary does not say that nothing was written:\n%s", out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("sim run without --out created %s in the working directory", e.Name())
	}
}

// TestUnresolvableCheckExit2: a check that cannot be resolved (here: no
// port: on a two-port Service) is bad input for sim run and sim conform
// alike, reported at the check's line before anything runs or is written.
func TestUnresolvableCheckExit2(t *testing.T) {
	f := "../../../sim/scenario/testdata/invalid/55-check-multi-port-no-port.yaml"
	want := f + ":22:14: checks[0].service: Service demo/web has ports http, metrics: name one with port:"
	dir := filepath.Join(t.TempDir(), "out")
	for _, args := range [][]string{
		{"validate", f},
		{"run", f, "--out", dir},
		{"conform", f, "--json", filepath.Join(dir, "conform.json")},
	} {
		code, out, errs := run(args...)
		if code != ExitBadInput || !strings.Contains(out+errs, want) {
			t.Errorf("sim %v: exit %d, want %d with %q; stdout %q, stderr %q", args, code, ExitBadInput, want, out, errs)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a rejected scenario left output behind: %v", err)
	}
}
