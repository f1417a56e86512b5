package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteDump(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dumps")
	out := map[string][]byte{
		"run.json":                       []byte("{}"),
		"dump/manifest.json":             []byte(`{"mode":"ipvs","checks":[{"file":"/kpsim/scenarios/0/affinity.yaml","dir":"01-a/001-b"}]}`),
		"dump/01-a/001-b/before.ipvsadm": []byte("Prot LocalAddress:Port Scheduler Flags\n"),
	}
	if err := writeDump(dir, out, []string{"/kpsim/scenarios/0/affinity.yaml"}, []string{"scenarios/conformance/affinity.yaml"}); err != nil {
		t.Fatal(err)
	}
	m, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m), `"file": "scenarios/conformance/affinity.yaml"`) || strings.Contains(string(m), "/kpsim/") {
		t.Errorf("manifest not mapped to the host's names:\n%s", m)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "01-a", "001-b", "before.ipvsadm")); err != nil || !strings.HasPrefix(string(b), "Prot ") {
		t.Errorf("dump file: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "run.json")); err == nil {
		t.Error("run.json copied into the dump folder")
	}
	// The console's names are the guest's word: nothing outside the folder.
	bad := map[string][]byte{"dump/../escape": []byte("x")}
	if err := writeDump(filepath.Join(t.TempDir(), "d"), bad, nil, nil); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("escape: %v", err)
	}
	if err := writeDump(filepath.Join(t.TempDir(), "d"), map[string][]byte{"run.json": nil}, nil, nil); err == nil {
		t.Error("no dump files: no error")
	}
}
