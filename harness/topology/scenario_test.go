package topology

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
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

func TestFromModel(t *testing.T) {
	m := openScenario(t, "../../scenarios/1000-services.yaml")
	cfg, err := FromModel(m, "abc123")
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
	// The fabric, a node and a backend namespace per node, the web pods,
	// and the world outside: its router and the internet client.
	if got := len(cfg.NamespaceNames()); got != 1+24*2+48+2 {
		t.Errorf("%d namespaces, want %d", got, 1+24*2+48+2)
	}
}

// TestScenarioTopology builds the 1000-Service scenario's topology (24
// nodes, 99 namespaces, every endpoint address) and connects across it.
func TestScenarioTopology(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.SkipIfShort(t, "skips the 99-namespace build")
	m := openScenario(t, "../../scenarios/1000-services.yaml")
	cfg, err := FromModel(m, "")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	topo, err := netns.Build(context.Background(), cfg)
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
	c := first.Clients[1]
	got, err := echoSource(last.Backends, c.NS, c.Config.Addrs[3], ep)
	if err != nil || got != c.Config.Addrs[3].String() {
		t.Errorf("%s -> %s: saw %q, %v", c.NS.Name, ep, got, err)
	}
}

// echoSource listens on dst:8080 in server, connects to it from client
// (from src) and returns the source address the server saw.
func echoSource(server, client *netns.Namespace, src, dst netip.Addr) (string, error) {
	addr := netip.AddrPortFrom(dst, 8080).String()
	var ln net.Listener
	if err := server.Do(func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		return "", err
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seen <- err.Error()
			return
		}
		seen <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		c.Close()
	}()
	d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IP(src.AsSlice())}}
	var c net.Conn
	if err := client.Do(func() (err error) { c, err = d.Dial("tcp4", addr); return err }); err != nil {
		return "", err
	}
	c.Close()
	select {
	case s := <-seen:
		return s, nil
	case <-time.After(3 * time.Second):
		return "", errors.New("the server saw no connection")
	}
}

// TestFromModelKindDump: the kind dump's host-network endpoints (the
// kubernetes Service's 172.18.0.3, the control plane's node address) stay
// in the node namespace, which holds that address; every pod endpoint is
// placed on its node; the topology is valid.
func TestFromModelKindDump(t *testing.T) {
	m := openScenario(t, "../../scenarios/testdata/import/kind.yaml")
	cfg, err := FromModel(m, "abc124")
	if err != nil {
		t.Fatal(err)
	}
	host := netip.MustParseAddr("172.18.0.3")
	if got := HostEndpoint(m.State, host); got != "kind-control-plane" {
		t.Errorf("HostEndpoint(%s) = %q, want kind-control-plane", host, got)
	}
	if got := HostEndpoint(m.State, netip.MustParseAddr("10.244.0.2")); got != "" {
		t.Errorf("a pod address is a host endpoint of %q", got)
	}
	placed := map[netip.Addr]string{}
	for _, n := range cfg.Nodes {
		if n.Addr.Bits() != 16 || !netip.MustParsePrefix("172.18.0.0/16").Contains(n.Addr.Addr()) {
			t.Errorf("node %s address %s, want its InternalIP in the inferred 172.18.0.0/16", n.Name, n.Addr)
		}
		for _, a := range n.Endpoints {
			placed[a] = n.Name
		}
	}
	if _, ok := placed[host]; ok {
		t.Errorf("host-network endpoint %s placed in a pod namespace", host)
	}
	for _, want := range []struct{ addr, node string }{{"10.244.0.2", "kind-control-plane"}, {"10.244.0.3", "kind-control-plane"}, {"10.244.1.2", "kind-worker"}, {"10.244.2.3", "kind-worker2"}} {
		if got := placed[netip.MustParseAddr(want.addr)]; got != want.node {
			t.Errorf("endpoint %s on %q, want %s", want.addr, got, want.node)
		}
	}
}
