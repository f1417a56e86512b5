package upstream

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// update rewrites testdata/metrics-*.txt from the real kube-proxy:
// flock /tmp/kpsim-heavy.lock go test -run TestKubeProxy ./harness/upstream/ -update
var update = flag.Bool("update", false, "rewrite testdata/metrics-*.txt from the real kube-proxy (root)")

// The run the integration test builds: two nodes, a control plane, one
// Service with one endpoint per node.
var (
	testServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")
	testClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	testCP          = netip.MustParsePrefix("198.18.255.254/16")
	testClusterIP   = "10.96.0.10"
	testEndpoints   = []string{"10.244.0.5", "10.244.1.5"}
)

func testTopology(id string) *netns.Config {
	return &netns.Config{
		RunID: id, ServiceCIDR: testServiceCIDR, ControlPlane: testCP,
		Nodes: []netns.NodeConfig{
			{Name: "node-a", Addr: netip.MustParsePrefix("198.18.0.1/16"), PodCIDR: netip.MustParsePrefix("10.244.0.0/24"),
				Gateway: netip.MustParseAddr("10.244.0.1"), Endpoints: []netip.Addr{netip.MustParseAddr(testEndpoints[0])}},
			{Name: "node-b", Addr: netip.MustParsePrefix("198.18.0.2/16"), PodCIDR: netip.MustParsePrefix("10.244.1.0/24"),
				Gateway: netip.MustParseAddr("10.244.1.1"), Endpoints: []netip.Addr{netip.MustParseAddr(testEndpoints[1])}},
		},
	}
}

// hostState is what the run must leave as it found it in the root
// namespace: the global conntrack sizes and the root rulesets.
func hostState(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range []string{"/sys/module/nf_conntrack/parameters/hashsize", "/proc/sys/net/netfilter/nf_conntrack_max"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		out[f] = string(data)
	}
	dumps := [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}}
	if _, err := exec.LookPath("iptables-legacy-save"); err == nil {
		dumps = append(dumps, []string{"iptables-legacy-save"})
	}
	for _, c := range dumps {
		data, err := exec.Command(c[0], c[1:]...).Output()
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		// iptables-save's header and footer carry the time of the dump.
		var keep []string
		for _, l := range strings.Split(string(data), "\n") {
			if !strings.HasPrefix(l, "# ") {
				keep = append(keep, l)
			}
		}
		out[strings.Join(c, " ")] = strings.Join(keep, "\n")
	}
	return out
}

// startRun builds the topology and the control plane, registers the
// nodes and returns them; everything is closed through t.Cleanup.
func startRun(t *testing.T, ctx context.Context) (*netns.Topology, *ControlPlane) {
	t.Helper()
	topo, cp := StartForTest(t, ctx, TestControlPlane{Topology: *testTopology("")})
	for _, n := range topo.Nodes() {
		if _, err := RegisterNode(ctx, cp.Client(), n.Config.Name, n.Config.Addr.Addr(), n.Config.PodCIDR); err != nil {
			t.Fatal(err)
		}
	}
	return topo, cp
}

func TestKubeProxyIPTables(t *testing.T) { testKubeProxy(t, cluster.ModeIPTables, "") }

func TestKubeProxyIPTablesLegacy(t *testing.T) {
	testenv.RequireCommands(t, "iptables-legacy-save", "xtables-legacy-multi")
	testKubeProxy(t, cluster.ModeIPTables, BackendLegacy)
}

func TestKubeProxyNFTables(t *testing.T) { testKubeProxy(t, cluster.ModeNFTables, "") }

