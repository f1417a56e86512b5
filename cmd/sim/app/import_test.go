package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var importDumps = []string{"../../../scenarios/testdata/import/kind.yaml", "../../../scenarios/testdata/import/kubeadm.yaml"}

// TestImportedDumpsValidateAndRun: the real dumps, unchanged, validate and
// run (exit 0), their warnings on stderr with file:line:column.
func TestImportedDumpsValidateAndRun(t *testing.T) {
	for _, f := range importDumps {
		t.Run(filepath.Base(f), func(t *testing.T) {
			code, out, errs := run("validate", f)
			if code != 0 || !strings.Contains(out, f+": valid") {
				t.Fatalf("validate: exit %d\n%s\n%s", code, out, errs)
			}
			if !strings.Contains(errs, f+":1:1: warning: cluster.serviceCIDR: inferred as ") {
				t.Errorf("validate does not print the inferred ranges as warnings:\n%s", errs)
			}
			code, out, errs = run("run", f, "--calibration", "../../../results/calibration")
			if code != 0 {
				t.Fatalf("run: exit %d\n%s\n%s", code, out, errs)
			}
			if !strings.Contains(errs, "warning: ") || strings.Contains(out, " fail ") {
				t.Errorf("run: warnings missing or a check failed:\n%s\n%s", out, errs)
			}
		})
	}
}

// TestImportCommand: sim import writes a scenario that validates and runs,
// refuses to overwrite without --force, and writes nothing on bad input.
func TestImportCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "kind-scenario.yaml")
	code, stdout, errs := run("import", importDumps[0], "-o", out)
	if code != 0 || !strings.Contains(stdout, "wrote "+out) {
		t.Fatalf("import: exit %d\n%s\n%s", code, stdout, errs)
	}
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if code, stdout, errs := run("validate", out); code != 0 || strings.Contains(errs, "cluster.serviceCIDR: inferred") {
		t.Fatalf("validate of the imported scenario: exit %d\n%s\n%s", code, stdout, errs)
	}
	if code, stdout, errs := run("run", out, "--calibration", "../../../results/calibration"); code != 0 {
		t.Fatalf("run of the imported scenario: exit %d\n%s\n%s", code, stdout, errs)
	}
	// An existing file is kept without --force.
	if code, _, errs := run("import", importDumps[1], "-o", out); code != 2 || !strings.Contains(errs, "exists; pass --force") {
		t.Fatalf("overwrite without --force: exit %d, %s", code, errs)
	}
	if now, _ := os.ReadFile(out); string(now) != string(first) {
		t.Fatal("the existing file changed without --force")
	}
	if code, _, errs := run("import", importDumps[1], "-o", out, "--force"); code != 0 {
		t.Fatalf("--force: exit %d, %s", code, errs)
	}
	if now, _ := os.ReadFile(out); !strings.Contains(string(now), "name: kubeadm") {
		t.Fatal("--force did not replace the file")
	}
	// Bad input: exit 2 with the error's position, nothing written, no
	// temporary file left.
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s, namespace: d, uid: x}\n  spec: {clusterIP: 10.96.0.5, ports: [{port: 0}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "never.yaml")
	code, _, errs = run("import", bad, "-o", target)
	if code != 2 || !strings.Contains(errs, bad+":7:47: items[0].spec.ports[0].port: 0: must be between 1 and 65535, inclusive") {
		t.Fatalf("bad input: exit %d\n%s", code, errs)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "bad.yaml kind-scenario.yaml" {
		t.Errorf("files after the failed import: %v", names)
	}
	if code, _, _ := run("import", importDumps[0]); code != 2 {
		t.Errorf("import without -o: exit %d, want 2", code)
	}
}
