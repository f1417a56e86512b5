package app

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/cluster"
)

func runCluster(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(append([]string{"cluster"}, args...), Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

// asUser runs the test as uid (geteuid replaced).
func asUser(t *testing.T, uid int) {
	old := geteuid
	geteuid = func() int { return uid }
	t.Cleanup(func() { geteuid = old })
}

// stateDir points the state files at a fresh folder.
func stateDir(t *testing.T) string {
	old := clusterStateDir
	clusterStateDir = t.TempDir()
	t.Cleanup(func() { clusterStateDir = old })
	return clusterStateDir
}

func TestClusterUsage(t *testing.T) {
	asUser(t, 0)
	existing := filepath.Join(t.TempDir(), "kc")
	os.WriteFile(existing, nil, 0o600)
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"up", "extra"},
		{"up", "--nodes", ""},
		{"up", "--nodes", "Node_A"},
		{"up", "--nodes", "node-a,node-a"},
		{"up", "--proxy-mode", "ipvs"},
		{"up", "--timeout", "0s"},
		{"up", "--kubeconfig", existing},
		{"up", "--kubeconfig", "/nonexistent-kpsim/kc"},
		{"up", "--agent", "/nonexistent-kpsim/agent"},
		{"down", "not-an-id"},
		{"down", "abc123", "def456"},
		{"list", "-o", "xml"},
	} {
		if code, _, errs := runCluster(args...); code != ExitBadInput {
			t.Errorf("sim cluster %v: exit %d, want %d (stderr %q)", args, code, ExitBadInput, errs)
		}
	}
}

func TestClusterEnvironment(t *testing.T) {
	asUser(t, 1000)
	for _, sub := range []string{"up", "down"} {
		if code, _, errs := runCluster(sub); code != ExitEnvironment || !strings.Contains(errs, "needs root") {
			t.Errorf("sim cluster %s as non-root: exit %d, stderr %q", sub, code, errs)
		}
	}
	asUser(t, 0)
	code, _, errs := runCluster("up", "--bin", t.TempDir())
	if code != ExitEnvironment || !strings.Contains(errs, "make upstream cluster-tools") || !strings.Contains(errs, "kubelet") {
		t.Errorf("sim cluster up without binaries: exit %d, stderr %q", code, errs)
	}
}

func TestClusterServeArgs(t *testing.T) {
	f := clusterFlags{nodes: " node-a, node-b ,", proxyMode: "nftables", kubeconfig: "/k", timeout: time.Minute, bin: "/b"}
	got := strings.Join(f.args("abc123"), " ")
	want := "cluster serve --run-id=abc123 --nodes=node-a,node-b --proxy-mode=nftables --kubeconfig=/k --timeout=1m0s --bin=/b"
	if got != want {
		t.Errorf("args:\n got %s\nwant %s", got, want)
	}
	f.nodeProxy, f.faults = "kpsim", []string{"uniform-probability"}
	if got, want := strings.Join(f.args("abc123"), " "), want+" --node-proxy=kpsim --proxy-fault=uniform-probability"; got != want {
		t.Errorf("args with our node proxy:\n got %s\nwant %s", got, want)
	}
}

func TestClusterNodeProxyFlags(t *testing.T) {
	base := clusterFlags{nodes: "node-a", proxyMode: "iptables", timeout: time.Minute, nodeProxy: "kube-proxy"}
	for _, c := range []struct {
		edit func(*clusterFlags)
		want string
	}{
		{func(f *clusterFlags) { f.nodeProxy = "cilium" }, `--node-proxy "cilium"`},
		{func(f *clusterFlags) { f.nodeProxy, f.proxyMode = "kpsim", "none" }, "needs --proxy-mode iptables or nftables"},
		{func(f *clusterFlags) { f.faults = []string{"uniform-probability"} }, "--proxy-fault is for --node-proxy kpsim"},
		{func(f *clusterFlags) { f.nodeProxy, f.faults = "kpsim", []string{"no-such-fault"} }, "no-such-fault"},
		{func(f *clusterFlags) { f.nodeProxy, f.faults = "kpsim", []string{"uniform-probability"} }, ""},
	} {
		f := base
		c.edit(&f)
		err := f.check()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", f, err, c.want)
		}
	}
}

