package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// TestOverallNFTablesRules renders kube-proxy's own TestOverallNFTablesRules
// input (v1.37.2; the same Services as TestOverallIPTablesRules: external
// IPs, load-balancer IPs with source ranges, Local and Cluster policies,
// affinity, no endpoints) from API objects through the cluster tracker, with
// its fake proxier's settings (node test-node at 192.168.0.2, which alone
// accepts node ports, pods 10.0.0.0/8, services 172.30.0.0/16), in the
// kube-proxy layout, and requires the table to equal the expectation in
// kube-proxy's nftables proxier_test.go (baseRules and the test's own
// block), both loaded into knftables.Fake and dumped. The test enables the
// KubeProxyNFTablesLocalhostNodePorts gate (off by default in 1.37, and
// off in our layout and in the real kube-proxy the differential runs): its
// "localhost NodePort rejects" block is left out of the expectation.
func TestOverallNFTablesRules(t *testing.T) {
	compareUpstream(t, "TestOverallNFTablesRules", dataplanetest.StateOf(dataplanetest.OverallObjectsWithNodes()))
}

// TestBadIPs is kube-proxy's nftables TestBadIPs: addresses and a source
// range with leading zeros, read as kube-proxy reads them.
func TestBadIPs(t *testing.T) {
	compareUpstream(t, "TestBadIPs", dataplanetest.StateOf(dataplanetest.BadIPObjects(true)))
}

// compareUpstream renders st in the kube-proxy layout as kube-proxy's fake
// proxier's node and holds the table against the first expectation of
// kube-proxy's test fn.
func compareUpstream(t *testing.T, fn string, st *cluster.State) {
	t.Helper()
	file := testenv.UpstreamSource(t, "pkg/proxy/nftables/proxier_test.go")
	base, err := dataplanetest.UpstreamVar(file, "baseRules")
	if err != nil {
		t.Fatal(err)
	}
	body, err := dataplanetest.UpstreamExpectation(file, fn, 0)
	if err != nil {
		t.Fatal(err)
	}
	if i := strings.Index(body, "# localhost NodePort rejects"); i >= 0 {
		body = body[:i]
	}
	want := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	if err := want.ParseDump(definitionsFirst(base + body)); err != nil {
		t.Fatalf("kube-proxy's expectation does not parse: %v", err)
	}
	node := netip.MustParseAddr(dataplanetest.UpstreamNodeIP)
	cfg := Config{NodeConfig: dataplane.NodeConfig{NodeName: dataplanetest.UpstreamNode, ClusterCIDR: podCIDR,
		ServiceCIDRs: []netip.Prefix{serviceCIDR}, NodeIPs: []netip.Addr{node}}, Layout: LayoutKubeProxy}
	_, got := load(t, cfg, st)
	if d := dataplanetest.Diff(elementsSorted(want.Dump()), elementsSorted(got.Dump())); d != "" {
		t.Errorf("our table differs from kube-proxy's %s (-kube-proxy +ours):\n%s", fn, d)
	}
}

// definitionsFirst orders a transaction's lines so that every object is
// defined before a rule or element names it (kube-proxy's expectations are
// written Service by Service): the table, then chains, sets, maps and
// counters, then rules and elements, each group in its original order (rule
// order within a chain is what counts).
func definitionsFirst(text string) string {
	rank := func(l string) int {
		switch {
		case strings.HasPrefix(l, "add table"):
			return 0
		case strings.HasPrefix(l, "add chain"), strings.HasPrefix(l, "add set"), strings.HasPrefix(l, "add map"), strings.HasPrefix(l, "add counter"):
			return 1
		}
		return 2
	}
	var groups [3][]string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		groups[rank(l)] = append(groups[rank(l)], l)
	}
	var b strings.Builder
	for _, g := range groups {
		for _, l := range g {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// elementsSorted sorts a dump's element lines among themselves (a set has
// no order; knftables.Fake prints elements in the order they were added),
// the other lines staying where they are.
func elementsSorted(dump string) string {
	lines := strings.Split(dump, "\n")
	var elems []string
	var idx []int
	for i, l := range lines {
		if strings.HasPrefix(l, "add element ") {
			elems = append(elems, l)
			idx = append(idx, i)
		}
	}
	slices.Sort(elems)
	for j, i := range idx {
		lines[i] = elems[j]
	}
	return strings.Join(lines, "\n")
}
