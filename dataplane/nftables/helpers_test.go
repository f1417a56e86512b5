package nftables

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

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
	layouts = []Layout{LayoutKubeProxy, LayoutFast}
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

func newTestState() *cluster.State {
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
	} else {
		delete(st.Endpoints, sp.Name)
	}
}

func testConfig(layout Layout, faults ...proxy.Fault) Config {
	fs := proxy.Faults{}
	for _, f := range faults {
		fs[f] = true
	}
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: thisNode, ClusterCIDR: podCIDR, Faults: fs}, Layout: layout}
}

// newFakeBackend returns a backend over a fresh Fake.
func newFakeBackend(t testing.TB, cfg Config) (*Backend, *knftables.Fake) {
	t.Helper()
	f := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	b, err := NewBackend(cfg, f, BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b, f
}

// load renders st fully into a fresh Fake.
func load(t testing.TB, cfg Config, st *cluster.State) (*Backend, *knftables.Fake) {
	t.Helper()
	b, f := newFakeBackend(t, cfg)
	if _, err := b.Sync(st, nil, true); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return b, f
}

// sync runs one render on b and returns the transaction's text and stats.
func sync(t testing.TB, b *Backend, st *cluster.State, changed []cluster.ServicePortName, full bool) (string, Stats) {
	t.Helper()
	tx, stats, err := b.r.Render(st, changed, full)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nft.Run(context.Background(), tx); err != nil {
		t.Fatalf("run: %v\n%s", err, tx.String())
	}
	b.r.Commit()
	return tx.String(), stats
}

func tracer(t testing.TB, f *knftables.Fake) *Tracer {
	t.Helper()
	tr, err := NewTracer(f, nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func trace(t testing.TB, f *knftables.Fake, src netip.Addr, dst string, port int, h History) Result {
	t.Helper()
	res, err := tracer(t, f).Trace(Packet{Src: src, Protocol: "tcp", Dst: netip.MustParseAddr(dst), DPort: port}, h)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// targets lists a result's targets with " masq" where masqueraded.
func targets(r Result) string {
	var out []string
	for _, o := range r {
		if o.P <= 1e-12 {
			continue
		}
		s := o.Target
		if o.Masquerade {
			s += " masq"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

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
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (run with -update and review the diff):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	inW, inG := map[string]int{}, map[string]int{}
	for _, l := range w {
		inW[l]++
	}
	for _, l := range g {
		inG[l]++
	}
	var b strings.Builder
	for _, l := range w {
		if inG[l] == 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if inW[l] == 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

func faultNamed(s string) proxy.Fault { return proxy.Fault(s) }

// addWide adds a service port "wide/svcN:p80" with n ready endpoints, one
// of them local, at 172.30.1.n.
func addWide(st *cluster.State, n int) cluster.ServicePortName {
	spn := name("wide", fmt.Sprintf("svc%d", n), "p80")
	var eps []*cluster.Endpoint
	for i := range n {
		node := otherNode
		if i == 0 {
			node = thisNode
		}
		eps = append(eps, ep(fmt.Sprintf("10.181.%d.%d", n, i+1), 8080, node, "R"))
	}
	add(st, clusterIPPort(spn, fmt.Sprintf("172.30.1.%d", n), 80), eps...)
	return spn
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
