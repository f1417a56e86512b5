package netns

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// tinyConfig is two nodes, node-a (198.18.0.1/16, pods 10.244.0.0/24) with
// the endpoint 10.244.0.2 (plus extraA) and node-b (198.18.0.2/16, pods
// 10.244.1.0/24) with 10.244.1.2 and 10.244.1.3; a client pod "load" on each
// node and a two-address client "multi" on node-a. It is what
// harness/topology derives from a two-node cluster with those endpoints and
// clients (its tests check the derivation).
func tinyConfig(runID string, extraA ...netip.Addr) *Config {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	epsA := append(addrs("10.244.0.2"), extraA...)
	slices.SortFunc(epsA, netip.Addr.Compare)
	return &Config{RunID: runID, Nodes: []NodeConfig{
		{Name: "node-a", Addr: p("198.18.0.1/16"), PodCIDR: p("10.244.0.0/24"), Gateway: a("10.244.0.1"), Endpoints: epsA,
			Clients: []ClientConfig{{Group: "load", Addrs: addrs("10.244.0.254")}, {Group: "multi", Addrs: addrs("10.244.0.253", "10.244.0.252")}}},
		{Name: "node-b", Addr: p("198.18.0.2/16"), PodCIDR: p("10.244.1.0/24"), Gateway: a("10.244.1.1"), Endpoints: addrs("10.244.1.2", "10.244.1.3"),
			Clients: []ClientConfig{{Group: "load", Addrs: addrs("10.244.1.254")}}},
	}}
}

// newTinyConfig is tinyConfig under a fresh random run ID.
func newTinyConfig(t testing.TB, extraA ...netip.Addr) *Config {
	t.Helper()
	id, err := NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	return tinyConfig(id, extraA...)
}

func TestNamespaceNames(t *testing.T) {
	cfg := tinyConfig("abc123")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kpsim-abc123-_fabric",
		"kpsim-abc123-node-a", "kpsim-abc123-node-a_be", "kpsim-abc123-node-a_c-load-0", "kpsim-abc123-node-a_c-multi-0",
		"kpsim-abc123-node-b", "kpsim-abc123-node-b_be", "kpsim-abc123-node-b_c-load-0",
	}
	if got := cfg.NamespaceNames(); !slices.Equal(got, want) {
		t.Errorf("namespace names:\n got %v\nwant %v", got, want)
	}
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"bad run id":            {func(c *Config) { c.RunID = "XYZ" }, "run id"},
		"no node":               {func(c *Config) { c.Nodes = nil }, "no node"},
		"endpoint is a gateway": {func(c *Config) { c.Nodes[0].Endpoints = addrs("10.244.0.1") }, "10.244.0.1"},
		"endpoint on two nodes": {func(c *Config) { c.Nodes[1].Endpoints = addrs("10.244.0.2") }, "address 10.244.0.2 is both"},
		"ipv6 endpoint":         {func(c *Config) { c.Nodes[0].Endpoints = addrs("fd00::1") }, "not IPv4"},
		"gateway outside":       {func(c *Config) { c.Nodes[0].Gateway = netip.MustParseAddr("10.9.0.1") }, "outside its pod CIDR"},
		"client outside":        {func(c *Config) { c.Nodes[1].Clients[0].Addrs = addrs("10.244.0.200") }, "outside node node-b's pod CIDR"},
		"client twice":          {func(c *Config) { c.Nodes[1].Clients = append(c.Nodes[1].Clients, c.Nodes[1].Clients[0]) }, "two client pods"},
		"same label":            {func(c *Config) { c.Nodes[1].Name = "node-a" }, "same label"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := tinyConfig("abc123")
			tc.edit(cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestDiffAddrs(t *testing.T) {
	add, del := diffAddrs(addrs("10.0.0.1", "10.0.0.2"), addrs("10.0.0.2", "10.0.0.3"))
	if !slices.Equal(add, addrs("10.0.0.3")) || !slices.Equal(del, addrs("10.0.0.1")) {
		t.Errorf("diffAddrs: add %v del %v", add, del)
	}
}

func TestSysctlPath(t *testing.T) {
	for in, want := range map[string]string{
		"net.ipv4.ip_forward":         "/proc/sys/net/ipv4/ip_forward",
		"net/ipv4/conf/all/rp_filter": "/proc/sys/net/ipv4/conf/all/rp_filter",
	} {
		if got := sysctlPath(in); got != want {
			t.Errorf("sysctlPath(%q) = %q, want %q", in, got, want)
		}
	}
}
