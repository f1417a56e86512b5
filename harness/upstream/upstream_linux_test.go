package upstream

import (
	"bytes"
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
	for _, c := range [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}} {
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
	bin := FindForTest(t)
	id, err := netns.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	topo, err := netns.Build(ctx, testTopology(id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	})
	dir := netns.RunDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cp, err := StartControlPlane(ctx, ControlPlaneConfig{
		NS: topo.ControlPlane(), Addr: testCP.Addr(), Dir: dir, ServiceCIDR: testServiceCIDR, Bin: bin, Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane: %s", strings.TrimSpace(log.String()))
	t.Cleanup(func() {
		if err := cp.Close(); err != nil {
			t.Error(err)
		}
	})
	for _, n := range topo.Nodes() {
		if _, err := RegisterNode(ctx, cp.Client(), n.Config.Name, n.Config.Addr.Addr(), n.Config.PodCIDR); err != nil {
			t.Fatal(err)
		}
	}
	return topo, cp
}

func TestKubeProxyIPTables(t *testing.T) { testKubeProxy(t, cluster.ModeIPTables) }

func TestKubeProxyNFTables(t *testing.T) { testKubeProxy(t, cluster.ModeNFTables) }

// testKubeProxy runs kube-proxy in both nodes against a real apiserver,
// writes a Service and its slice, settles, finds the ClusterIP and the
// endpoint in the rules read back from the node, patches the slice and
// finds the new endpoint; and checks that the host is untouched and no
// process of the run is left.
func testKubeProxy(t *testing.T, mode cluster.Mode) {
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
	}
	if v := proxies[0].Version(); !strings.HasPrefix(v, "v1.") {
		t.Errorf("Version() = %q, want v1.x", v)
	}
	since := time.Now()
	writeService(t, ctx, cp.Client())
	node := topo.Nodes()[0]
	settleAll(t, ctx, proxies, since)
	rules := readRules(t, node.NS, mode)
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
	if rules := readRules(t, node.NS, mode); !strings.Contains(rules, testEndpoints[1]) {
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
	if m.Programming == 0 {
		t.Errorf("network_programming_duration_seconds has no sample after two slice writes with a trigger time: %+v", m)
	}
}

func settleAll(t *testing.T, ctx context.Context, proxies []*KubeProxy, since time.Time) {
	t.Helper()
	for _, k := range proxies {
		s, err := k.Settle(ctx, since, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: settled %s after the write (sync %s)", k.Node(), s.Ended.Sub(since).Round(time.Millisecond), s.Duration)
	}
}

func readRules(t *testing.T, ns *netns.Namespace, mode cluster.Mode) string {
	t.Helper()
	var out []byte
	var err error
	if mode == cluster.ModeNFTables {
		out, err = ns.Exec("nft", "list", "table", "ip", "kube-proxy")
	} else {
		out, err = ns.Exec("iptables-save", "-t", "nat")
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

const sliceName = "web-abc12"

func writeService(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
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
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
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
