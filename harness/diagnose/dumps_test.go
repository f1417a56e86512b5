package diagnose

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The committed round-trip data: one archive per sim conform --dump run
// (make diagnose-dumps), CONFIG-CASE.tar.gz, CASE "correct" or a fault.
const dumpsDir = "testdata/dumps"

// faultCatches is the check type of scenarios/testdata/diagnose that must
// catch each fault the dumps are made with (conform.FaultCatches, for the
// faults make diagnose-dumps runs).
var faultCatches = map[string]string{
	"uniform-probability":   "distribution",
	"skew-at-mde":           "distribution",
	"drop-last-endpoint":    "distribution",
	"keep-not-ready":        "flapping",
	"keep-deleted-endpoint": "terminating",
	"ignore-local-policy":   "internal-traffic-local",
	"affinity-no-timeout":   "affinity",
}

// dumpArchives lists the committed archives; the test fails when there are
// none (the data is part of the repository).
func dumpArchives(t *testing.T) []string {
	t.Helper()
	got, err := filepath.Glob(filepath.Join(dumpsDir, "*.tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatalf("no dump archives in %s: make diagnose-dumps writes them", dumpsDir)
	}
	return got
}

// caseOf splits "testdata/dumps/iptables-nft-keep-not-ready.tar.gz" into
// its configuration ("iptables-nft") and case ("keep-not-ready").
func caseOf(t *testing.T, archive string) (config, name string) {
	t.Helper()
	base := strings.TrimSuffix(filepath.Base(archive), ".tar.gz")
	for _, c := range []string{"iptables-nft", "iptables-legacy", "nftables", "ipvs"} {
		if rest, ok := strings.CutPrefix(base, c+"-"); ok {
			return c, rest
		}
	}
	t.Fatalf("%s: not CONFIG-CASE.tar.gz", archive)
	return "", ""
}

// extractDumps unpacks an archive into a fresh folder and returns it.
func extractDumps(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", archive, err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		name := filepath.Clean(h.Name)
		if strings.HasPrefix(name, "..") || filepath.IsAbs(name) {
			t.Fatalf("%s: entry %q outside the archive", archive, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("%s: %s: %v", archive, h.Name, err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// modeFormats are the formats a mode's dumps must hold before and after
// each check.
var modeFormats = map[string][]string{
	"iptables": {"iptables-save"},
	"nftables": {"nft", "nft-json"},
	"ipvs":     {"ipvsadm", "ipvsadm-stats", "ipvsadm-conns"},
}

// TestDumpManifests holds the committed dumps to what sim conform --dump
// promises and the round trip relies on: every check has its API objects
// and the mode's dumps before and after it, written by the tool the
// archive's name says, and the run reached the verdicts its case implies
// (the correct dataplane passes every check; a fault makes the check type
// that must catch it fail, and only checks of that type).
func TestDumpManifests(t *testing.T) {
	for _, archive := range dumpArchives(t) {
		config, name := caseOf(t, archive)
		t.Run(config+"/"+name, func(t *testing.T) {
			dir := extractDumps(t, archive)
			m, err := ReadManifest(dir)
			if err != nil {
				t.Fatal(err)
			}
			wantMode, wantBackend := config, ""
			if b, ok := strings.CutPrefix(config, "iptables-"); ok {
				wantMode, wantBackend = "iptables", b
			}
			if config == "ipvs" {
				// IPVS mode's iptables rules use the host's default
				// backend; the manifest records it, the name does not.
				wantBackend = m.IPTablesBackend
			}
			if m.Mode != wantMode || m.IPTablesBackend != wantBackend {
				t.Errorf("manifest: mode %q backend %q, archive name says %q %q", m.Mode, m.IPTablesBackend, wantMode, wantBackend)
			}
			if name == "correct" && len(m.Faults) != 0 || name != "correct" && !slices.Equal(m.Faults, []string{name}) {
				t.Errorf("manifest faults %v for case %s", m.Faults, name)
			}
			if len(m.Checks) == 0 {
				t.Fatal("manifest lists no check")
			}
			failedTypes := map[string]bool{}
			for _, dc := range m.Checks {
				if len(dc.Errors) > 0 {
					t.Errorf("%s: dump errors: %v", dc.Dir, dc.Errors)
				}
				if dc.ServicePort == "" || dc.ClusterIP == "" || dc.Port == 0 || dc.Node == "" {
					t.Errorf("%s: service port %q %s:%d or node %q missing", dc.Dir, dc.ServicePort, dc.ClusterIP, dc.Port, dc.Node)
				}
				want := map[string]string{"api.yaml": dc.API}
				for _, f := range modeFormats[m.Mode] {
					want["before "+f] = dc.Before[f]
					want["after "+f] = dc.After[f]
				}
				for what, file := range want {
					if file == "" {
						t.Errorf("%s: no %s file", dc.Dir, what)
						continue
					}
					b, err := os.ReadFile(filepath.Join(dir, dc.Dir, file))
					if err != nil || len(b) == 0 {
						t.Errorf("%s: %s (%s): empty or unreadable: %v", dc.Dir, what, file, err)
					}
				}
				if f := dc.After["iptables-save"]; f != "" {
					b, _ := os.ReadFile(filepath.Join(dir, dc.Dir, f))
					// iptables-nft-save says "(nf_tables)"; the legacy tool
					// calls itself iptables-save.
					first, _, _ := strings.Cut(string(b), "\n")
					nft := strings.HasPrefix(first, "# Generated by iptables-nft-save v") && strings.Contains(first, "(nf_tables)")
					legacy := strings.HasPrefix(first, "# Generated by iptables-save v") && !strings.Contains(first, "nf_tables")
					if m.IPTablesBackend == "nft" && !nft || m.IPTablesBackend == "legacy" && !legacy {
						t.Errorf("%s: %s was not written by the %s backend: %q", dc.Dir, f, m.IPTablesBackend, first)
					}
				}
				if len(dc.Verdicts) == 0 {
					t.Errorf("%s: no verdict", dc.Dir)
				}
				for _, v := range dc.Verdicts {
					switch v.Verdict {
					case "fail":
						failedTypes[dc.Type] = true
					case "pass", "not-run":
					default:
						t.Errorf("%s: verdict %s %q (%s): a dump run must decide its checks", dc.Dir, v.Name, v.Verdict, v.Message)
					}
				}
			}
			if name == "correct" {
				if len(failedTypes) > 0 {
					t.Errorf("the correct dataplane failed checks of type %v", failedTypes)
				}
				return
			}
			want := faultCatches[name]
			if want == "" {
				t.Fatalf("unknown fault %q (faultCatches lists the ones make diagnose-dumps runs)", name)
			}
			if !failedTypes[want] || len(failedTypes) != 1 {
				t.Errorf("fault %s: failed check types %v, want exactly [%s]", name, failedTypes, want)
			}
		})
	}
}
