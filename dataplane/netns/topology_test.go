package netns

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/harness/testenv"
)

func needRoot(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
}

// buildTiny builds the two-node topology of tinyConfig (plus extra
// endpoints on node-a) with a client pod per node and a two-address client
// on node-a.
func buildTiny(t *testing.T, extraA ...netip.Addr) *Topology {
	t.Helper()
	needRoot(t)
	cfg := newTinyConfig(t, extraA...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	topo, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return topo
}

// serve listens on addr:8080 inside ns and answers each connection with the
// address it came from. It stops with the test.
func serve(t *testing.T, ns *Namespace, addr string) {
	t.Helper()
	var ln net.Listener
	err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(addr, "8080"))
		return err
	})
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns.Name, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write([]byte(c.RemoteAddr().(*net.TCPAddr).IP.String() + "\n"))
			c.Close()
		}
	})
}

// dial connects from client ns (from src, if valid) to dst:8080 and returns
// the source address the server saw.
func dial(t *testing.T, ns *Namespace, src netip.Addr, dst string) (string, error) {
	t.Helper()
	d := net.Dialer{Timeout: 3 * time.Second}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: net.IP(src.AsSlice())}
	}
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = d.Dial("tcp4", net.JoinHostPort(dst, "8080"))
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func client(t *testing.T, topo *Topology, node, group string) *Client {
	t.Helper()
	n, ok := topo.Node(node)
	if !ok {
		t.Fatalf("no node %s", node)
	}
	for _, c := range n.Clients {
		if c.Config.Group == group {
			return c
		}
	}
	t.Fatalf("no client %s on %s", group, node)
	return nil
}

func TestTopologyRouting(t *testing.T) {
	topo := buildTiny(t, netip.MustParseAddr("10.180.0.1"))
	for _, ep := range []string{"10.244.0.2", "10.244.1.2", "10.244.1.3", "10.180.0.1"} {
		be, ok := topo.BackendFor(netip.MustParseAddr(ep))
		if !ok {
			t.Fatalf("no backend namespace holds %s", ep)
		}
		serve(t, be, ep)
	}
	for _, tc := range []struct {
		node, group string
		src         int // index into the client's addresses
		dst         string
		why         string
	}{
		{"node-a", "load", 0, "10.244.1.2", "across the fabric"},
		{"node-a", "load", 0, "10.244.1.3", "second endpoint, same backend namespace"},
		{"node-a", "load", 0, "10.244.0.2", "same node"},
		{"node-b", "load", 0, "10.244.0.2", "across the fabric, other way"},
		{"node-b", "load", 0, "10.180.0.1", "endpoint outside every pod CIDR"},
		{"node-a", "multi", 1, "10.244.1.2", "extra source address"},
	} {
		c := client(t, topo, tc.node, tc.group)
		src := c.Config.Addrs[tc.src]
		got, err := dial(t, c.NS, src, tc.dst)
		if err != nil {
			t.Errorf("%s: %s (%s) -> %s: %v", tc.why, c.NS.Name, src, tc.dst, err)
			continue
		}
		if got != src.String() {
			t.Errorf("%s: server saw %s, want the client's %s (no NAT on the way)", tc.why, got, src)
		}
	}
	// An address nobody holds is unreachable, not silently swallowed.
	c := client(t, topo, "node-a", "load")
	if _, err := dial(t, c.NS, netip.Addr{}, "10.244.1.77"); err == nil {
		t.Errorf("dial to an unassigned pod address succeeded")
	}
}

