package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunCalibrationStrict: a --calibration folder that does not exist,
// holds no calibration or holds a malformed file is bad input (exit 2)
// naming the folder or the file and field; the project's own folder
// loads.
func TestRunCalibrationStrict(t *testing.T) {
	const sc = "../../../scenarios/conformance/distribution.yaml"
	if _, err := os.Stat(sc); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	bad := filepath.Join(dir, "bad")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "nftables.json"), []byte("[\n{\"mode\": \"nftables\", \"points\": [{\"services\": 10, \"endpointsPerService\": 1, \"fullSyncSeconds\": \"slow\"}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dir, want string }{
		{missing, missing},
		{dir, "holds no calibration"},
		{bad, filepath.Join(bad, "nftables.json") + ":2: points.fullSyncSeconds"},
	} {
		code, _, errs := run("run", sc, "--calibration", c.dir)
		if code != ExitBadInput || !strings.Contains(errs, c.want) {
			t.Errorf("--calibration %s: exit %d, stderr %q; want exit 2 naming %q", c.dir, code, errs, c.want)
		}
	}
	if code, _, errs := run("run", sc, "--calibration", "../../../results/calibration"); code != 0 {
		t.Errorf("the project's calibration: exit %d\n%s", code, errs)
	}
}
