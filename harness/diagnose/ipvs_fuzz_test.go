package diagnose

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kpsim/kpsim/sim/scenario"
)

var updateIPVSSeeds = flag.Bool("update-ipvs-seeds", false, "rewrite testdata/fuzz/FuzzReadIPVSAdm from the unit tests' inputs and the committed IPVS dumps")

// FuzzReadIPVSAdm: whatever the text, ReadIPVSAdm returns a Dump or bad
// input (a scenario.ErrorList of positioned errors inside the text), never
// panics; a Dump's shares are probabilities that sum to 1 over a port with
// a server of positive weight (0 otherwise), its ports are sorted, and
// reading is deterministic.
func FuzzReadIPVSAdm(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ReadIPVSAdm("f.txt", data)
		lines := bytes.Count(data, []byte("\n")) + 1
		if err != nil {
			if d != nil {
				t.Fatal("both a dump and an error")
			}
			var l scenario.ErrorList
			if !errors.As(err, &l) || len(l) == 0 || !scenario.IsInvalid(err) {
				t.Fatalf("error is not bad input: %T %v", err, err)
			}
			for _, e := range l {
				if e.File != "f.txt" || e.Pos.Line < 1 || e.Pos.Line > lines+1 || e.Pos.Column < 1 || e.Message == "" {
					t.Fatalf("error not located in the text (%d lines): %+v", lines, e)
				}
			}
			return
		}
		if d.Mode != "ipvs" || d.Format != FormatIPVSAdm {
			t.Fatalf("mode %q format %q", d.Mode, d.Format)
		}
		for i, p := range d.Ports {
			if i > 0 {
				q := d.Ports[i-1]
				if c := q.ClusterIP.Compare(p.ClusterIP); c > 0 || c == 0 && q.Port > p.Port {
					t.Fatalf("ports not sorted: %s before %s", q.Chain, p.Chain)
				}
			}
			sum, positive := 0.0, false
			for _, e := range p.Endpoints {
				if e.P < 0 || e.P > 1 || math.IsNaN(e.P) {
					t.Fatalf("%s %s: P %v", p.Chain, e.Addr, e.P)
				}
				if e.Weight > 0 {
					positive = true
				} else if e.P != 0 {
					t.Fatalf("%s %s: weight %d but P %v", p.Chain, e.Addr, e.Weight, e.P)
				}
				sum += e.P
				if e.Evidence.Line < 1 || e.Evidence.Line > lines {
					t.Fatalf("%s %s: evidence line %d", p.Chain, e.Addr, e.Evidence.Line)
				}
			}
			if positive && math.Abs(sum-1) > 1e-9 || !positive && sum != 0 {
				t.Fatalf("%s: shares sum to %v", p.Chain, sum)
			}
			if p.Scheduler == "" {
				t.Fatalf("%s: no scheduler", p.Chain)
			}
		}
		d2, err := ReadIPVSAdm("f.txt", data)
		if err != nil {
			t.Fatalf("second read: %v", err)
		}
		a, _ := json.Marshal(d)
		b, _ := json.Marshal(d2)
		if !bytes.Equal(a, b) {
			t.Fatalf("two reads differ:\n%s\n%s", a, b)
		}
	})
}

// ipvsSeedInputs are the unit tests' inputs: every section, flag and
// oddity the reader knows.
func ipvsSeedInputs() map[string]string {
	all := lnHeader() + lnService("TCP", "10.96.0.10:53", "rr") + lnDest("10.244.0.5:53", 1, 2, 30) + lnDest("10.244.1.6:53", 0, 0, 4) +
		lnService("TCP", "10.96.0.11:80", "rr persistent 10800") + lnDest("10.244.1.5:80", 1, 0, 3) +
		statsHeader() + statsService("TCP", "10.96.0.10:53", exact, 300, 900, 900, 54000, 99000) + statsDest("10.244.0.5:53", exact, 101, 303, 303, 18000, 33000) +
		connHeader() + conn("TCP", 10797, "NONE", "10.244.0.7:0", "10.96.0.11:80", "10.244.1.5:80") + conn("TCP", 110, "TIME_WAIT", "10.244.0.7:41000", "10.96.0.11:80", "10.244.1.5:80")
	return map[string]string{
		"unit-all-sections": all,
		"unit-stats-rounded": statsHeader() + statsService("TCP", "10.96.0.10:80", rounded, 250000000, 1, 1, 1, 1) +
			statsDest("10.244.0.1:8080", rounded, 125000500, 1, 1, 1, 1),
		"unit-flags": lnHeader() + lnService("TCP", "10.96.0.11:80", "sh (sh-fallback,sh-port) persistent 60 mask 255.255.255.0") +
			lnDest("10.244.0.1:8080", 1, 0, 0) + "FWM  5 rr\n" + lnDest("10.244.0.1:0", 1, 0, 0) +
			lnService("UDP", "[fd00::10]:53", "wrr ops") + fmt.Sprintf("  -> %-28s %-7s %-6d %-10d %-10d\n", "[fd00::1:5]:53", "Route", 3, 0, 0),
		"unit-rate": fmt.Sprintf("%-33s %8s %8s %8s %8s %8s\n  -> RemoteAddress:Port\n", "Prot LocalAddress:Port", "CPS", "InPPS", "OutPPS", "InBPS", "OutBPS") +
			statsService("TCP", "10.96.0.10:80", rounded, 5, 10, 10, 900, 1200) + fmt.Sprintf("  -> %-28s %8d %8d %8d", "10.244.0.1:8080", 5, 10, 10) + rounded(900) + rounded(1200) + "\n",
		"unit-persistent-conn": fmt.Sprintf("%-33s %-9s %-11s %-10s %-10s\n  -> RemoteAddress:Port\n", "Prot LocalAddress:Port", "Weight", "PersistConn", "ActiveConn", "InActConn") +
			"TCP  10.96.0.11:80\n" + fmt.Sprintf("  -> %-28s %-9d %-11d %-10d %-10d\n", "10.244.1.5:80", 1, 2, 0, 3),
	}
}

// TestIPVSSeedCorpus keeps the committed corpus in step: with
// -update-ipvs-seeds it rewrites it; without, it requires every seed to be
// there (go test runs the corpus as ordinary tests).
func TestIPVSSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzReadIPVSAdm")
	seeds := ipvsSeedInputs()
	// And real ones: the first dumped check of each IPVS archive of make
	// diagnose-dumps-ipvs, its after listings concatenated.
	archives, _ := filepath.Glob(filepath.Join(dumpsDir, "ipvs-*.tar.gz"))
	for _, a := range archives {
		dir := extractDumps(t, a)
		m, err := ReadManifest(dir)
		if err != nil || len(m.Checks) == 0 {
			t.Fatalf("%s: %v", a, err)
		}
		dc := m.Checks[0]
		var b []byte
		for _, f := range []string{"ipvsadm", "ipvsadm-stats", "ipvsadm-conns"} {
			x, err := os.ReadFile(filepath.Join(dir, dc.Dir, dc.After[f]))
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, x...)
		}
		_, c := caseOf(t, a)
		seeds["dump-ipvs-"+c] = string(b)
	}
	for name, s := range seeds {
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		p := filepath.Join(dir, name)
		if *updateIPVSSeeds {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			t.Errorf("seed %s missing or stale (go test ./harness/diagnose/ -run TestIPVSSeedCorpus -update-ipvs-seeds)", p)
		}
	}
}
