package app

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/diagnose"
	"github.com/kpsim/kpsim/sim/scenario"
)

// fakeDumps replaces the dump readers for the command tests: the file's
// base name picks a constructed dump; "bad.txt" is a malformed dump.
func fakeDumps(t *testing.T) {
	t.Helper()
	two := func(file string, a, b uint64) *diagnose.Dump {
		sp := &diagnose.ServicePort{Name: "ns1/svc1:p80", ClusterIP: netip.MustParseAddr("172.30.0.41"), Port: 80, Protocol: "tcp",
			Chain: "KUBE-SVC-XPGD46QRK7WJZT7O", Scheduler: "cascade", Exact: true}
		for i, n := range []uint64{a, b} {
			sp.Endpoints = append(sp.Endpoints, &diagnose.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 180, 0, byte(1 + i)}), 80),
				P: 0.5, Observed: n, Evidence: diagnose.Line{File: file, Line: 20 + i, Text: fmt.Sprintf("[%d:0] -A KUBE-SEP-%d -j DNAT", n, i)}})
		}
		return &diagnose.Dump{File: file, Format: diagnose.FormatIPTablesSave, Mode: "iptables", Counters: true, Ports: []*diagnose.ServicePort{sp}}
	}
	old := readDump
	t.Cleanup(func() { readDump = old })
	readDump = func(f diagnose.Format, path string) (*diagnose.Dump, error) {
		switch filepath.Base(path) {
		case "fair.txt":
			return two(path, 5020, 4980), nil
		case "skew.txt":
			return two(path, 6000, 4000), nil
		case "before.txt":
			return two(path, 20, 1000), nil
		case "bad.txt":
			return nil, scenario.ErrorList{{File: path, Pos: scenario.Pos{Line: 7, Column: 1}, Field: "-A KUBE-SVC-X", Message: "want -j or -g after the matches"}}
		}
		return old(f, path)
	}
}

