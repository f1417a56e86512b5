//go:build clustertest

package cluster_test

// The local cluster end to end, through `sim cluster up|down` (issue 32,
// item 1). Opt-in: make test does not build it (a real cluster per mode,
// about a minute in all here, and root). Run it under the heavy lock, as
// root, after make upstream cluster-tools:
//
//	flock /tmp/kpsim-heavy.lock go test -tags clustertest -count=1 -v -run SimCluster ./harness/cluster/

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/agent"
	"github.com/kpsim/kpsim/harness/cluster"
	"github.com/kpsim/kpsim/harness/testenv"
)

// env is what every subtest uses: the repository, and sim and the agent
// built for this run.
type env struct {
	root, bin, sim, agent string
}

func setup(t *testing.T) *env {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "go", "unshare", "nsenter", "mount", "nft", "iptables", "sysctl", "ip")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, bin: filepath.Join(root, "bin")}
	if missing := cluster.MissingBinaries(e.bin, cluster.ProxyIPTables); len(missing) > 0 {
		testenv.Require(t, false, fmt.Sprintf("missing %s; %s", strings.Join(missing, ", "), cluster.BuildHint))
	}
	tmp := t.TempDir()
	e.sim = filepath.Join(tmp, "sim")
	e.agent = filepath.Join(tmp, "kpsim-agent")
	// The agent is harness/agent's kpsim-agent, built here from this tree
	// (bin/kpsim-agent may be older or absent).
	for _, b := range []struct{ out, pkg string }{{e.sim, "./cmd/sim"}, {e.agent, "./harness/agent/cmd/kpsim-agent"}} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return e
}

// run runs sim with args and returns stdout, stderr and the exit code.
func (e *env) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(e.sim, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("sim %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// upResult is what sim cluster up printed.
type upResult struct {
	id, kubeconfig string
	took           time.Duration
}

var (
	runLine  = regexp.MustCompile(`(?m)^run: ([0-9a-f]{6})$`)
	kcLine   = regexp.MustCompile(`(?m)^kubeconfig: (\S+)$`)
	exportRe = regexp.MustCompile(`(?m)^export KUBECONFIG=(\S+)$`)
)

func (e *env) up(t *testing.T, args ...string) upResult {
	t.Helper()
	start := time.Now()
	out, errOut, code := e.run(t, append([]string{"cluster", "up", "--bin", e.bin, "--agent", e.agent}, args...)...)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("sim cluster up exited %d:\n%s%s", code, out, errOut)
	}
	t.Logf("sim cluster up (%s):\n%s", took.Round(time.Millisecond), out)
	r := upResult{took: took}
	if m := runLine.FindStringSubmatch(out); m != nil {
		r.id = m[1]
	}
	if m := kcLine.FindStringSubmatch(out); m != nil {
		r.kubeconfig = m[1]
	}
	if m := exportRe.FindStringSubmatch(out); m == nil || m[1] != r.kubeconfig || r.id == "" {
		t.Fatalf("sim cluster up printed no run ID, kubeconfig and matching export line:\n%s", out)
	}
	return r
}

func (e *env) down(t *testing.T, id string) time.Duration {
	t.Helper()
	start := time.Now()
	out, errOut, code := e.run(t, "cluster", "down", id)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("sim cluster down %s exited %d:\n%s%s", id, code, out, errOut)
	}
	t.Logf("sim cluster down (%s): %s", took.Round(time.Millisecond), strings.TrimSpace(out))
	return took
}

// snapshot is host-snapshot.sh's record of the host now.
func (e *env) snapshot(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("sh", filepath.Join(e.root, "harness/cluster/host-snapshot.sh"), path).CombinedOutput(); err != nil {
		t.Fatalf("host-snapshot.sh: %v\n%s", err, out)
	}
}

var otherRun = regexp.MustCompile(`kpsim-([0-9a-f]{6})`)

