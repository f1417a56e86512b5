package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConformDumpUsage: --dump into a folder that holds anything, or with
// the checkers' many-run modes, is bad usage (exit 2) before anything runs
// (no root needed to see it).
func TestConformDumpUsage(t *testing.T) {
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "old"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	sc := "../../../scenarios/testdata/diagnose/fair.yaml"
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"conform", sc, "--dump", full}, "not empty"},
		{[]string{"conform", sc, "--dump", filepath.Join(t.TempDir(), "d"), "--calibrate", "2"}, "--dump"},
		{[]string{"conform", sc, "--dump", filepath.Join(t.TempDir(), "d"), "--repeat", "2"}, "--dump"},
	} {
		code, _, stderr := run(c.args...)
		if code != ExitBadInput || !strings.Contains(stderr, c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", c.args, code, stderr, ExitBadInput, c.msg)
		}
	}
	if entries, _ := os.ReadDir(full); len(entries) != 1 {
		t.Errorf("the refused folder now holds %d entries", len(entries))
	}
}
