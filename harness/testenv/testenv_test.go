package testenv

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records a skip or a fatal failure and then
// stops its goroutine, as testing.T does; run calls f on one.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.skipped, r.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func run(t *testing.T, f func(testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

// TestRequire: a met requirement does nothing; an unmet one skips, and
// fails instead under KPSIM_REQUIRE_ALL=1.
func TestRequire(t *testing.T) {
	for _, tc := range []struct {
		env             string
		ok              bool
		skipped, failed bool
	}{
		{env: "", ok: true},
		{env: "1", ok: true},
		{env: "", ok: false, skipped: true},
		{env: "0", ok: false, skipped: true},
		{env: "1", ok: false, failed: true},
	} {
		t.Setenv(RequireAllEnv, tc.env)
		r := run(t, func(tb testing.TB) { Require(tb, tc.ok, "no kernel in the cache") })
		if r.skipped != tc.skipped || r.failed != tc.failed {
			t.Errorf("%s=%q ok=%v: skipped %v failed %v, want skipped %v failed %v", RequireAllEnv, tc.env, tc.ok, r.skipped, r.failed, tc.skipped, tc.failed)
		}
	}
}

// TestRequireCommands: a command that exists passes, one that does not
// skips with its name in the message.
func TestRequireCommands(t *testing.T) {
	t.Setenv(RequireAllEnv, "")
	if r := run(t, func(tb testing.TB) { RequireCommands(tb, "sh") }); r.skipped || r.failed {
		t.Fatalf("sh is on PATH but the test was skipped: %q", r.msg)
	}
	r := run(t, func(tb testing.TB) { RequireCommands(tb, "sh", "kpsim-no-such-command") })
	if !r.skipped || r.msg != "needs the kpsim-no-such-command command (make test installs it with apt-get)" {
		t.Errorf("a missing command: skipped %v, message %q", r.skipped, r.msg)
	}
}

// TestStrictFailureNamesTheVariable: the failure under make test says why
// the skip became a failure.
func TestStrictFailureNamesTheVariable(t *testing.T) {
	t.Setenv(RequireAllEnv, "1")
	r := run(t, func(tb testing.TB) { Require(tb, false, "no kernel in the cache") })
	if want := "cannot run under KPSIM_REQUIRE_ALL=1: no kernel in the cache"; !r.failed || r.msg != want {
		t.Errorf("failed %v, message %q, want %q", r.failed, r.msg, want)
	}
}

// TestNoOtherSkip: no test outside this package calls Skip, Skipf or
// SkipNow, so every skip is one that KPSIM_REQUIRE_ALL=1 turns into a
// failure.
func TestNoOtherSkip(t *testing.T) {
	root := filepath.Join("..", "..")
	var bad []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "results", "bin":
				return filepath.SkipDir
			}
			if abs, _ := filepath.Abs(p); abs == mustAbs(t, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				switch sel.Sel.Name {
				case "Skip", "Skipf", "SkipNow":
					bad = append(bad, p+": "+sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Errorf("skips outside harness/testenv (use testenv.RequireRoot, RequireCommands, Require or SkipIfShort):\n%s", strings.Join(bad, "\n"))
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestReferenceVectors: the file parses, and a malformed case is refused.
func TestReferenceVectors(t *testing.T) {
	vs := ReferenceVectors(t)
	if len(vs) == 0 || len(TrafficVectors(t)) == 0 {
		t.Fatalf("%d vectors, %d with traffic outcomes", len(vs), len(TrafficVectors(t)))
	}
	for _, v := range vs {
		if v.Service.Type == "" {
			t.Errorf("%s: no default service type", v.Name)
		}
	}
	for _, bad := range []string{
		`cases: [{name: a, endpoints: [{ip: 10.0.1.1, node: local, cond: RS}]}]`,
		`cases: [{name: a, pod: DROP, endpoints: [{ip: 10.0.1.1, node: here, cond: RS}]}]`,
		`cases: [{name: a, pod: DROP, endpoints: [{ip: 10.0.1.1, node: local, cond: RX}]}]`,
		`cases: [{name: a, pod: DROP, external: DROP, endpoints: []}]`,
		`cases: [{name: a, pod: DROP, byMode: {userspace: {pod: DROP}}, endpoints: []}]`,
		`cases: [{name: a, pod: DROP, endpoints: []}, {name: a, pod: DROP, endpoints: []}]`,
		`cases: [{name: a, pod: DROP, unknownField: 1, endpoints: []}]`,
	} {
		if _, err := parseVectors([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	v := Vector{VectorOutcomes: VectorOutcomes{Pod: "DROP", External: "x"}, ByMode: map[string]VectorOutcomes{"ipvs": {Pod: "REJECT"}}}
	if got := v.Outcomes("ipvs"); got.Pod != "REJECT" || got.External != "x" {
		t.Errorf("ipvs outcomes %+v", got)
	}
	if got := v.Outcomes(""); got.Pod != "DROP" {
		t.Errorf("default outcomes %+v", got)
	}
}