func ourNamespaces(t *testing.T, prefix string) []string {
	t.Helper()
	names, err := listNamespaces(prefix)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func ourRootLinks(t *testing.T, prefix string) []string {
	t.Helper()
	links, err := rootLinks(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		out = append(out, l.Attrs().Name)
	}
	return out
}

func TestTopologyClose(t *testing.T) {
	needRoot(t)
	cfg := newTinyConfig(t)
	prefix := RunPrefix(cfg.RunID)
	topo, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Close() })
	want := cfg.NamespaceNames()
	slices.Sort(want)
	if got := ourNamespaces(t, prefix); !slices.Equal(got, want) {
		t.Errorf("namespaces after build:\n got %v\nwant %v", got, want)
	}
	if st, err := ProbeRun(cfg.RunID); err != nil || !st.Alive || st.PID != os.Getpid() {
		t.Errorf("ProbeRun of a live run = %+v, %v; want alive with our pid", st, err)
	}
	if l := ourRootLinks(t, Prefix); len(l) != 0 {
		t.Errorf("links of ours in the root namespace: %v", l)
	}
	// Every link carries the run prefix in an alternative name.
	n, _ := topo.Node("node-a")
	out, err := n.NS.Exec("ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.Contains(line, ": lo:") {
			continue
		}
		if !strings.Contains(line, "altname "+prefix) {
			t.Errorf("link without a %s altname in %s: %s", prefix, n.NS.Name, line)
		}
	}
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	if err := topo.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if got := ourNamespaces(t, prefix); len(got) != 0 {
		t.Errorf("namespaces left after Close: %v", got)
	}
	if st, _ := ProbeRun(cfg.RunID); st.Marker || st.Alive {
		t.Errorf("marker left after Close: %+v", st)
	}
}

func TestBuildInterrupted(t *testing.T) {
	needRoot(t)
	cfg := newTinyConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Build(ctx, cfg); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("Build with a cancelled context: %v", err)
	}
	if got := ourNamespaces(t, RunPrefix(cfg.RunID)); len(got) != 0 {
		t.Errorf("namespaces left after an interrupted build: %v", got)
	}
	// A run ID in use by a live run is refused.
	topo := buildTiny(t)
	cfg.RunID = topo.RunID()
	if _, err := Build(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Build with a live run's id: %v", err)
	}
	if len(ourNamespaces(t, RunPrefix(cfg.RunID))) != len(topo.Config().NamespaceNames()) {
		t.Errorf("the refused build touched the live run's namespaces")
	}
}

func TestExecAndSysctl(t *testing.T) {
	topo := buildTiny(t)
	n, _ := topo.Node("node-b")
	out, err := n.NS.Exec("ip", "-4", "-o", "addr", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"198.18.0.2/16", "10.244.1.1/32"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ip addr in %s lacks %s:\n%s", n.NS.Name, want, out)
		}
	}
	out, err = Exec(n.Backends.Name, "ip", "-4", "-o", "addr", "show")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "10.244.1.3/32") {
		t.Errorf("backend namespace lacks 10.244.1.3/32:\n%s", out)
	}
	if _, err := n.NS.Exec("ip", "link", "show", "no-such-link"); err == nil || !strings.Contains(err.Error(), "no-such-link") {
		t.Errorf("a failing command's error should carry its stderr: %v", err)
	}
	if v, err := n.NS.ReadSysctl("net.ipv4.ip_forward"); err != nil || v != "1" {
		t.Errorf("ip_forward in the node namespace = %q, %v; want 1", v, err)
	}
	c := client(t, topo, "node-b", "load")
	if v, err := c.NS.ReadSysctl("net.ipv4.ip_forward"); err != nil || v != "0" {
		t.Errorf("ip_forward in a client namespace = %q, %v; want 0", v, err)
	}
	if err := c.NS.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.NS.ReadSysctl("net/ipv4/ip_forward"); v != "1" {
		t.Errorf("Sysctl did not take: %q", v)
	}
	// Both ends of the client's link queue a burst behind an ARP exchange.
	for _, k := range []struct {
		ns   *Namespace
		link string
	}{{c.NS, podLink(topo.RunID())}, {n.NS, clientPortLink(topo.RunID(), 0)}} {
		if v, err := k.ns.ReadSysctl("net/ipv4/neigh/" + k.link + "/unres_qlen_bytes"); err != nil || v != unresolvedQueue {
			t.Errorf("unres_qlen_bytes of %s in %s = %q, %v; want %s", k.link, k.ns.Name, v, err, unresolvedQueue)
		}
	}
	// Namespaced: the host's value is whatever it was, read from outside.
	if v, err := os.ReadFile("/proc/sys/net/ipv4/conf/all/rp_filter"); err == nil {
		if got, _ := n.NS.ReadSysctl("net.ipv4.conf.all.rp_filter"); got != "0" {
			t.Errorf("rp_filter in the node namespace = %q (host %q), want 0", got, strings.TrimSpace(string(v)))
		}
	}
}