// hostDiff compares two snapshots, leaving out the lines of other runs
// (another session's namespaces and cgroups), and lists the files changed
// since marker outside the places runs write (try.sh's list).
func (e *env) hostDiff(t *testing.T, before, after, marker, id string) {
	t.Helper()
	out, _ := exec.Command("diff", before, after).Output()
	var ours []string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, "<") && !strings.HasPrefix(l, ">") {
			continue
		}
		if m := otherRun.FindStringSubmatch(l); m != nil && m[1] != id {
			continue
		}
		ours = append(ours, l)
	}
	if len(ours) > 0 {
		t.Errorf("the host changed (host-snapshot.sh before and after, other runs' lines left out):\n%s", strings.Join(ours, "\n"))
	}
	find := exec.Command("sh", "-c", `find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp -o -path /work -o -path /root/.cache -o -path /root/.config/go -o -path /root/go \
	-o -path /run/netns -o -path /run/kpsim -o -path /var/cache/apt -o -path /var/lib/apt -o -path /var/lib/dpkg -o -path /var/log \) -prune -o -newer "$1" -print 2>/dev/null`, "find", marker)
	changed, _ := find.Output()
	if s := strings.TrimSpace(string(changed)); s != "" {
		t.Errorf("files changed outside the run's places:\n%s", s)
	}
	if _, err := os.Stat(filepath.Join(netns.MarkerDir, id+".cluster.json")); err == nil {
		t.Errorf("the state file of run %s is still there", id)
	}
}

// TestSimCluster brings a two-node cluster up per proxy mode through sim
// cluster up, uses it from the host's namespace with the kubeconfig printed,
// runs an echo agent pod per node and a prober agent pod, checks a
// ClusterIP Service through the real kube-proxy from each node's namespace
// (a TCP round trip to the echo server) and from the prober pod (a block of
// conform's probes, counted by the echo pods), reaches every agent through
// the apiserver's pods/proxy, and takes it down with sim cluster down; the
// host must be as it was.
func TestSimCluster(t *testing.T) {
	e := setup(t)
	for _, mode := range []string{cluster.ProxyIPTables, cluster.ProxyNFTables} {
		t.Run(mode, func(t *testing.T) { e.serviceRun(t, mode) })
	}
	t.Run("failed-up-leaves-nothing", e.failedUp)
	t.Run("killed-supervisor", e.killedSupervisor)
}

// The workload's names.
const (
	testNS    = "kpsim-e2e"
	echoPort  = 8080
	probes    = 400
	proberPod = "prober"
)

