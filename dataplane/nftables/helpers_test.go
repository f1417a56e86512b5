package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Fixtures and the golden helper from the backends' test kit.
const (
	thisNode  = dataplanetest.ThisNode
	otherNode = dataplanetest.OtherNode
)

var (
	podCIDR = dataplanetest.PodCIDR
	nodeIP  = dataplanetest.NodeIP
	podIP   = dataplanetest.PodIP
	extIP   = dataplanetest.ExtIP
	layouts = []Layout{LayoutKubeProxy, LayoutFast}

	name          = dataplanetest.Name
	clusterIPPort = dataplanetest.ClusterIPPort
	ep            = dataplanetest.EP
	newTestState  = dataplanetest.NewState
	add           = dataplanetest.Add
	golden        = dataplanetest.Golden
	lineDiff      = dataplanetest.Diff
)

func testConfig(layout Layout, faults ...proxy.Fault) Config {
	fs := proxy.Faults{}
	for _, f := range faults {
		fs[f] = true
	}
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: thisNode, ClusterCIDR: podCIDR, Faults: fs,
		ServiceCIDRs: []netip.Prefix{serviceCIDR}, NodeIPs: []netip.Addr{nodeIP}}, Layout: layout}
}

// serviceCIDR holds the test states' cluster IPs.
var serviceCIDR = netip.MustParsePrefix("172.30.0.0/16")

// withoutStale drops the kube-proxy layout's stale chains from a Fake
// dump: service chains without rules, which kube-proxy flushes in one sync
// and deletes in a later one (the next render, here).
func withoutStale(dump string) string {
	const chain, rule = "add chain ip kube-proxy ", "add rule ip kube-proxy "
	lines := strings.Split(strings.TrimSpace(dump), "\n")
	hasRules := map[string]bool{}
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, rule); ok {
			hasRules[strings.Fields(rest)[0]] = true
		}
	}
	var out []string
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, chain); ok {
			if n := strings.Fields(rest)[0]; strings.Contains(n, "/") && !hasRules[n] {
				continue
			}
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// newFakeBackend returns a backend over a fresh Fake.
func newFakeBackend(t testing.TB, cfg Config) (*Backend, *knftables.Fake) {
	t.Helper()
	f := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	b, err := NewBackend(cfg, f, BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.r.now = steppingClock()
	return b, f
}

// steppingClock is a renderer clock two seconds further on every render,
// so that each render deletes the chains the one before left stale (as
// kube-proxy's syncs, at least a second apart by its min sync period, do).
func steppingClock() func() time.Time {
	t := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return func() time.Time {
		t = t.Add(2 * time.Second)
		return t
	}
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

func tracePacket(t testing.TB, f *knftables.Fake, src netip.Addr, dst string, port int, h trace.History) trace.Result {
	t.Helper()
	res, err := tracer(t, f).Trace(trace.Packet{Src: src, Protocol: "tcp", Dst: netip.MustParseAddr(dst), DPort: port}, h)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// targets lists a result's targets with " masq" where masqueraded.
func targets(r trace.Result) string {
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
