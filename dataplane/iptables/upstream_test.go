package iptables

import (
	"net/netip"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// TestOverallIPTablesRules renders kube-proxy's own TestOverallIPTablesRules
// input (v1.37.2: ClusterIP, NodePort, external IPs, load-balancer IPs with
// and without source ranges, Local and Cluster external policy, affinity, no
// endpoints), from API objects through the cluster tracker, with its fake
// proxier's settings (node test-node at 192.168.0.2, pods 10.0.0.0/8, both
// nfacct counters present), and requires the restore text to equal the
// expectation written in kube-proxy's proxier_test.go, read from the Go
// module cache, after sorting chains (rule order within a chain kept).
func TestOverallIPTablesRules(t *testing.T) {
	compareUpstream(t, "TestOverallIPTablesRules", dataplanetest.StateOf(dataplanetest.OverallObjects()))
}

// TestBadIPs is kube-proxy's TestBadIPs: addresses and a source range with
// leading zeros, read as kube-proxy reads them.
func TestBadIPs(t *testing.T) {
	compareUpstream(t, "TestBadIPs", dataplanetest.StateOf(dataplanetest.BadIPObjects(false)))
}

// compareUpstream renders st as kube-proxy's fake proxier's node and holds
// the text against the first expectation of kube-proxy's test fn.
func compareUpstream(t *testing.T, fn string, st *cluster.State) {
	t.Helper()
	file := testenv.UpstreamSource(t, "pkg/proxy/iptables/proxier_test.go")
	want, err := dataplanetest.UpstreamExpectation(file, fn, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := mustRenderer(t, Config{NodeConfig: dataplane.NodeConfig{NodeName: dataplanetest.UpstreamNode, ClusterCIDR: podCIDR,
		NodeIPs: []netip.Addr{netip.MustParseAddr(dataplanetest.UpstreamNodeIP)}}})
	r.SetNFAcct(map[string]bool{NFAcctInvalidDropped: true, NFAcctLocalhostNodePorts: true})
	rs, err := r.Render(st, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	got, err := dataplanetest.CanonicalRestore(rs.Restore)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := dataplanetest.CanonicalRestore(want)
	if err != nil {
		t.Fatal(err)
	}
	if d := lineDiff(exp, got); d != "" {
		t.Errorf("our render differs from kube-proxy's %s (-kube-proxy +ours):\n%s", fn, d)
	}
}