func (e *env) serviceRun(t *testing.T, mode string) {
	dir := t.TempDir()
	before, after, marker := filepath.Join(dir, "before.txt"), filepath.Join(dir, "after.txt"), filepath.Join(dir, "marker")
	e.snapshot(t, before)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // -newer compares whole seconds on some file systems
	r := e.up(t, "--proxy-mode", mode)
	downed := false
	defer func() {
		if !downed {
			e.down(t, r.id)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The kubeconfig from the host's own network namespace (this test
	// process never enters another for these calls).
	rc, err := clientcmd.BuildConfigFromFlags("", r.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list nodes through %s: %v", rc.Host, err)
	}
	var names []string
	for i, n := range nodes.Items {
		names = append(names, n.Name)
		ready := slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		})
		want := cluster.PodCIDR(i).String()
		if !ready || n.Spec.PodCIDR != want || !slices.Equal(n.Spec.PodCIDRs, []string{want}) {
			t.Errorf("node %s: Ready %v, pod CIDRs %q %q, want Ready and %s", n.Name, ready, n.Spec.PodCIDR, n.Spec.PodCIDRs, want)
		}
	}
	if !slices.Equal(names, []string{"node-a", "node-b"}) {
		t.Fatalf("nodes %v, want node-a and node-b", names)
	}
	t.Logf("nodes from the host namespace through %s: %v", rc.Host, names)

	// The agents need NET_RAW, beyond the baseline Pod Security level.
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(testNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(echoPort), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	podStart := time.Now()
	echoArgs := []string{"--ports", fmt.Sprintf("tcp:%d,udp:%d", echoPort, echoPort)}
	for _, node := range names {
		createPod(ctx, t, cs, agentPod("echo-"+node, node, cluster.EchoImage, map[string]string{"app": "echo"}, echoArgs))
	}
	createPod(ctx, t, cs, agentPod(proberPod, "node-a", cluster.ProberImage, nil, nil))
	podIPs := map[string]string{}
	for _, p := range []string{"echo-node-a", "echo-node-b", proberPod} {
		podIPs[p] = waitReady(ctx, t, cs, p)
	}
	t.Logf("three agent pods Ready in %s", time.Since(podStart).Round(time.Millisecond))
	waitEndpoints(ctx, t, cs, "echo", 2)

	// The apiserver reaches each agent (pods/proxy, from the control-plane
	// namespace through its routes to the pod CIDRs).
	client := func(pod string) agent.Client {
		return agent.Client{Do: agent.PodProxyDoer(cs.CoreV1().RESTClient(), testNS, pod, agent.Port)}
	}
	for _, p := range []string{"echo-node-a", "echo-node-b", proberPod} {
		info, err := client(p).Info(ctx)
		wantMode, wantNode := agent.ModeEcho, strings.TrimPrefix(p, "echo-")
		if p == proberPod {
			wantMode, wantNode = agent.ModeProbe, "node-a"
		}
		if err != nil || info.Mode != wantMode || info.Node != wantNode || info.PodIP != podIPs[p] {
			t.Errorf("pods/proxy to %s:%d/v1/info: %+v, %v", p, agent.Port, info, err)
		}
	}

	// The ClusterIP through the real kube-proxy: from each node's own
	// namespace, a TCP round trip to the echo server behind it ...
	for _, node := range names {
		echoFromNode(t, r.id, node, target)
	}
	// ... and from the prober pod on node-a: blocks of conform's probes,
	// which the echo pods count, one of them across on node-b. Small
	// blocks first, until both echo pods count some: a node's kube-proxy
	// programs the second endpoint up to a sync period after the
	// EndpointSlice says ready (iptables mode once sent a whole first
	// block to the one endpoint it had).
	send := func(tag uint32, n int) (map[string]int, int) {
		t.Helper()
		res, err := client(proberPod).Send(ctx, agent.SendRequest{Tag: tag, Proto: "tcp", VIP: target, N: n, Start: 0, Step: 1})
		if err != nil || res.Sent != n {
			t.Fatalf("the prober sent %+v of %d probes to %s: %v", res, n, target, err)
		}
		var byPod map[string]int
		total := 0
		for deadline := time.Now().Add(10 * time.Second); total < n && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			byPod, total = map[string]int{}, 0
			for _, p := range []string{"echo-node-a", "echo-node-b"} {
				c, err := client(p).Counts(ctx, tag)
				if err != nil {
					t.Fatalf("counts of %s: %v", p, err)
				}
				for _, a := range c.Arrivals {
					if a.Client != podIPs[proberPod] || a.Endpoint != net.JoinHostPort(podIPs[p], strconv.Itoa(echoPort)) {
						t.Errorf("%s counted %d probes to %s from %s, want to its own %s:%d from the prober %s",
							p, a.N, a.Endpoint, a.Client, podIPs[p], echoPort, podIPs[proberPod])
					}
					byPod[p] += a.N
					total += a.N
				}
			}
		}
		return byPod, total
	}
	tag := uint32(1)
	for deadline := time.Now().Add(30 * time.Second); ; tag++ {
		byPod, _ := send(tag, 50)
		if byPod["echo-node-a"] > 0 && byPod["echo-node-b"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("50 probes to %s still reach only %v after 30 s", target, byPod)
		}
		time.Sleep(500 * time.Millisecond)
	}
	byPod, total := send(tag+1, probes)
	if total != probes || byPod["echo-node-a"] == 0 || byPod["echo-node-b"] == 0 {
		t.Errorf("%d probes from the prober pod to %s arrived %v (%d), want all %d, on both echo pods", probes, target, byPod, total, probes)
	}
	t.Logf("%d probes from the prober pod (node-a) to %s arrived %v (after %d settling block(s) of 50)", probes, target, byPod, tag)
	t.Logf("memory (RSS) with three agent pods: %s", runMemory(t, r.id))

	downed = true
	took := e.down(t, r.id)
	e.snapshot(t, after)
	e.hostDiff(t, before, after, marker, r.id)
	t.Logf("%s: up %s, down %s", mode, r.took.Round(100*time.Millisecond), took.Round(100*time.Millisecond))
}

