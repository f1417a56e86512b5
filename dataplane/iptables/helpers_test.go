package iptables

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// Fixture conventions from kube-proxy's tests: pods 10.0.0.0/8, cluster IPs
// 172.30.0.0/16, this node "node1" at 192.168.0.2, another node "node2".
const (
	thisNode  = "node1"
	otherNode = "node2"
)

var (
	podCIDR = netip.MustParsePrefix("10.0.0.0/8")
	nodeIP  = netip.MustParseAddr("192.168.0.2")
	podIP   = netip.MustParseAddr("10.0.0.2")
	extIP   = netip.MustParseAddr("203.0.113.2")
)

func name(ns, svc, port string) cluster.ServicePortName {
	return cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: svc}, Port: port, Protocol: corev1.ProtocolTCP}
}

func clusterIPPort(n cluster.ServicePortName, ip string, port int32) *cluster.ServicePort {
	return &cluster.ServicePort{Name: n, Type: corev1.ServiceTypeClusterIP, ClusterIP: netip.MustParseAddr(ip), Port: port, TargetPort: "80"}
}

// ep builds an endpoint; flags: "R" ready, "S" serving, "T" terminating
// (a ready endpoint is serving).
func ep(ip string, port int32, node, flags string) *cluster.Endpoint {
	return &cluster.Endpoint{
		IP: netip.MustParseAddr(ip), Port: port, NodeName: node,
		Ready:       strings.Contains(flags, "R"),
		Serving:     strings.Contains(flags, "R") || strings.Contains(flags, "S"),
		Terminating: strings.Contains(flags, "T"),
	}
}

func newState() *cluster.State {
	return &cluster.State{
		Services:  map[cluster.ServicePortName]*cluster.ServicePort{},
		Endpoints: map[cluster.ServicePortName][]*cluster.Endpoint{},
		Nodes: map[string]*cluster.Node{
			thisNode:  {Name: thisNode, IP: nodeIP, Zone: "zone-a"},
			otherNode: {Name: otherNode, IP: netip.MustParseAddr("192.168.0.3"), Zone: "zone-b"},
		},
	}
}

func add(st *cluster.State, sp *cluster.ServicePort, eps ...*cluster.Endpoint) {
	st.Services[sp.Name] = sp
	if len(eps) > 0 {
		st.Endpoints[sp.Name] = eps
	}
}

func testConfig(faults ...proxy.Fault) Config {
	fs := proxy.Faults{}
	for _, f := range faults {
		fs[f] = true
	}
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: thisNode, ClusterCIDR: podCIDR, Faults: fs}}
}

func mustRenderer(t *testing.T, cfg Config) *Renderer {
	t.Helper()
	r, err := NewRenderer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newBackend returns a Backend on FakeCommands with a fresh fake.
func newBackend(t *testing.T, cfg Config) (*Backend, *FakeCommands) {
	t.Helper()
	c := NewFakeCommands(nodeIP)
	b, err := NewBackendWithCommands(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b, c
}

// apply syncs st through the Backend, fully or partially, and returns the
// ruleset it applied.
func apply(t *testing.T, b *Backend, st *cluster.State, changed []cluster.ServicePortName, full bool) *Ruleset {
	t.Helper()
	if _, err := b.Sync(st, changed, full); err != nil {
		t.Fatalf("sync: %v\n%s", err, numbered(b.LastText))
	}
	return b.LastRuleset
}

// load syncs st fully through a new Backend on a fresh fake.
func load(t *testing.T, cfg Config, st *cluster.State) (*Fake, *Backend, *Ruleset) {
	t.Helper()
	b, c := newBackend(t, cfg)
	rs := apply(t, b, st, nil, true)
	return c.Fake, b, rs
}

func numbered(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		fmt.Fprintf(&b, "%4d %s\n", i+1, l)
	}
	return b.String()
}

// golden compares got with testdata/NAME.golden, rewriting it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if d := lineDiff(string(want), got); d != "" {
		t.Errorf("%s differs from the golden file (-want +got):\n%s", path, d)
	}
}

// lineDiff is a small line diff: lines only in want (-) and only in got (+),
// in order; "" when equal.
func lineDiff(want, got string) string {
	if want == got {
		return ""
	}
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	// Longest common subsequence, fine for test-sized inputs.
	n, m := len(w), len(g)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if w[i] == g[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var b strings.Builder
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && w[i] == g[j]:
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			b.WriteString("+" + g[j] + "\n")
			j++
		default:
			b.WriteString("-" + w[i] + "\n")
			i++
		}
	}
	return b.String()
}
