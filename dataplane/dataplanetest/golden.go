package dataplanetest

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// update is the one -update flag of every test binary that imports the
// kit: with it, Golden rewrites the files instead of comparing.
var update = flag.Bool("update", false, "rewrite testdata/*.golden (then review the diff)")

// Updating reports whether the test runs with -update, for a test that
// rewrites testdata files of its own beside the goldens.
func Updating() bool { return *update }

// Golden compares got with testdata/NAME.golden in the test's package
// directory. With -update it writes got there instead, and a write error
// fails the test. A missing golden fails with the command that creates it;
// a difference fails with a line diff (-want +got) that shows reorderings.
func Golden(t testing.TB, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatalf("could not update the golden file: %v", err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is missing: create it with `%s` and review it", path, updateCommand(t))
	}
	if err != nil {
		t.Fatalf("could not read the golden file: %v", err)
	}
	if d := Diff(string(want), got); d != "" {
		t.Errorf("%s differs from the golden file (-want +got; if the change is intended, run `%s` and review the diff):\n%s",
			path, updateCommand(t), d)
	}
}

// Diff is a line diff of two texts (-want +got), "" when they are equal. It
// is cmp.Diff over the lines, so a line that only moved shows as removed in
// one place and added in another.
func Diff(want, got string) string {
	if want == got {
		return ""
	}
	return cmp.Diff(strings.Split(want, "\n"), strings.Split(got, "\n"))
}

// updateCommand is the go test command that rewrites the goldens of t's
// top-level test, with the package path relative to the module root when
// it can find go.mod.
func updateCommand(t testing.TB) string {
	top, _, _ := strings.Cut(t.Name(), "/")
	return fmt.Sprintf("go test %s -run '^%s$' -update", packageDir(), top)
}

// packageDir is "./<dir>" of the working directory (the package under
// test) below the module root, or "." when go.mod is not found.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for root := wd; ; {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			rel, err := filepath.Rel(root, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		parent := filepath.Dir(root)
		if parent == root {
			return "."
		}
		root = parent
	}
}
