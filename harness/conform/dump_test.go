package conform

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckDumpDir: --dump takes a folder that does not exist or is empty;
// anything else is bad usage (ErrDumpDir), so a run never mixes its dumps
// with other files.
func TestCheckDumpDir(t *testing.T) {
	base := t.TempDir()
	if err := CheckDumpDir(filepath.Join(base, "new")); err != nil {
		t.Errorf("absent folder: %v", err)
	}
	if err := CheckDumpDir(base); err != nil {
		t.Errorf("empty folder: %v", err)
	}
	if err := os.WriteFile(filepath.Join(base, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckDumpDir(base); !errors.Is(err, ErrDumpDir) {
		t.Errorf("non-empty folder: %v, want ErrDumpDir", err)
	}
	if err := CheckDumpDir(filepath.Join(base, "x")); !errors.Is(err, ErrDumpDir) {
		t.Errorf("a file: %v, want ErrDumpDir", err)
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"distribution:demo/web:http-node-a":                            "distribution-demo-web-http-node-a",
		"flapping-node-a-step 1 (1s demo/flappy flappy-2 ready=false)": "flapping-node-a-step-1-1s-demo-flappy-flappy-2-ready-false",
		"--A__b--": "a-b",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