func TestDiagnoseExitCodes(t *testing.T) {
	fakeDumps(t)
	dir := t.TempDir()
	code, out, errs := run("diagnose", "--iptables-save", "fair.txt")
	if code != ExitOK || !strings.Contains(out, "ns1/svc1:p80") || !strings.Contains(out, "fair") || !strings.Contains(out, "nothing wrong found") {
		t.Fatalf("fair: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run("diagnose", "--iptables-save", "skew.txt", "--out", dir)
	if code != ExitCheckFailed || !strings.Contains(out, "FINDINGS") || !strings.Contains(out, "skew.txt:20: [6000:0]") || !strings.Contains(errs, "skew ns1/svc1:p80") {
		t.Fatalf("skew: exit %d\n%s%s", code, out, errs)
	}
	for _, f := range []string{"report.json", "report.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	// With --before the deltas (4980, 3980 ... here 5980/3000) decide.
	code, out, _ = run("diagnose", "--iptables-save", "skew.txt", "--before", "before.txt", "-o", "json")
	var rep struct {
		Before string `json:"before"`
		Ports  []struct {
			N uint64 `json:"n"`
		} `json:"ports"`
	}
	if code != ExitCheckFailed || json.Unmarshal([]byte(out), &rep) != nil || rep.Before != "before.txt" || rep.Ports[0].N != 10000-1020 {
		t.Fatalf("before: exit %d %+v\n%s", code, rep, out)
	}
	code, out, _ = run("diagnose", "--iptables-save", "fair.txt", "-o", "markdown")
	if code != ExitOK || !strings.Contains(out, "| ns1/svc1:p80 | 2 | 10000 | fair |") {
		t.Fatalf("markdown: exit %d\n%s", code, out)
	}
	// With the API: the scenario names the Service with one endpoint, so
	// 10.180.0.2 is stale.
	code, out, _ = run("diagnose", "--iptables-save", "fair.txt", "--api", svc1Scenario, "--node", "node-2")
	if code != ExitCheckFailed || !strings.Contains(out, "endpoint 10.180.0.2:80 is in the rules but in no EndpointSlice of ns1/svc1:p80") {
		t.Fatalf("api: exit %d\n%s", code, out)
	}
}

func TestDiagnoseBadInputAndUsage(t *testing.T) {
	fakeDumps(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"diagnose"}, "exactly one of --iptables-save"},
		{[]string{"diagnose", "--iptables-save", "fair.txt", "--nft", "x.nft"}, "exactly one of"},
		{[]string{"diagnose", "--iptables-save", "fair.txt", "-o", "yaml"}, "table, json or markdown"},
		{[]string{"diagnose", "--iptables-save", "fair.txt", "--alpha", "1.5"}, "--alpha 1.5"},
		{[]string{"diagnose", "--iptables-save", "fair.txt", "extra"}, "unknown command"},
		{[]string{"diagnose", "--iptables-save", "bad.txt"}, "bad.txt:7:1: -A KUBE-SVC-X: want -j or -g after the matches"},
		{[]string{"diagnose", "--iptables-save", "no-such-dump.txt"}, "no-such-dump.txt: no such dump file"},
		{[]string{"diagnose", "--ipvsadm", "fair.txt", "--before", "bad.txt"}, "bad.txt:7:1"},
		{[]string{"diagnose", "--iptables-save", "fair.txt", "--api", "no-such-api.yaml"}, "no-such-api.yaml"},
	} {
		code, _, errs := run(c.args...)
		if code != ExitBadInput || !strings.Contains(errs, c.want) {
			t.Errorf("sim %v: exit %d, stderr %q; want exit %d naming %q", c.args, code, errs, ExitBadInput, c.want)
		}
	}
}

// The real capture of harness/diagnose/testdata/conntrack beside the rules
// it was taken under: the conntrack findings fail the run, every output
// form carries the conntrack report, and a table that is no conntrack -L
// output is bad input naming its line.
func TestDiagnoseConntrack(t *testing.T) {
	const testdata = "../../../harness/diagnose/testdata/"
	dump, ct := testdata+"iptables/overall.nft.save", testdata+"conntrack/overall.conntrack"
	code, out, errs := run("diagnose", "--iptables-save", dump, "--conntrack", ct)
	for _, want := range []string{"; conntrack " + ct, "long-lived (TCP ESTABLISHED and ASSURED): 201 of 272 service entries", "pinned more than its share"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if code != ExitCheckFailed || !strings.Contains(errs, "long-lived-skew ns2/svc2:p80") || !strings.Contains(errs, "stale-udp-conntrack ns8/svc8:dns") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	dir := t.TempDir()
	code, out, _ = run("diagnose", "--iptables-save", dump, "--conntrack", ct, "-o", "json", "--out", dir)
	var rep struct {
		Conntrack *struct {
			Entries int `json:"entries"`
		} `json:"conntrack"`
	}
	if code != ExitCheckFailed || json.Unmarshal([]byte(out), &rep) != nil || rep.Conntrack == nil || rep.Conntrack.Entries != 278 {
		t.Fatalf("json: exit %d %+v", code, rep)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "report.md")); err != nil || !strings.Contains(string(b), "## Conntrack") {
		t.Errorf("report.md: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "ct.txt")
	if err := os.WriteFile(bad, []byte("tcp 6 10 ESTABLISHED src=10.0.0.1 dst=10.96.0.1 sport=1 dport=443\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{{bad, bad + ":1:"}, {"no-such-ct.txt", "no-such-ct.txt: no such conntrack table file"}} {
		code, _, errs = run("diagnose", "--iptables-save", dump, "--conntrack", c.file)
		if code != ExitBadInput || !strings.Contains(errs, c.want) {
			t.Errorf("--conntrack %s: exit %d, stderr %q; want exit %d naming %q", c.file, code, errs, ExitBadInput, c.want)
		}
	}
}
