package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteComparison: the section is generated between its markers from
// ours and upstream's files, replaced (not repeated) on a second write, and
// the rest of the README is kept; ours come from <mode>.json and the
// ladders beside it (<mode>-large.json).
func TestWriteComparison(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Calibration data\n\nhand-written intro\n")
	write("nftables.json", `[{"mode":"nftables","variant":"kube-proxy","points":[{"services":1000,"endpointsPerService":10,"fullSyncSeconds":1.5,"partialSyncSeconds":0.06,"runs":5}]}]`)
	write("nftables-large.json", `[{"mode":"nftables","variant":"kube-proxy","points":[{"services":5000,"endpointsPerService":10,"fullSyncSeconds":9,"partialSyncSeconds":0.1,"runs":1}]}]`)
	write("kube-proxy-nftables.json", `[{"mode":"nftables","kubeProxyVersion":"v1.37.2","points":[{"services":1000,"endpointsPerService":10,"fullSyncSeconds":0.5,"partialSyncSeconds":0.03,"runs":3},{"services":5000,"endpointsPerService":10,"fullSyncSeconds":4.5,"partialSyncSeconds":0.2,"runs":3}]}]`)
	for range 2 {
		if err := writeComparison(dir); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	text := string(b)
	if strings.Count(text, comparisonBegin) != 1 || !strings.Contains(text, "hand-written intro") {
		t.Errorf("README:\n%s", text)
	}
	if !strings.Contains(text, "| 1000 x 10 | kube-proxy | 1.500 | 0.500 | 3.00 | 0.0600 | 0.0300 | 2.00 | 5 / 3 |") {
		t.Errorf("no ratio row:\n%s", text)
	}
	if !strings.Contains(text, "| 5000 x 10 | kube-proxy | 9.000 | 4.500 | 2.00 | 0.1000 | 0.2000 | 0.50 | 1 / 3 |") {
		t.Errorf("no ratio row from nftables-large.json:\n%s", text)
	}
}