// fakeSupervisor starts a process whose command line is a supervisor's
// (`sh -c ... cluster serve --run-id=ID`) and returns its PID.
func fakeSupervisor(t *testing.T, id string) int {
	cmd := exec.Command("sh", "-c", "sleep 60; :", "cluster", "serve", "--run-id="+id)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

// deadPID is the PID of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestClusterStateFiles(t *testing.T) {
	stateDir(t)
	kcDir := t.TempDir()
	live := &clusterState{RunID: "aaaaaa", PID: fakeSupervisor(t, "aaaaaa"), State: clusterReady, Nodes: []string{"node-a"},
		ProxyMode: "iptables", Kubeconfig: "/tmp/kpsim-aaaaaa/admin.kubeconfig", Started: time.Now()}
	deadKC := filepath.Join(kcDir, "dead.kubeconfig")
	dead := &clusterState{RunID: "bbbbbb", PID: deadPID(t), State: clusterReady, Nodes: []string{"node-a", "node-b"},
		ProxyMode: "nftables", Kubeconfig: deadKC, Started: time.Now()}
	os.WriteFile(deadKC, []byte("current-context: "+cluster.ContextName("bbbbbb")+"\n"), 0o600)
	other := &clusterState{RunID: "cccccc", PID: os.Getpid(), State: clusterReady} // alive, but not a supervisor
	for _, st := range []*clusterState{live, dead, other} {
		if err := st.write(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readClusterState("aaaaaa")
	if err != nil || got.PID != live.PID || got.ProxyMode != "iptables" {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if !supervisorAlive(live) || supervisorAlive(dead) || supervisorAlive(other) {
		t.Errorf("alive: live %v, dead %v, other %v; want true, false, false", supervisorAlive(live), supervisorAlive(dead), supervisorAlive(other))
	}

	code, out, _ := runCluster("list")
	if code != ExitOK || !strings.Contains(out, "aaaaaa  ready  ") || !strings.Contains(out, "bbbbbb  ready (supervisor dead") {
		t.Errorf("list: exit %d\n%s", code, out)
	}
	code, out, _ = runCluster("list", "-o", "json")
	var rows []map[string]any
	if code != ExitOK || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 3 || rows[0]["alive"] != true || rows[1]["alive"] != false {
		t.Errorf("list -o json: exit %d\n%s", code, out)
	}

	// down without an ID picks the only live supervisor: aaaaaa. Here
	// two look alive to pickCluster only when both are supervisors.
	st, err := pickCluster(nil)
	if err != nil || st.RunID != "aaaaaa" {
		t.Errorf("pickCluster() = %v, %v; want aaaaaa", st, err)
	}
	second := &clusterState{RunID: "dddddd", PID: fakeSupervisor(t, "dddddd"), State: clusterStarting}
	second.write()
	if _, err := pickCluster(nil); err == nil || ExitCode(err) != ExitBadInput || !strings.Contains(err.Error(), "2 clusters are running") {
		t.Errorf("pickCluster() with two running: %v", err)
	}
	os.Remove(clusterStatePath("dddddd"))
	if _, err := pickCluster([]string{"eeeeee"}); err == nil || ExitCode(err) != ExitBadInput {
		t.Errorf("pickCluster(eeeeee) = %v, want a usage error", err)
	}

	// sim cleanup's part: the dead supervisor's file goes, with the
	// kubeconfig it wrote outside its run folder; the live one stays.
	items, err := cleanupClusterStates(netns.Prefix, false, true)
	if err != nil || len(items) != 3 {
		t.Fatalf("dry run: %+v, %v", items, err)
	}
	if _, err := os.Stat(clusterStatePath("bbbbbb")); err != nil {
		t.Error("a dry run removed a state file")
	}
	items, err = cleanupClusterStates(netns.RunPrefix("bbbbbb"), false, false)
	if err != nil || len(items) != 1 || items[0].Action != netns.ActionRemoved || items[0].Kind != KindClusterState {
		t.Fatalf("cleanup of bbbbbb: %+v, %v", items, err)
	}
	if _, err := os.Stat(clusterStatePath("bbbbbb")); err == nil {
		t.Error("the dead supervisor's state file is still there")
	}
	if _, err := os.Stat(deadKC); err == nil {
		t.Error("the dead supervisor's kubeconfig is still there")
	}
	items, _ = cleanupClusterStates(netns.RunPrefix("aaaaaa"), false, false)
	if len(items) != 1 || items[0].Action != netns.ActionSkipped {
		t.Errorf("cleanup of the live aaaaaa: %+v", items)
	}
}

// TestRemoveClusterFilesKeepsForeignKubeconfig: a file at the recorded
// kubeconfig path that is not the run's (replaced since) stays.
func TestRemoveClusterFilesKeepsForeignKubeconfig(t *testing.T) {
	stateDir(t)
	kc := filepath.Join(t.TempDir(), "config")
	os.WriteFile(kc, []byte("current-context: mine\n"), 0o600)
	st := &clusterState{RunID: "abcdef", Kubeconfig: kc}
	st.write()
	if err := removeClusterFiles(st); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kc); err != nil {
		t.Error("a kubeconfig that is not the run's was removed")
	}
	if _, err := os.Stat(clusterStatePath("abcdef")); err == nil {
		t.Error("the state file is still there")
	}
}

func TestReadTail(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 50 {
		f.WriteString(strings.Repeat("x", i) + "\n")
	}
	os.Remove(f.Name()) // up reads the log of a run whose folder is gone
	got := readTail(f, 3)
	if want := strings.Repeat("x", 47) + "\n" + strings.Repeat("x", 48) + "\n" + strings.Repeat("x", 49); got != want {
		t.Errorf("readTail = %q", got)
	}
}