// agentPod is an agent's pod as harness/remote makes it: NET_RAW,
// NET_BIND_SERVICE and NET_ADMIN, the node and pod IP from the downward
// API, a readiness probe on /healthz, no API token.
func agentPod(name, node, image string, labels map[string]string, args []string) *corev1.Pod {
	no, yes, root := false, true, int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector:                 map[string]string{"kubernetes.io/hostname": node},
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "agent", Image: image, ImagePullPolicy: corev1.PullNever, Args: args,
				Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
				Ports: []corev1.ContainerPort{{ContainerPort: agent.Port, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(agent.Port)}},
					PeriodSeconds: 1},
				SecurityContext: &corev1.SecurityContext{RunAsUser: &root, AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_RAW", "NET_BIND_SERVICE", "NET_ADMIN"}}},
			}},
		},
	}
}

func createPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, p *corev1.Pod) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		// The namespace's default ServiceAccount appears a moment after
		// the namespace; admission wants it.
		_, err := cs.CoreV1().Pods(testNS).Create(ctx, p, metav1.CreateOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitReady waits until the pod is Running and Ready and returns its IP.
func waitReady(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) string {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		p, err := cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			t.Logf("pod %s Ready on %s, IP %s", name, p.Spec.NodeName, p.Status.PodIP)
			return p.Status.PodIP
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not Running and Ready within 90 s: %v %+v", name, err, p.Status)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func waitEndpoints(ctx context.Context, t *testing.T, cs kubernetes.Interface, svc string, want int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		list, err := cs.DiscoveryV1().EndpointSlices(testNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		ready := 0
		if err == nil {
			for _, s := range list.Items {
				for _, ep := range s.Endpoints {
					if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
						ready++
					}
				}
			}
		}
		if ready == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s has %d ready endpoints, want %d (%v)", svc, ready, want, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// echoFromNode opens a TCP connection to target (ClusterIP:port) from
// inside the node's network namespace and expects its line echoed (the
// echo agent's TCP server), retrying for 30 s while kube-proxy syncs.
func echoFromNode(t *testing.T, id, node, target string) {
	t.Helper()
	nsh, err := netns.Open(netns.NodeName(id, node))
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	line := "hello from " + node + "\n"
	deadline := time.Now().Add(30 * time.Second)
	for {
		var c net.Conn
		err := nsh.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", target, 2*time.Second)
			return err
		})
		got := ""
		if err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err = c.Write([]byte(line)); err == nil {
				got, err = bufio.NewReader(c).ReadString('\n')
			}
			c.Close()
		}
		if err == nil && got == line {
			t.Logf("from node %s's namespace to %s: echoed", node, target)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("from node %s's namespace to %s: %q, %v", node, target, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runMemory sums the resident memory of the run's processes: those in its
// namespaces (control plane, node daemons, kube-proxy) or its cgroup (the
// pods, the shims), and its supervisor, by program.
func runMemory(t *testing.T, id string) string {
	t.Helper()
	type key struct{ dev, ino uint64 }
	nsKeys := map[key]bool{}
	ents, _ := os.ReadDir(netns.NetnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), netns.RunPrefix(id)) {
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join(netns.NetnsDir, e.Name()), &st) == nil {
				nsKeys[key{st.Dev, st.Ino}] = true
			}
		}
	}
	supervisor := 0
	if data, err := os.ReadFile(filepath.Join(netns.MarkerDir, id+".pid")); err == nil {
		supervisor, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	by := map[string]int{}
	total := 0
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		inNS := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && nsKeys[key{st.Dev, st.Ino}]
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if !inNS && !bytes.Contains(cg, []byte("/kpsim-"+id+"/")) && pid != supervisor {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				name := strings.TrimSpace(string(comm))
				if pid == supervisor {
					name = "supervisor (sim)"
				}
				by[name] += kb
				total += kb
			}
		}
		f.Close()
	}
	var parts []string
	for k, v := range by {
		parts = append(parts, fmt.Sprintf("%s %d", k, v/1024))
	}
	slices.Sort(parts)
	return fmt.Sprintf("%d MB (%s)", total/1024, strings.Join(parts, ", "))
}

