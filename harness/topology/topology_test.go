package topology

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// tinyState is two nodes and one Service with an endpoint on each node, plus
// an endpoint with no node inside node-b's block and one outside every block.
func tinyState(extra ...*cluster.Endpoint) *cluster.State {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	spn := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns1", Name: "svc1"}, Port: "p80", Protocol: corev1.ProtocolTCP}
	eps := []*cluster.Endpoint{
		{IP: a("10.244.0.2"), Port: 8080, Ready: true, NodeName: "node-a"},
		{IP: a("10.244.1.2"), Port: 8080, Ready: true, NodeName: "node-b"},
		{IP: a("10.244.1.3"), Port: 8080, Ready: false, NodeName: "node-b"},
	}
	eps = append(eps, extra...)
	return &cluster.State{
		Services: map[cluster.ServicePortName]*cluster.ServicePort{
			spn: {Name: spn, Type: corev1.ServiceTypeClusterIP, ClusterIP: a("10.96.0.10"), Port: 80},
		},
		Endpoints: map[cluster.ServicePortName][]*cluster.Endpoint{spn: eps},
		Nodes: map[string]*cluster.Node{
			"node-b": {Name: "node-b", IP: a("198.18.0.2"), PodCIDR: p("10.244.1.0/24")},
			"node-a": {Name: "node-a", IP: a("198.18.0.1"), PodCIDR: p("10.244.0.0/24")},
		},
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestFromState(t *testing.T) {
	st := tinyState(
		&cluster.Endpoint{IP: netip.MustParseAddr("10.244.1.9"), Port: 8080}, // no node: by pod CIDR
		&cluster.Endpoint{IP: netip.MustParseAddr("10.180.0.1"), Port: 80},   // nowhere: first node
	)
	cfg, err := FromState(st, Options{
		RunID:       "abc123",
		NodeNetwork: netip.MustParsePrefix("198.18.0.0/16"),
		Clients: []scenario.Client{
			{Name: "load", PodsPerNode: 2, SourceIPs: 1},
			{Name: "aff", Nodes: []string{"node-b"}, SourceIPs: 3},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Nodes) != 2 || cfg.Nodes[0].Name != "node-a" || cfg.Nodes[1].Name != "node-b" {
		t.Fatalf("nodes not in name order: %+v", cfg.Nodes)
	}
	na, nb := cfg.Nodes[0], cfg.Nodes[1]
	if na.Addr.String() != "198.18.0.1/16" || na.Gateway.String() != "10.244.0.1" {
		t.Errorf("node-a addr %s gateway %s", na.Addr, na.Gateway)
	}
	if !slices.Equal(na.Endpoints, addrs("10.180.0.1", "10.244.0.2")) {
		t.Errorf("node-a endpoints %v", na.Endpoints)
	}
	if !slices.Equal(nb.Endpoints, addrs("10.244.1.2", "10.244.1.3", "10.244.1.9")) {
		t.Errorf("node-b endpoints %v", nb.Endpoints)
	}
	// Clients from the top of the block down.
	var got []string
	for _, c := range nb.Clients {
		var as []string
		for _, a := range c.Addrs {
			as = append(as, a.String())
		}
		got = append(got, c.Group+"-"+itoa(c.Index)+"="+strings.Join(as, ","))
	}
	want := []string{"load-0=10.244.1.254", "load-1=10.244.1.253", "aff-0=10.244.1.252,10.244.1.251,10.244.1.250"}
	if !slices.Equal(got, want) {
		t.Errorf("node-b clients:\n got %v\nwant %v", got, want)
	}
	if len(na.Clients) != 2 {
		t.Errorf("node-a has %d clients, want 2", len(na.Clients))
	}
	names := cfg.NamespaceNames()
	wantNames := []string{
		"kpsim-abc123-_fabric",
		"kpsim-abc123-node-a", "kpsim-abc123-node-a_be", "kpsim-abc123-node-a_c-load-0", "kpsim-abc123-node-a_c-load-1",
		"kpsim-abc123-node-b", "kpsim-abc123-node-b_be", "kpsim-abc123-node-b_c-load-0", "kpsim-abc123-node-b_c-load-1", "kpsim-abc123-node-b_c-aff-0",
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("namespace names:\n got %v\nwant %v", names, wantNames)
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

func TestFromStateDefaults(t *testing.T) {
	cfg, err := FromState(tinyState(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !netns.ValidRunID(cfg.RunID) {
		t.Errorf("random run id %q", cfg.RunID)
	}
	if cfg.Nodes[0].Addr.Bits() != 16 {
		t.Errorf("default node prefix /%d, want /16", cfg.Nodes[0].Addr.Bits())
	}
	if len(cfg.Nodes[0].Clients) != 0 {
		t.Errorf("clients without traffic: %v", cfg.Nodes[0].Clients)
	}
}

func TestFromStateErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		st   *cluster.State
		o    Options
		want string
	}{
		"no nodes":     {&cluster.State{}, Options{}, "no node"},
		"bad run id":   {tinyState(), Options{RunID: "XYZ"}, "run id"},
		"unknown node": {tinyState(), Options{Clients: []scenario.Client{{Name: "c", Nodes: []string{"node-z"}}}}, `"node-z"`},
		"exhausted": {tinyState(), Options{Clients: []scenario.Client{{Name: "c", PodsPerNode: 100, SourceIPs: 3}}},
			"no address left"},
		"endpoint on two nodes": {tinyState(&cluster.Endpoint{IP: netip.MustParseAddr("10.244.0.2"), NodeName: "node-b"}), Options{},
			"on node node-a and on node node-b"},
		"endpoint is a gateway": {tinyState(&cluster.Endpoint{IP: netip.MustParseAddr("10.244.0.1"), NodeName: "node-a"}), Options{},
			"10.244.0.1"},
		"ipv6 endpoint": {tinyState(&cluster.Endpoint{IP: netip.MustParseAddr("fd00::1"), NodeName: "node-a"}), Options{},
			"not IPv4"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := FromState(tc.st, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if err.Error() != strings.ToLower(err.Error()[:1])+err.Error()[1:] {
				t.Errorf("error not lower-case: %v", err)
			}
		})
	}
}

func TestLastHost(t *testing.T) {
	for p, want := range map[string]string{
		"10.244.1.0/24": "10.244.1.254",
		"10.0.0.0/30":   "10.0.0.2",
		"10.0.0.0/16":   "10.0.255.254",
	} {
		if got := LastHost(netip.MustParsePrefix(p)).String(); got != want {
			t.Errorf("LastHost(%s) = %s, want %s", p, got, want)
		}
	}
}

// TestEndpoints places a changed state on an existing topology's nodes the
// way FromState does, without touching the config.
func TestEndpoints(t *testing.T) {
	cfg, err := FromState(tinyState(), Options{RunID: "abc123"})
	if err != nil {
		t.Fatal(err)
	}
	st := tinyState(
		&cluster.Endpoint{IP: netip.MustParseAddr("10.244.1.20"), Port: 8080, NodeName: "node-b"},
		&cluster.Endpoint{IP: netip.MustParseAddr("10.244.0.9"), Port: 8080}, // no node: by pod CIDR
		&cluster.Endpoint{IP: netip.MustParseAddr("10.180.0.2"), Port: 8080}, // nowhere: first node
	)
	got, err := Endpoints(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]netip.Addr{
		"node-a": addrs("10.180.0.2", "10.244.0.2", "10.244.0.9"),
		"node-b": addrs("10.244.1.2", "10.244.1.3", "10.244.1.20"),
	}
	for n, w := range want {
		if !slices.Equal(got[n], w) {
			t.Errorf("%s: %v, want %v", n, got[n], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("nodes %v, want node-a and node-b", got)
	}
	if !slices.Equal(cfg.Nodes[1].Endpoints, addrs("10.244.1.2", "10.244.1.3")) {
		t.Errorf("Endpoints changed the config: node-b has %v", cfg.Nodes[1].Endpoints)
	}
	twice := tinyState(&cluster.Endpoint{IP: netip.MustParseAddr("10.244.0.2"), NodeName: "node-b"})
	if _, err := Endpoints(cfg, twice); err == nil || !strings.Contains(err.Error(), "on node node-a and on node node-b") {
		t.Errorf("an endpoint on two nodes: %v", err)
	}
}
