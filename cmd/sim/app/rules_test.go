package app

import (
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/iptables"
)

const svc1Scenario = "../../../scenarios/testdata/svc1.yaml"

// TestRulesSvc1: kube-proxy's test Service gets kube-proxy's chain names,
// and the printed text is input iptables-restore (the fake) accepts.
func TestRulesSvc1(t *testing.T) {
	code, out, errs := run("rules", svc1Scenario, "--mode", "iptables")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"KUBE-SVC-XPGD46QRK7WJZT7O",
		"KUBE-SEP-SXIVWICOYRO3J4NJ",
		"-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80\n",
		"for node node-1 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	f := iptables.NewFake()
	if err := f.Restore(out); err != nil {
		t.Fatalf("the fake refuses the output: %v", err)
	}
	if !strings.Contains(f.Dump(), "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES") {
		t.Error("jump rules missing")
	}
	// --node picks another node; the mode flag defaults to iptables.
	code, out, _ = run("rules", svc1Scenario, "--node", "node-2")
	if code != 0 || !strings.Contains(out, "for node node-2 ") {
		t.Errorf("--node node-2: exit %d\n%s", code, out)
	}
}

func TestRulesUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"rules", svc1Scenario, "--node", "nope"}, "node-1, node-2"},
		{[]string{"rules", svc1Scenario, "--mode", "nftables", "--layout", "slow"}, "kube-proxy or fast"},
		{[]string{"rules", svc1Scenario, "--mode", "ipvs"}, "not a ruleset"},
		{[]string{"rules", svc1Scenario, "--mode", "userspace"}, "unknown mode"},
		{[]string{"rules", svc1Scenario, "--fault", "bogus"}, "uniform-probability"},
		{[]string{"rules", svc1Scenario, "--affinity", "hash"}, "recent or ipset"},
		{[]string{"rules"}, ""},
		{[]string{"rules", "no-such-file.yaml"}, ""},
	} {
		code, _, errs := run(c.args...)
		if code != ExitBadInput || !strings.Contains(errs, c.want) {
			t.Errorf("sim %v: exit %d, stderr %q; want exit %d naming %q", c.args, code, errs, ExitBadInput, c.want)
		}
	}
}

func TestRulesAffinityAndFaults(t *testing.T) {
	const affinity = "../../../scenarios/conformance/affinity.yaml"
	code, out, errs := run("rules", affinity, "--affinity", "ipset")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "# ipset restore -exist input") || !strings.Contains(out, "-m set --match-set KUBE-AFF-") {
		t.Errorf("no ipset affinity in:\n%s", out)
	}
	code, out, errs = run("rules", affinity, "--fault", "affinity-no-timeout", "--fault", "uniform-probability")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "faults affinity-no-timeout,uniform-probability") || strings.Contains(out, "--seconds") {
		t.Errorf("faults not applied:\n%s", out)
	}
}

// TestRulesNFTables: kube-proxy's test Service ns1/svc1 gets the reference's
// hashed chain name in the kube-proxy layout (v1.37: its one endpoint
// inline, no endpoint chain; the scenario's service CIDR in
// cluster-ips-check), and none in the fast one.
func TestRulesNFTables(t *testing.T) {
	code, out, errs := run("rules", svc1Scenario, "--mode", "nftables")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:", "Drop traffic to unallocated ClusterIPs"} {
		if !strings.Contains(out, want) {
			t.Errorf("kube-proxy layout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "endpoint-5OJB2KTY") {
		t.Errorf("kube-proxy layout: an endpoint chain without affinity:\n%s", out)
	}
	code, out, errs = run("rules", svc1Scenario, "--mode", "nftables", "--layout", "fast")
	if code != 0 || strings.Contains(out, "endpoint-5OJB2KTY") || !strings.Contains(out, "layout fast") {
		t.Errorf("fast layout: exit %d %s\n%s", code, errs, out)
	}
}

// TestRulesSubjectUsage: the kernel views' flags that contradict each other
// are usage errors (exit 2), whoever runs them.
func TestRulesSubjectUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"rules", svc1Scenario, "--subject", "kube-router"}, "kpsim or kube-proxy"},
		{[]string{"rules", svc1Scenario, "--diff"}, "needs --subject kube-proxy"},
		{[]string{"rules", svc1Scenario, "--listed", "--subject", "kube-proxy"}, "add --diff"},
		{[]string{"rules", svc1Scenario, "--kube-proxy", "/bin/true"}, "--kube-proxy needs --subject kube-proxy"},
		{[]string{"rules", svc1Scenario, "--subject", "kube-proxy", "--fault", "uniform-probability"}, "ours only"},
		{[]string{"rules", svc1Scenario, "--subject", "kube-proxy", "--mode", "nftables", "--layout", "fast"}, "ours only"},
		{[]string{"rules", svc1Scenario, "--subject", "kube-proxy", "--mode", "ipvs"}, "not a ruleset"},
	} {
		code, _, errs := run(c.args...)
		if code != ExitBadInput || !strings.Contains(errs, c.want) {
			t.Errorf("sim %v: exit %d, stderr %q; want exit %d naming %q", c.args, code, errs, ExitBadInput, c.want)
		}
	}
}

// TestRulesSubjectEnvironment: the kernel views need root, and
// --subject kube-proxy needs the upstream binaries; either missing is exit
// 3 saying what is missing. The binaries are looked up beside the running
// executable (the test binary here, where there are none).
func TestRulesSubjectEnvironment(t *testing.T) {
	old := geteuid
	t.Cleanup(func() { geteuid = old })
	geteuid = func() int { return 1000 }
	for _, args := range [][]string{
		{"rules", svc1Scenario, "--listed"},
		{"rules", svc1Scenario, "--subject", "kube-proxy"},
		{"rules", svc1Scenario, "--subject", "kube-proxy", "--diff", "--mode", "nftables"},
	} {
		code, _, errs := run(args...)
		if code != ExitEnvironment || !strings.Contains(errs, "need root") {
			t.Errorf("sim %v as a user: exit %d, stderr %q; want exit %d naming root", args, code, errs, ExitEnvironment)
		}
	}
	geteuid = func() int { return 0 }
	code, _, errs := run("rules", svc1Scenario, "--subject", "kube-proxy", "--kube-proxy", "/no/such/kube-proxy")
	if code != ExitEnvironment || !strings.Contains(errs, "make upstream") || !strings.Contains(errs, "/no/such/kube-proxy") {
		t.Errorf("missing binaries: exit %d, stderr %q; want exit %d naming the path and make upstream", code, errs, ExitEnvironment)
	}
}