// failedUp: a cluster that cannot come up in time (--timeout 1s: the
// apiserver alone takes longer) makes up exit 1 with the supervisor's log,
// and leaves nothing behind.
func (e *env) failedUp(t *testing.T) {
	dir := t.TempDir()
	before, after, marker := filepath.Join(dir, "before.txt"), filepath.Join(dir, "after.txt"), filepath.Join(dir, "marker")
	e.snapshot(t, before)
	os.WriteFile(marker, nil, 0o644)
	time.Sleep(time.Second)
	kc := filepath.Join(dir, "kc")
	start := time.Now()
	out, errOut, code := e.run(t, "cluster", "up", "--bin", e.bin, "--timeout", "1s", "--kubeconfig", kc)
	t.Logf("sim cluster up --timeout 1s: exit %d in %s\n%s%s", code, time.Since(start).Round(time.Millisecond), out, errOut)
	m := regexp.MustCompile(`run ([0-9a-f]{6}):`).FindStringSubmatch(errOut)
	if code != 1 || m == nil || !strings.Contains(errOut, "last lines of the supervisor's log") || !strings.Contains(errOut, "did not come up") {
		t.Fatalf("want exit 1, the run ID and the supervisor log's tail")
	}
	if _, err := os.Stat(kc); err == nil {
		t.Error("the kubeconfig was written")
	}
	e.snapshot(t, after)
	e.hostDiff(t, before, after, marker, m[1])
	if _, err := os.Stat(netns.RunDir(m[1])); err == nil {
		t.Errorf("%s is still there", netns.RunDir(m[1]))
	}
}

// killedSupervisor: with its supervisor killed (SIGKILL: no teardown), the
// cluster's nodes live on in the run's cgroup; down cleans up after it and
// the host is as it was.
func (e *env) killedSupervisor(t *testing.T) {
	dir := t.TempDir()
	before, after, marker := filepath.Join(dir, "before.txt"), filepath.Join(dir, "after.txt"), filepath.Join(dir, "marker")
	e.snapshot(t, before)
	os.WriteFile(marker, nil, 0o644)
	time.Sleep(time.Second)
	kc := filepath.Join(dir, "admin.kubeconfig")
	r := e.up(t, "--kubeconfig", kc, "--proxy-mode", cluster.ProxyNone)
	if r.kubeconfig != kc {
		t.Errorf("kubeconfig %s, want %s", r.kubeconfig, kc)
	}
	out, _, _ := e.run(t, "cluster", "list", "-o", "json")
	type row struct {
		RunID string `json:"runID"`
		PID   int    `json:"pid"`
		State string `json:"state"`
		Alive bool   `json:"alive"`
	}
	var rows []row
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("sim cluster list -o json: %v\n%s", err, out)
	}
	i := slices.IndexFunc(rows, func(x row) bool { return x.RunID == r.id })
	if i < 0 || !rows[i].Alive || rows[i].State != "ready" {
		t.Fatalf("sim cluster list: %s", out)
	}
	if err := syscall.Kill(rows[i].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	out, errOut, code := e.run(t, "cluster", "down", r.id)
	if code != 0 || !strings.Contains(out, "cleanup") {
		t.Errorf("sim cluster down after SIGKILL: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("sim cluster down after the supervisor's SIGKILL: %s", strings.TrimSpace(out))
	if _, err := os.Stat(kc); err == nil {
		t.Error("the kubeconfig outside the run folder is still there")
	}
	e.snapshot(t, after)
	e.hostDiff(t, before, after, marker, r.id)
}