// testKubeProxy runs kube-proxy in both nodes against a real apiserver,
// writes a Service and its slice, settles, finds the ClusterIP and the
// endpoint in the rules read back from the node, patches the slice and
// finds the new endpoint; and checks that the host is untouched and no
// process of the run is left.
func testKubeProxy(t *testing.T, mode cluster.Mode, backend string) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "iptables-save", "nft", "unshare")
	before := hostState(t)
	ctx := context.Background()
	var inodes []uint64
	var pids []int
	t.Cleanup(func() { checkGone(t, before, inodes, pids) })
	topo, cp := startRun(t, ctx)
	for _, ns := range topo.Namespaces() {
		inodes = append(inodes, nsInode(t, ns.Path()))
	}
	var proxies []*KubeProxy
	for _, n := range topo.Nodes() {
		dir := filepath.Join(netns.RunDir(topo.RunID()), "kube-proxy-"+n.Config.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		k, err := StartKubeProxy(ctx, cp, KubeProxyConfig{
			Node: n.Config.Name, NS: n.NS, NodeIP: n.Config.Addr.Addr(), Mode: mode, ClusterCIDR: testClusterCIDR, Dir: dir,
			IPTablesBackend: backend,
		})
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, k.PID())
		t.Cleanup(func() {
			if err := k.Close(); err != nil {
				t.Error(err)
			}
			if t.Failed() {
				t.Logf("%s, last lines:\n%s", k.LogPath(), tail(k.LogPath(), 30))
			}
		})
		proxies = append(proxies, k)
		checkPrivateRun(t, k.PID())
	}
	if v := proxies[0].Version(); !strings.HasPrefix(v, "v1.") {
		t.Errorf("Version() = %q, want v1.x", v)
	}
	since := writeService(t, ctx, cp.Client())
	node := topo.Nodes()[0]
	settleAll(t, ctx, proxies, since)
	rules := readRules(t, node.NS, mode, backend)
	for _, want := range []string{testClusterIP, testEndpoints[0]} {
		if !strings.Contains(rules, want) {
			t.Errorf("%s rules in %s lack %s:\n%s", mode, node.NS.Name, want, rules)
		}
	}
	if strings.Contains(rules, testEndpoints[1]) {
		t.Errorf("%s rules hold %s before it was added", mode, testEndpoints[1])
	}
	since = time.Now()
	addEndpoint(t, ctx, cp.Client(), testEndpoints[1])
	settleAll(t, ctx, proxies, since)
	if rules := readRules(t, node.NS, mode, backend); !strings.Contains(rules, testEndpoints[1]) {
		t.Errorf("%s rules in %s lack the added endpoint %s:\n%s", mode, node.NS.Name, testEndpoints[1], rules)
	}
	m, err := proxies[0].Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		// testdata/metrics-MODE.txt: the real kube-proxy's /metrics after
		// two settled slice writes, for TestParseMetrics (no root).
		text, err := proxies[0].ScrapeText(ctx)
		if err == nil {
			err = os.WriteFile(filepath.Join("testdata", "metrics-"+string(mode)+".txt"), text, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if mode == cluster.ModeNFTables {
		checkEarlyExit(t, ctx, cp, node)
	}
	if m.Programming == 0 {
		t.Errorf("network_programming_duration_seconds has no sample after two slice writes with a trigger time: %+v", m)
	}
}

func settleAll(t *testing.T, ctx context.Context, proxies []*KubeProxy, since time.Time) {
	t.Helper()
	syncs, err := SettleAll(ctx, proxies, since, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range syncs {
		if s.Ended.Before(since) || (!s.Started.IsZero() && s.Started.After(s.Ended)) {
			t.Errorf("%s: settled on %+v, which ended before the write at %v", proxies[i].Node(), s, since)
		}
		t.Logf("%s: settled %s after the write (sync %s)", proxies[i].Node(), s.Ended.Sub(since).Round(time.Millisecond), s.Duration)
	}
}

func readRules(t *testing.T, ns *netns.Namespace, mode cluster.Mode, backend string) string {
	t.Helper()
	var out []byte
	var err error
	switch {
	case mode == cluster.ModeNFTables:
		out, err = ns.Exec("nft", "list", "table", "ip", "kube-proxy")
	case backend == BackendLegacy:
		out, err = ns.Exec("iptables-legacy-save", "-t", "nat")
	default:
		out, err = ns.Exec("iptables-save", "-t", "nat")
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

const sliceName = "web-abc12"

// writeService creates the Service and then its slice, and returns the
// time taken before the slice's write (the last of the batch: Settle's
// since).
func writeService(t *testing.T, ctx context.Context, cs kubernetes.Interface) time.Time {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			ClusterIP: testClusterIP,
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: sliceName, Namespace: "default",
			Labels:      map[string]string{discoveryv1.LabelServiceName: "web"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{endpoint(testEndpoints[0], "node-a")},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	since := time.Now()
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return since
}

func addEndpoint(t *testing.T, ctx context.Context, cs kubernetes.Interface, ip string) {
	t.Helper()
	s, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, sliceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Endpoints = append(s.Endpoints, endpoint(ip, "node-b"))
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().Format(time.RFC3339Nano)
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func endpoint(ip, node string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
		NodeName:   ptr(node),
	}
}

func ptr[T any](v T) *T { return &v }

// checkEarlyExit: a kube-proxy that exits at once (an unknown flag) is an
// error carrying the end of its log.
func checkEarlyExit(t *testing.T, ctx context.Context, cp *ControlPlane, node *netns.Node) {
	t.Helper()
	dir := filepath.Join(netns.RunDir(node.NS.Name[len(netns.Prefix):len(netns.Prefix)+netns.RunIDLen]), "kube-proxy-bad")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// NodeIP 127.0.0.1: the node's running kube-proxy listens on its
	// fabric address, and must not answer for this one.
	k, err := StartKubeProxy(ctx, cp, KubeProxyConfig{
		Node: node.Config.Name, NS: node.NS, NodeIP: netip.MustParseAddr("127.0.0.1"), Mode: cluster.ModeNFTables, Dir: dir,
		ExtraArgs: []string{"--kpsim-no-such-flag"},
	})
	if err == nil {
		k.Close()
		t.Fatal("kube-proxy with an unknown flag started")
	}
	if !strings.Contains(err.Error(), "exited early") || !strings.Contains(err.Error(), "kpsim-no-such-flag") {
		t.Errorf("error %q: want 'exited early' and the log's complaint", err)
	}
}

// TestCleanupKillsUpstream: a run whose owner never closed its processes
// (as after SIGKILL) is cleaned up: netns.Cleanup kills etcd,
// kube-apiserver and kube-proxy inside the run's namespaces and reports
// each, and nothing of the run is left.
func TestCleanupKillsUpstream(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "iptables-save", "nft", "unshare")
	before := hostState(t)
	ctx := context.Background()
	var inodes []uint64
	var pids []int
	t.Cleanup(func() { checkGone(t, before, inodes, pids) })
	topo, cp := startRun(t, ctx)
	for _, ns := range topo.Namespaces() {
		inodes = append(inodes, nsInode(t, ns.Path()))
	}
	n := topo.Nodes()[0]
	dir := filepath.Join(netns.RunDir(topo.RunID()), "kube-proxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	k, err := StartKubeProxy(ctx, cp, KubeProxyConfig{Node: n.Config.Name, NS: n.NS, NodeIP: n.Config.Addr.Addr(), Mode: cluster.ModeIPTables, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	pids = append(pids, k.PID())
	rep, err := netns.Cleanup(netns.CleanupOptions{Prefix: netns.RunPrefix(topo.RunID()), Force: true})
	if err != nil {
		t.Fatal(err)
	}
	killed := map[string]bool{}
	for _, it := range rep.Items {
		if it.Kind == netns.KindProcess && it.Action == netns.ActionRemoved {
			f := strings.Fields(it.Name)
			killed[f[1]] = true
		}
	}
	for _, want := range []string{"etcd", "kube-apiserver", "kube-proxy"} {
		if !killed[want] {
			t.Errorf("cleanup killed %v, not %s: %+v", killed, want, rep.Items)
		}
	}
	if err := k.Close(); err != nil {
		t.Errorf("Close after cleanup: %v", err)
	}
}

// checkPrivateRun: kube-proxy runs in a mount namespace of its own with a
// tmpfs on /run (so /run/xtables.lock is the node's own).
func checkPrivateRun(t *testing.T, pid int) {
	t.Helper()
	var own, its unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &own); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid), &its); err != nil {
		t.Fatal(err)
	}
	if own.Ino == its.Ino {
		t.Errorf("kube-proxy %d shares the test's mount namespace", pid)
	}
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(info), "\n") {
		// mountinfo: ID parent major:minor root mountpoint options ... - fstype source options
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == "/run" && strings.Contains(l, " - tmpfs kpsim-run ") {
			return
		}
	}
	t.Errorf("kube-proxy %d has no kpsim-run tmpfs on /run:\n%s", pid, info)
}

// nsInode is the inode of the namespace bind-mounted at path.
func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// checkGone runs last (the first t.Cleanup registered): no process in the
// run's namespaces or of its kube-proxies is left, and the host is as it
// was.
func checkGone(t *testing.T, before map[string]string, inodes []uint64, pids []int) {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var st unix.Stat_t
		// Our own process is skipped: netns creates namespaces on a thread
		// it never unlocks, and when that thread is the main one the
		// runtime parks it (it cannot exit), still in the namespace.
		if pid, err := strconv.Atoi(e.Name()); err != nil || pid == os.Getpid() {
			continue
		}
		if unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil {
			continue
		}
		for _, ino := range inodes {
			if st.Ino == ino {
				comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
				t.Errorf("process %s (%s) is still in a namespace of the run", e.Name(), strings.TrimSpace(string(comm)))
			}
		}
	}
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil {
			t.Errorf("kube-proxy %d still runs", pid)
		}
	}
	after := hostState(t)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("host %s changed:\nbefore: %s\nafter:  %s", k, v, after[k])
		}
	}
}
