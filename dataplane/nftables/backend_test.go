package nftables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// failingFake fails the next Run when fail is set.
type failingFake struct {
	*knftables.Fake
	fail bool
}

func (f *failingFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail {
		f.fail = false
		return errors.New("injected failure")
	}
	return f.Fake.Run(ctx, tx)
}

func TestBackendFailureForcesFullSync(t *testing.T) {
	for _, layout := range layouts {
		st := overallState()
		ff := &failingFake{Fake: knftables.NewFake(knftables.IPv4Family, DefaultTable)}
		b, err := NewBackend(testConfig(layout), ff, BackendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.Sync(st, nil, false)
		if err != nil || !res.Full || res.Lines == 0 || res.Bytes == 0 {
			t.Fatalf("%s: first sync %+v, %v", layout, res, err)
		}
		spn := name("ns2", "svc2", "p80")
		st.Endpoints[spn] = st.Endpoints[spn][:1]
		ff.fail = true
		if _, err := b.Sync(st, []cluster.ServicePortName{spn}, false); err == nil {
			t.Fatalf("%s: injected failure not reported", layout)
		}
		// The kernel did not take it: the next sync is full, over the
		// committed state, and leaves the right table.
		res, err = b.Sync(st, nil, false)
		if err != nil || !res.Full {
			t.Fatalf("%s: sync after failure %+v, %v", layout, res, err)
		}
		checkSameAsFull(t, layout, ff.Fake, st)
		if d, err := b.Dump(); err != nil || d != ff.Fake.Dump() {
			t.Errorf("%s: Dump %v", layout, err)
		}
	}
}

// TestFullSyncKeepsAffinityState: a periodic full sync rewrites chains and
// static maps but keeps the clients the kernel recorded in affinity sets; a
// stale service port is removed (its chains, flushed, are deleted by the
// next render in the kube-proxy layout, as kube-proxy does).
func TestFullSyncKeepsAffinityState(t *testing.T) {
	for _, layout := range layouts {
		st := overallState()
		b, f := load(t, testConfig(layout), st)
		set := AffinitySet(name("ns3", "svc3", "p80"), "10.180.0.3:80")
		tx := f.NewTransaction()
		tx.Add(&knftables.Element{Set: set, Key: []string{"10.0.0.2"}})
		if err := f.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		spn := name("ns2", "svc2", "p80")
		delete(st.Services, spn)
		delete(st.Endpoints, spn)
		text, stats := sync(t, b, st, nil, true)
		if !stats.Full || stats.First || strings.Contains(text, "delete table") {
			t.Errorf("%s: periodic full sync %+v:\n%s", layout, stats, text)
		}
		if f.Table.Sets[set] == nil || f.Table.Sets[set].FindElement("10.0.0.2") == nil {
			t.Errorf("%s: the full sync lost the affinity state", layout)
		}
		if strings.Contains(withoutStale(f.Dump()), "ns2/svc2") {
			t.Errorf("%s: stale service left after a full sync", layout)
		}
		// Without the recorded client, the table equals a fresh one.
		tx = f.NewTransaction()
		tx.Delete(&knftables.Element{Set: set, Key: []string{"10.0.0.2"}})
		if err := f.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		checkSameAsFull(t, layout, f, st)
	}
}

func TestBackendCleanup(t *testing.T) {
	b, f := load(t, testConfig(LayoutFast), overallState())
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if f.Table != nil {
		t.Errorf("table left after cleanup:\n%s", f.Dump())
	}
	if err := b.Cleanup(); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
	// The next sync recreates everything.
	res, err := b.Sync(overallState(), nil, false)
	if err != nil || !res.Full {
		t.Fatalf("sync after cleanup %+v, %v", res, err)
	}
	checkSameAsFull(t, LayoutFast, f, overallState())
}

// TestRenderForNode: `sim rules --mode nftables` for kube-proxy's test
// Service names the chains with the reference hashes.
func TestRenderForNode(t *testing.T) {
	st := newTestState()
	add(st, clusterIPPort(name("ns1", "svc1", "p80"), "172.30.0.41", 80), ep("10.180.0.1", 80, otherNode, "R"))
	out, err := RenderForNode(st, thisNode, Config{NodeConfig: dataplane.NodeConfig{ClusterCIDR: podCIDR}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80",
		"add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:80",
		"add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "chain ip kube-proxy endpoint-") {
		t.Errorf("an endpoint chain without affinity:\n%s", out)
	}
	if _, err := RenderForNode(st, thisNode, Config{Layout: "bogus"}); err == nil || !strings.Contains(err.Error(), "unknown nftables layout") {
		t.Errorf("bad layout: %v", err)
	}
	fast, err := RenderForNode(st, thisNode, Config{Layout: LayoutFast})
	if err != nil || !strings.Contains(fast, "add element ip kube-proxy cluster-ip-endpoints-tcp { 172.30.0.41 . tcp . 80 . 0 : 10.180.0.1 . 80 }") {
		t.Errorf("fast layout: %v\n%s", err, fast)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Layout: "iptables"},
		{NodeConfig: dataplane.NodeConfig{MasqueradeBit: 40}},
		{NodeConfig: dataplane.NodeConfig{ClusterCIDR: mustPrefix("fd00::/64")}},
	} {
		if _, err := NewRenderer(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	if _, err := NewBackend(Config{}, nil, BackendOptions{}); err == nil {
		t.Error("nil interface accepted")
	}
	r, _ := NewRenderer(Config{})
	if _, _, err := r.Render(nil, nil, true); err == nil {
		t.Error("nil state accepted")
	}
	_ = proxy.Faults{}
}
