package netns

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/apiserver"
)

// openScenario loads a scenario file of the repository into a model.
func openScenario(t *testing.T, file string) *apiserver.Model {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := apiserver.Open(ctx, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func TestConfigFromModel(t *testing.T) {
	m := openScenario(t, "../../scenarios/1000-services.yaml")
	cfg, err := ConfigFromModel(m, "abc123")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Nodes) != 24 {
		t.Fatalf("%d nodes, want 24", len(cfg.Nodes))
	}
	distinct := map[netip.Addr]bool{}
	for _, eps := range m.State.Endpoints {
		for _, ep := range eps {
			distinct[ep.IP] = true
		}
	}
	placed := 0
	for _, n := range cfg.Nodes {
		placed += len(n.Endpoints)
		if n.Addr.Bits() != 16 || !netip.MustParsePrefix("198.18.0.0/16").Contains(n.Addr.Addr()) {
			t.Errorf("node %s address %s, want one in the scenario's 198.18.0.0/16", n.Name, n.Addr)
		}
		// web: podsPerNode 2, sourceIPs 4.
		if len(n.Clients) != 2 || len(n.Clients[0].Addrs) != 4 {
			t.Errorf("node %s clients %+v, want 2 pods x 4 addresses", n.Name, n.Clients)
		}
	}
	if placed != len(distinct) {
		t.Errorf("placed %d endpoint addresses, the state has %d", placed, len(distinct))
	}
	if got := len(cfg.NamespaceNames()); got != 1+24*2+48 {
		t.Errorf("%d namespaces, want %d", got, 1+24*2+48)
	}
}

// TestScenarioTopology builds the 1000-Service scenario's topology (24
// nodes, 97 namespaces, every endpoint address) and connects across it.
func TestScenarioTopology(t *testing.T) {
	needRoot(t)
	testenv.SkipIfShort(t, "skips the 97-namespace build")
	m := openScenario(t, "../../scenarios/1000-services.yaml")
	cfg, err := ConfigFromModel(m, "")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	topo, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		t1 := time.Now()
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
		t.Logf("closed in %v", time.Since(t1).Round(time.Millisecond))
	})
	t.Logf("built %d namespaces in %v", len(topo.Namespaces()), time.Since(t0).Round(time.Millisecond))
	first, last := topo.Nodes()[0], topo.Nodes()[len(topo.Nodes())-1]
	ep := last.Config.Endpoints[len(last.Config.Endpoints)-1]
	serve(t, last.Backends, ep.String())
	c := first.Clients[1]
	got, err := dial(t, c.NS, c.Config.Addrs[3], ep.String())
	if err != nil || got != c.Config.Addrs[3].String() {
		t.Errorf("%s -> %s: saw %q, %v", c.NS.Name, ep, got, err)
	}
}
