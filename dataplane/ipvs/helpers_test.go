package ipvs

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
)

func name(ns, svc, port string) cluster.ServicePortName {
	return cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: svc}, Port: port, Protocol: corev1.ProtocolTCP}
}

func clusterIPPort(n cluster.ServicePortName, ip string, port int32) *cluster.ServicePort {
	return &cluster.ServicePort{Name: n, Type: corev1.ServiceTypeClusterIP, ClusterIP: netip.MustParseAddr(ip), Port: port, TargetPort: "80"}
}

// ep builds an endpoint; flags: "R" ready, "S" serving, "T" terminating.
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
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: thisNode, ClusterCIDR: podCIDR, Faults: fs}, NodeIPs: []netip.Addr{nodeIP}, GracefulCheckPeriod: -1}
}

// fakes is a backend over a Fake table and a FakeSystem.
type fakes struct {
	ipvs *Fake
	sys  *FakeSystem
	b    *Backend
}

func newFakes(t *testing.T, cfg Config) *fakes {
	t.Helper()
	f := NewFake()
	sys := NewFakeSystem(f)
	b, err := New(cfg, f, sys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &fakes{ipvs: f, sys: sys, b: b}
}

func (f *fakes) sync(t *testing.T, st *cluster.State, full bool) dataplane.SyncResult {
	t.Helper()
	res, err := f.b.Sync(st, nil, full)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return res
}

func (f *fakes) dump(t *testing.T) string {
	t.Helper()
	d, err := f.b.Dump()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func key(proto, addrPort string) Key {
	ap := netip.MustParseAddrPort(addrPort)
	return Key{Proto: proto, Addr: ap.Addr(), Port: ap.Port()}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
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
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("%s differs (-want +got):\n%s", path, d)
	}
}