func TestSyncEndpoints(t *testing.T) {
	topo := buildTiny(t)
	// node-b: 10.244.1.3 goes, 10.244.1.20 and 10.180.0.2 (outside every
	// pod CIDR) come; given unsorted.
	want := map[string][]netip.Addr{
		"node-a": addrs("10.244.0.2"),
		"node-b": addrs("10.244.1.2", "10.244.1.20", "10.180.0.2"),
	}
	if err := topo.SyncEndpoints(map[string][]netip.Addr{"node-z": addrs("10.244.1.30")}); err == nil || !strings.Contains(err.Error(), "no node node-z") {
		t.Errorf("SyncEndpoints with an unknown node: %v", err)
	}
	if err := topo.SyncEndpoints(want); err != nil {
		t.Fatal(err)
	}
	n, _ := topo.Node("node-b")
	if !slices.Equal(n.Config.Endpoints, addrs("10.180.0.2", "10.244.1.2", "10.244.1.20")) {
		t.Fatalf("node-b endpoints after sync: %v", n.Config.Endpoints)
	}
	for _, ep := range []string{"10.244.1.20", "10.180.0.2"} {
		be, ok := topo.BackendFor(netip.MustParseAddr(ep))
		if !ok || be != n.Backends {
			t.Fatalf("BackendFor(%s) = %v, %v", ep, be, ok)
		}
		serve(t, be, ep)
		c := client(t, topo, "node-a", "load")
		if _, err := dial(t, c.NS, netip.Addr{}, ep); err != nil {
			t.Errorf("dial to new endpoint %s: %v", ep, err)
		}
	}
	out, _ := n.Backends.Exec("ip", "-4", "-o", "addr", "show")
	if strings.Contains(string(out), "10.244.1.3/") {
		t.Errorf("removed endpoint still has its address:\n%s", out)
	}
	if _, ok := topo.BackendFor(netip.MustParseAddr("10.244.1.3")); ok {
		t.Errorf("BackendFor still finds a removed endpoint")
	}
}

// TestDoLeavesThreadsHome runs many Do calls, then checks on many locked
// threads that every one is in the process's namespace.
func TestDoLeavesThreadsHome(t *testing.T) {
	topo := buildTiny(t)
	var wg sync.WaitGroup
	for i := range 40 {
		ns := topo.Namespaces()[i%len(topo.Namespaces())]
		wg.Go(func() {
			if err := ns.Do(func() error { return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var home unix.Stat_t
	if err := unix.Fstat(int(hostNS), &home); err != nil {
		t.Fatal(err)
	}
	for range 40 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			h, err := netns.Get()
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			var st unix.Stat_t
			unix.Fstat(int(h), &st)
			if st.Ino != home.Ino || st.Dev != home.Dev {
				t.Errorf("a thread was left in another namespace")
			}
		})
	}
	wg.Wait()
}

// bigConfig is nodes nodes with eps endpoints each and two client pods
// "c" per node (one address each, from the top of the pod block), for
// benchmarks.
func bigConfig(b testing.TB, nodes, eps int) *Config {
	id, err := NewRunID()
	if err != nil {
		b.Fatal(err)
	}
	cfg := &Config{RunID: id}
	for i := range nodes {
		pc := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i * 8), 0}), 21)
		top := netip.AddrFrom4([4]byte{10, 244, byte(i*8 + 7), 254})
		n := NodeConfig{Name: "node-" + strconv.Itoa(i+1), Addr: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(i + 1)}), 16),
			PodCIDR: pc, Gateway: pc.Addr().Next(),
			Clients: []ClientConfig{{Group: "c", Addrs: []netip.Addr{top}}, {Group: "c", Index: 1, Addrs: []netip.Addr{top.Prev()}}}}
		a := pc.Addr().Next().Next()
		for range eps {
			n.Endpoints = append(n.Endpoints, a)
			a = a.Next()
		}
		cfg.Nodes = append(cfg.Nodes, n)
	}
	return cfg
}

// BenchmarkBuild builds and closes 10 nodes x 500 endpoints with 2 client
// pods per node (31 namespaces, 5000 endpoint addresses and routes).
func BenchmarkBuild(b *testing.B) {
	needRoot(b)
	for b.Loop() {
		cfg := bigConfig(b, 10, 500)
		t0 := time.Now()
		topo, err := Build(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		built := time.Since(t0)
		if err := topo.Close(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(built.Milliseconds()), "build-ms")
	}
}
