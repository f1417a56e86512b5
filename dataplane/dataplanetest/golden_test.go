package dataplanetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what Golden reports instead of
// failing the test that drives it.
type recorder struct {
	testing.TB
	fatal, errors []string
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return "TestSome/sub_case" }
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = append(r.fatal, fmt.Sprintf(format, args...))
	panic(r)
}

// golden runs Golden on a recorder in dir and returns it.
func golden(t *testing.T, dir, name, got string) (r *recorder) {
	t.Helper()
	t.Chdir(dir)
	r = &recorder{TB: t}
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
	}()
	Golden(r, name, got)
	return r
}

func TestDiffShowsReorderings(t *testing.T) {
	if d := Diff("a\nb\nc\n", "a\nb\nc\n"); d != "" {
		t.Errorf("equal texts: %q", d)
	}
	d := Diff("a\nb\nc\n", "a\nc\nb\n")
	if !strings.Contains(d, "-") || !strings.Contains(d, "+") {
		t.Errorf("a pure reordering shows no change:\n%s", d)
	}
}

func TestGoldenMissingNamesTheUpdateCommand(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := golden(t, dir, "absent", "x\n")
	if len(r.fatal) != 1 || !strings.Contains(r.fatal[0], "testdata/absent.golden is missing") ||
		!strings.Contains(r.fatal[0], "go test . -run '^TestSome$' -update") {
		t.Errorf("missing golden: %q", r.fatal)
	}
}

func TestGoldenComparesAndReportsTheDiff(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "testdata", "g.golden"), []byte("one\ntwo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := golden(t, dir, "g", "one\ntwo\n"); len(r.fatal)+len(r.errors) != 0 {
		t.Errorf("equal: %q %q", r.fatal, r.errors)
	}
	r := golden(t, dir, "g", "two\none\n")
	if len(r.errors) != 1 || !strings.Contains(r.errors[0], "-want +got") || !strings.Contains(r.errors[0], `"one"`) {
		t.Errorf("reordered: %q %q", r.fatal, r.errors)
	}
}

func TestGoldenUpdateFailsOnAWriteError(t *testing.T) {
	*update = true
	defer func() { *update = false }()
	// No testdata directory: the write fails.
	r := golden(t, t.TempDir(), "g", "x\n")
	if len(r.fatal) != 1 || !strings.Contains(r.fatal[0], "could not update the golden file") {
		t.Errorf("write error: %q", r.fatal)
	}
}
