package app

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
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

// TestRunDeterministic: the same seed gives byte-identical JSON, and the
// counts match the generator's parameters.
func TestRunDeterministic(t *testing.T) {
	f := "../../../scenarios/1000-services.yaml"
	c1, a, e1 := run("run", f, "-o", "json")
	c2, b, _ := run("run", f, "-o", "json")
	if c1 != 0 || c2 != 0 {
		t.Fatalf("exit %d %d: %s", c1, c2, e1)
	}
	if a != b {
		t.Fatal("two runs with the same seed printed different JSON")
	}
	_, c, _ := run("run", f, "-o", "json", "--seed", "99")
	if a == c {
		t.Error("a different seed printed the same JSON")
	}
	var s struct {
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
	}
	if err := json.Unmarshal([]byte(a), &s); err != nil {
		t.Fatal(err)
	}
	if s.Services != 1000 || s.ServicePorts != 1000 || len(s.Nodes) != 24 || s.Policies.ClientIPAffinity != 60 ||
		s.Policies.InternalTrafficPolicyLocal != 60 || s.Endpoints.Total != s.Generated.Endpoints {
		t.Errorf("counts do not match the generator: %+v", s)
	}
}

func TestRunBadScenarioExit2(t *testing.T) {
	code, _, errs := run("run", "../../../sim/scenario/testdata/invalid/12-bad-target-port.yaml")
	if code != 2 || !strings.Contains(errs, "12-bad-target-port.yaml:20:23: objects[0].spec.ports[0].targetPort") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}
