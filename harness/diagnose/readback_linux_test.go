package diagnose

// The iptables-save test inputs are read-backs from a real kernel: our
// iptables backend loads a scenario's rules into a scratch node namespace
// (both iptables backends), and iptables-<variant>-save -c prints them. As
// root, TestIPTablesReadBack regenerates every case and requires the reader
// to understand the live text exactly as it understands the committed file
// (the header's date aside); with -update it rewrites the files
// (make diagnose-testdata). Review the diff.

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/apiserver"
)



// readBackCase is one generated dump: a scenario's rules for node-a.
type readBackCase struct {
	name     string // file stem
	scenario string         // a scenario file, or "" for dataplanetest.OverallState
	cfg      iptables.Config
}

func readBackCases() []readBackCase {
	cidr := netip.MustParsePrefix("10.244.0.0/16")
	node := dataplane.NodeConfig{NodeName: "node-a", ClusterCIDR: cidr}
	faulty := node
	faulty.Faults = proxy.Faults{proxy.FaultUniformProbability: true}
	conf := "../../scenarios/conformance/"
	return []readBackCase{
		{"distribution", conf + "distribution.yaml", iptables.Config{NodeConfig: node}},
		{"affinity", conf + "affinity.yaml", iptables.Config{NodeConfig: node}},
		{"internal-traffic-local", conf + "internal-traffic-local.yaml", iptables.Config{NodeConfig: node}},
		{"no-endpoints", conf + "no-endpoints.yaml", iptables.Config{NodeConfig: node}},
		{"many-endpoints", conf + "many-endpoints.yaml", iptables.Config{NodeConfig: node}},
		// kube-proxy drops the per-endpoint comments above 1,000
		// endpoints; a threshold of 10 gives the same layout here.
		{"many-endpoints-large", conf + "many-endpoints.yaml", iptables.Config{NodeConfig: node, LargeClusterThreshold: 10}},
		{"many-endpoints-uniform-fault", conf + "many-endpoints.yaml", iptables.Config{NodeConfig: faulty}},
		// One Service of each kind (NodePort, LoadBalancer-less ETP Local,
		// affinity, Local without local endpoints, no endpoints, UDP, an
		// unnamed port, terminating endpoints), as the backends' goldens.
		{"overall", "", iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: dataplanetest.ThisNode, ClusterCIDR: dataplanetest.PodCIDR}}},
	}
}

var readBackVariants = []string{iptables.VariantNFT, iptables.VariantLegacy}

func readBackFile(c readBackCase, variant string) string {
	return filepath.Join("testdata", "iptables", c.name+"."+variant+".save")
}

// TestIPTablesReadBack: see the file comment.
func TestIPTablesReadBack(t *testing.T) {
	testenv.RequireRoot(t)
	for _, variant := range readBackVariants {
		testenv.RequireCommands(t, iptables.Tool(variant, "restore"), iptables.Tool(variant, "save"), "ip")
	}
	for _, c := range readBackCases() {
		for _, variant := range readBackVariants {
			t.Run(c.name+"/"+variant, func(t *testing.T) {
				live := readBack(t, c, variant)
				file := readBackFile(c, variant)
				if dataplanetest.Updating() {
					if err := os.WriteFile(file, live, 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				committed, err := os.ReadFile(file)
				if err != nil {
					t.Fatalf("%v (generate with go test ./harness/diagnose/ -run TestIPTablesReadBack -update, as root)", err)
				}
				want, err := ReadIPTablesSave(file, committed)
				if err != nil {
					t.Fatal(err)
				}
				got, err := ReadIPTablesSave(file, live)
				if err != nil {
					t.Fatalf("the live read-back does not read: %v\n%s", err, live)
				}
				want.Captured, got.Captured = time.Time{}, time.Time{}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("the live read-back reads differently from %s (regenerate with -update and review the diff)", file)
				}
			})
		}
	}
}

// readBack loads c's rules with variant's iptables into a scratch namespace
// and returns iptables-<variant>-save -c of it.
func readBack(t *testing.T, c readBackCase, variant string) []byte {
	t.Helper()
	ctx := context.Background()
	st := dataplanetest.OverallState()
	if c.scenario != "" {
		m, err := apiserver.Open(ctx, c.scenario, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		st = m.State
	}
	id, err := netns.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	pc := netip.MustParsePrefix("10.244.0.0/24")
	topo, err := netns.Build(ctx, &netns.Config{RunID: id, Nodes: []netns.NodeConfig{{
		Name: "node-a", Addr: netip.MustParsePrefix("100.65.0.1/16"), PodCIDR: pc, Gateway: pc.Addr().Next(),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	}()
	n, _ := topo.Node("node-a")
	b, err := iptables.NewBackend(n.NS, c.cfg, variant)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(st, nil, true); err != nil {
		t.Fatal(err)
	}
	out, err := n.NS.Exec(iptables.Tool(variant, "save"), "-c")
	if err != nil {
		t.Fatalf("%s -c: %v", iptables.Tool(variant, "save"), err)
	}
	return out
}
