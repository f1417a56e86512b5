package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/cluster"
	simcluster "github.com/kpsim/kpsim/sim/cluster"
)

func init() { extraCommands = append(extraCommands, newCluster) }

// Bounds of sim cluster's waits.
const (
	// downWait is how long down waits for the supervisor to tear the
	// cluster down before it kills it and cleans up itself.
	downWait = 60 * time.Second
	// serveGrace is how long up waits past --timeout: the supervisor's own
	// bound is --timeout, then it tears down what it started.
	serveGrace = 60 * time.Second
	// supervisorLog is the supervisor's output in the run's folder.
	supervisorLog = "supervisor.log"
	// logTail is how many lines of it a failed up prints.
	logTail = 40
)

func newCluster(s Streams) *cobra.Command {
	c := &cobra.Command{
		Use:   "cluster",
		Short: "Run a real local Kubernetes cluster in namespaces (up, down, list)",
		Long: `cluster runs a real local Kubernetes cluster on this machine, inside network
namespaces, mount namespaces and one cgroup that the run creates, with nothing
on the host changed (harness/cluster/README.md): etcd, kube-apiserver,
kube-controller-manager and kube-scheduler in a control-plane namespace; per
node containerd, runc, CNI (ptp, host-local; the pod CIDRs 10.244.i.0/24 set
by the harness), the kubelet and the unmodified kube-proxy. The nodes import
the pause image and, when bin/kpsim-agent exists, the agent's images
kpsim.local/echo:dev and kpsim.local/prober:dev (nothing is pulled).

  sim cluster up      start one, detached (it outlives the command); prints
                      its run ID and an admin kubeconfig usable from here
  sim cluster list    the clusters and their state
  sim cluster down    stop one and remove everything it made

Needs root and the binaries of make upstream cluster-tools in bin/ (exit 3
otherwise).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return &UsageError{Err: errors.New("sim cluster needs a subcommand: up, down or list (see sim cluster --help)")}
		},
	}
	for _, sub := range []*cobra.Command{newClusterUp(s), newClusterDown(s), newClusterList(s), newClusterServe(s)} {
		wrapArgs(sub)
		c.AddCommand(sub)
	}
	return c
}

// clusterFlags are up's flags; serve takes the same ones, plus the run ID.
type clusterFlags struct {
	nodes      string
	proxyMode  string
	kubeconfig string
	timeout    time.Duration
	bin        string
	agent      string
	keepLogs   string
	nodeProxy  string
	faults     []string
	runID      string // serve only
}

func (f *clusterFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.nodes, "nodes", "node-a,node-b", "comma-separated node names (DNS labels)")
	c.Flags().StringVar(&f.proxyMode, "proxy-mode", cluster.ProxyIPTables, "kube-proxy's mode on every node: iptables, nftables, or none (no kube-proxy: for your own node proxy)")
	c.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "where to write the admin kubeconfig (a new file; default RUN-FOLDER/admin.kubeconfig); down removes it")
	c.Flags().DurationVar(&f.timeout, "timeout", 3*time.Minute, "how long the cluster may take to come up")
	c.Flags().StringVar(&f.bin, "bin", "", "folder of the cluster's binaries (default: the folder of this sim, bin/)")
	c.Flags().StringVar(&f.agent, "agent", "", "agent binary packed into the echo and prober images (default BIN/kpsim-agent; skipped when it does not exist)")
	c.Flags().StringVar(&f.keepLogs, "keep-logs", "", "a folder down copies every log of the run into before the run's folder goes")
	c.Flags().StringVar(&f.nodeProxy, "node-proxy", "kube-proxy", "the node proxy on every node: kube-proxy (the unmodified binary) or kpsim (this repository's dataplane, sim proxy, in kube-proxy's place)")
	c.Flags().StringSliceVar(&f.faults, "proxy-fault", nil, "with --node-proxy kpsim: a named fault injected into every node's dataplane (repeatable): "+fmt.Sprint(proxy.FaultNames()))
}

// check validates the flags (usage errors) and makes paths absolute.
func (f *clusterFlags) check() error {
	nodes := f.nodeList()
	if len(nodes) == 0 {
		return &UsageError{Err: errors.New("--nodes names no node")}
	}
	for i, n := range nodes {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return &UsageError{Err: fmt.Errorf("--nodes: %q is not a node name: %s", n, strings.Join(errs, "; "))}
		}
		if slices.Contains(nodes[:i], n) {
			return &UsageError{Err: fmt.Errorf("--nodes names %s twice", n)}
		}
	}
	if !slices.Contains(cluster.ProxyModes, f.proxyMode) {
		return &UsageError{Err: fmt.Errorf("--proxy-mode %q: use %s", f.proxyMode, strings.Join(cluster.ProxyModes, ", "))}
	}
	if f.timeout <= 0 {
		return &UsageError{Err: fmt.Errorf("--timeout %s must be positive", f.timeout)}
	}
	switch {
	case f.nodeProxy != "kube-proxy" && f.nodeProxy != "kpsim":
		return &UsageError{Err: fmt.Errorf("--node-proxy %q: kube-proxy or kpsim", f.nodeProxy)}
	case f.nodeProxy == "kpsim" && f.proxyMode == cluster.ProxyNone:
		return &UsageError{Err: errors.New("--node-proxy kpsim needs --proxy-mode iptables or nftables")}
	case len(f.faults) > 0 && f.nodeProxy != "kpsim":
		return &UsageError{Err: errors.New("--proxy-fault is for --node-proxy kpsim (the unmodified kube-proxy has no faults)")}
	}
	faults, err := proxy.ParseFaults(f.faults)
	if err != nil {
		return &UsageError{Err: err}
	}
	for _, name := range faults.Names() {
		if why := proxy.Fault(name).NotBuilt(simcluster.Mode(f.proxyMode)); why != "" {
			return &UsageError{Err: proxy.NotBuiltError(proxy.Fault(name), simcluster.Mode(f.proxyMode), why)}
		}
	}
	for _, p := range []*string{&f.kubeconfig, &f.bin, &f.agent, &f.keepLogs} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return &UsageError{Err: err}
		}
		*p = abs
	}
	if f.kubeconfig != "" {
		if _, err := os.Lstat(f.kubeconfig); err == nil {
			return &UsageError{Err: fmt.Errorf("--kubeconfig %s exists: name a new file (down removes it)", f.kubeconfig)}
		}
		if st, err := os.Stat(filepath.Dir(f.kubeconfig)); err != nil || !st.IsDir() {
			return &UsageError{Err: fmt.Errorf("--kubeconfig %s: its folder does not exist", f.kubeconfig)}
		}
	}
	if f.agent != "" {
		if st, err := os.Stat(f.agent); err != nil || st.IsDir() {
			return &UsageError{Err: fmt.Errorf("--agent %s: not a file", f.agent)}
		}
	}
	return nil
}

func (f *clusterFlags) nodeList() []string {
	var out []string
	for n := range strings.SplitSeq(f.nodes, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// environment checks what the machine must give (exit 3): root, and the
// binaries in the bin folder (resolved here).
func (f *clusterFlags) environment() error {
	if geteuid() != 0 {
		return &EnvError{Err: errors.New("sim cluster up needs root: it creates network and mount namespaces and a cgroup, and runs containerd and the kubelet in them (nothing on the host is changed)")}
	}
	if f.bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return &EnvError{Err: fmt.Errorf("could not locate the running executable: %w", err)}
		}
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		f.bin = filepath.Dir(exe)
	}
	if missing := cluster.MissingBinaries(f.bin, f.proxyMode); len(missing) > 0 {
		return &EnvError{Err: fmt.Errorf("missing binaries: %s; %s", strings.Join(missing, ", "), cluster.BuildHint)}
	}
	return nil
}

// args is serve's command line for run id.
func (f *clusterFlags) args(id string) []string {
	a := []string{"cluster", "serve", "--run-id=" + id, "--nodes=" + strings.Join(f.nodeList(), ","),
		"--proxy-mode=" + f.proxyMode, "--kubeconfig=" + f.kubeconfig, "--timeout=" + f.timeout.String(), "--bin=" + f.bin}
	if f.agent != "" {
		a = append(a, "--agent="+f.agent)
	}
	if f.keepLogs != "" {
		a = append(a, "--keep-logs="+f.keepLogs)
	}
	if f.nodeProxy != "" && f.nodeProxy != "kube-proxy" {
		a = append(a, "--node-proxy="+f.nodeProxy)
	}
	for _, x := range f.faults {
		a = append(a, "--proxy-fault="+x)
	}
	return a
}

// nodeProxy is the command that runs in kube-proxy's place (nil: the
// unmodified kube-proxy): this sim's proxy subcommand, programming each
// node's namespace from inside it, with the faults.
func (f *clusterFlags) nodeProxyCommand() ([]string, error) {
	if f.nodeProxy != "kpsim" {
		return nil, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("could not locate the running executable for sim proxy: %w", err)
	}
	cmd := []string{exe, "proxy", "--own-netns"}
	for _, x := range f.faults {
		cmd = append(cmd, "--fault="+x)
	}
	return cmd, nil
}

func newClusterUp(s Streams) *cobra.Command {
	var f clusterFlags
	c := &cobra.Command{
		Use:   "up",
		Short: "Start a local cluster that outlives the command",
		Long: `up starts a local cluster and returns once every node is Ready and kube-proxy
has synced on each: a supervisor (this program, re-executed in a session of
its own, its output in RUN-FOLDER/supervisor.log) runs the cluster until sim
cluster down. up prints the run ID, the admin kubeconfig's path and the
export KUBECONFIG line.

The kubeconfig works from this machine's own network namespace without any
route or link added there: its server is https://127.0.0.1:PORT, where the
supervisor forwards each connection to the kube-apiserver inside the run's
control-plane namespace (the serving certificate holds 127.0.0.1).

On failure up prints the end of the supervisor's log, removes everything the
run made, and exits 1. Exit 2 on bad flags, 3 when not root or binaries are
missing.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			if err := f.environment(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return clusterUp(ctx, s, f)
		},
	}
	f.add(c)
	return c
}

// clusterUp starts the supervisor and waits until it says ready or failed.
func clusterUp(ctx context.Context, s Streams, f clusterFlags) error {
	start := time.Now()
	id, err := netns.NewRunID()
	if err != nil {
		return err
	}
	dir := netns.RunDir(id)
	if f.kubeconfig == "" {
		f.kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return &EnvError{Err: err}
	}
	logPath := filepath.Join(dir, supervisorLog)
	// up keeps its descriptor of the log: the run's folder (with the log)
	// goes when a failed supervisor tears down, and up still reads its tail.
	log, err := os.OpenFile(logPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		os.RemoveAll(dir)
		return &EnvError{Err: err}
	}
	defer log.Close()
	exe, err := os.Executable()
	if err != nil {
		os.RemoveAll(dir)
		return &EnvError{Err: err}
	}
	cmd := exec.Command(exe, f.args(id)...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return &EnvError{Err: fmt.Errorf("could not start the cluster's supervisor: %w", err)}
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	fmt.Fprintf(s.Err, "run %s: supervisor %d starting the cluster (log %s)\n", id, cmd.Process.Pid, logPath)

	st, why := waitClusterReady(ctx, id, exited, f.timeout+serveGrace)
	if why == "" {
		fmt.Fprintf(s.Out, "run: %s\nkubeconfig: %s\nnodes: %s (Ready), kube-proxy: %s, agent images: %s\n",
			id, st.Kubeconfig, strings.Join(st.Nodes, ", "), st.ProxyMode, yesNo(st.AgentImages))
		fmt.Fprintf(s.Out, "up in %.1f s (supervisor %d, log %s; sim cluster down %s stops it)\n",
			time.Since(start).Seconds(), st.PID, st.Log, id)
		fmt.Fprintf(s.Out, "export KUBECONFIG=%s\n", st.Kubeconfig)
		return nil
	}
	// Failed: stop the supervisor if it still runs (it tears down what
	// it started), clean up after it if it does not, then report.
	stopped := stopChild(cmd, exited, downWait)
	tail := readTail(log, logTail)
	cleanupErr := cleanupRun(id, &clusterState{RunID: id, Kubeconfig: f.kubeconfig})
	fmt.Fprintf(s.Err, "last lines of the supervisor's log %s:\n%s\n", logPath, tail)
	msg := fmt.Sprintf("the cluster did not come up: %s", why)
	if !stopped {
		msg += fmt.Sprintf("; the supervisor did not stop within %s after SIGTERM and was killed", downWait)
	}
	if cleanupErr != nil {
		return fmt.Errorf("%s; cleaning up: %w", msg, cleanupErr)
	}
	return errors.New(msg + " (everything it made is removed)")
}

// waitClusterReady polls id's state file until it says ready (why "") or
// failed, the supervisor exits, ctx ends or d passes (why says which).
func waitClusterReady(ctx context.Context, id string, exited <-chan struct{}, d time.Duration) (*clusterState, string) {
	deadline := time.After(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := readClusterState(id)
		if err == nil {
			switch st.State {
			case clusterReady:
				return st, ""
			case clusterFailed:
				return st, st.Error
			}
		}
		select {
		case <-exited:
			if st, err := readClusterState(id); err == nil && st.State == clusterFailed {
				return st, st.Error
			}
			return nil, "the supervisor exited before the cluster was ready"
		case <-ctx.Done():
			return nil, "interrupted"
		case <-deadline:
			return nil, fmt.Sprintf("not ready within %s", d)
		case <-tick.C:
		}
	}
}

// stopChild sends SIGTERM to the supervisor up started and waits for it
// (at most d, then SIGKILL). It reports whether SIGTERM sufficed.
func stopChild(cmd *exec.Cmd, exited <-chan struct{}, d time.Duration) bool {
	select {
	case <-exited:
		return true
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return true
	case <-time.After(d):
		cmd.Process.Kill()
		<-exited
		return false
	}
}

// cleanupRun removes whatever run id left (as sim cleanup --prefix
// kpsim-<id>- --force does), then its state file and kubeconfig.
func cleanupRun(id string, st *clusterState) error {
	rep, err := netns.Cleanup(netns.CleanupOptions{Prefix: netns.RunPrefix(id), Force: true})
	if err != nil {
		return err
	}
	var errs []error
	for _, it := range rep.Items {
		if it.Action == netns.ActionFailed {
			errs = append(errs, fmt.Errorf("%s %s: %s", it.Kind, it.Name, it.Error))
		}
	}
	errs = append(errs, removeClusterFiles(st))
	return errors.Join(errs...)
}

// readTail is the last n lines of the file behind f (which may be
// unlinked by now), read without moving its offset.
func readTail(f *os.File, n int) string {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(could not read the log: %v)", err)
	}
	const most = 256 << 10
	off := max(0, fi.Size()-most)
	buf := make([]byte, fi.Size()-off)
	k, _ := f.ReadAt(buf, off)
	lines := strings.Split(strings.TrimRight(string(buf[:k]), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func yesNo(b bool) string {
	if b {
		return "imported"
	}
	return "none (no agent binary)"
}

func newClusterServe(s Streams) *cobra.Command {
	var f clusterFlags
	c := &cobra.Command{
		Use:    "serve",
		Short:  "Run a local cluster until SIGTERM (sim cluster up starts it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if !netns.ValidRunID(f.runID) {
				return &UsageError{Err: fmt.Errorf("--run-id %q is not a run ID", f.runID)}
			}
			if f.kubeconfig == "" || f.bin == "" {
				return &UsageError{Err: errors.New("serve needs --kubeconfig and --bin (sim cluster up passes them)")}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return clusterServe(ctx, s.Err, f)
		},
	}
	f.add(c)
	c.Flags().StringVar(&f.runID, "run-id", "", "the run's ID (sim cluster up draws it)")
	return c
}

// clusterServe is the supervisor: it brings the cluster up, forwards the
// apiserver to 127.0.0.1, writes the kubeconfig and the state file, and
// holds until ctx ends (SIGTERM, SIGINT), then tears everything down and
// removes the state file last.
func clusterServe(ctx context.Context, log io.Writer, f clusterFlags) (err error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
	st := &clusterState{RunID: f.runID, PID: os.Getpid(), State: clusterStarting, Kubeconfig: f.kubeconfig,
		Nodes: f.nodeList(), ProxyMode: f.proxyMode, NodeProxy: f.nodeProxy, Faults: f.faults, Log: filepath.Join(netns.RunDir(f.runID), supervisorLog), Started: time.Now()}
	if err := st.write(); err != nil {
		return err
	}
	fail := func(err error) error {
		logf("failed: %v", err)
		st.State, st.Error = clusterFailed, err.Error()
		if werr := st.write(); werr != nil {
			logf("%v", werr)
		}
		return err
	}
	logf("supervisor %d: run %s, nodes %s, proxy mode %s", st.PID, st.RunID, strings.Join(st.Nodes, ","), st.ProxyMode)
	upCtx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	start := time.Now()
	np, err := f.nodeProxyCommand()
	if err != nil {
		return fail(err)
	}
	c, err := cluster.Up(upCtx, cluster.Config{Bin: f.bin, Nodes: st.Nodes, RunID: st.RunID, ProxyMode: st.ProxyMode, NodeProxy: np,
		Agent: f.agent, Log: timestamped{log}, KeepLogs: f.keepLogs})
	if err != nil {
		return fail(err)
	}
	took := time.Since(start)
	fwd, err := c.ForwardAPI("127.0.0.1:0")
	if err == nil {
		err = writeNew(f.kubeconfig, c.AdminKubeconfig(fwd.Server()))
	}
	if err != nil {
		if fwd != nil {
			fwd.Close()
		}
		return fail(errors.Join(err, c.Close()))
	}
	mem := c.Memory()
	st.State, st.Server, st.AgentImages = clusterReady, fwd.Server(), c.AgentImages()
	st.UpSeconds, st.MemoryMB = took.Seconds(), mem.Total()/1024
	if err := st.write(); err != nil {
		fwd.Close()
		os.Remove(f.kubeconfig)
		return fail(errors.Join(err, c.Close()))
	}
	logf("ready in %s: apiserver forwarded at %s, kubeconfig %s", took.Round(time.Millisecond), fwd.Server(), f.kubeconfig)
	logf("memory (RSS): %s", mem)

	<-ctx.Done()
	t := time.Now()
	logf("stopping: %v", context.Cause(ctx))
	st.State = clusterStopping
	st.write()
	errs := []error{fwd.Close(), c.Close()}
	if err := os.Remove(f.kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		// Keep the state file: the run is a dead one with leftovers now,
		// which sim cleanup (or down's fallback) removes.
		logf("teardown: %v", err)
		st.State, st.Error = clusterFailed, "teardown: "+err.Error()
		st.write()
		return err
	}
	logf("down in %s", time.Since(t).Round(time.Millisecond))
	return os.Remove(clusterStatePath(st.RunID))
}

// timestamped prefixes each write (a progress line of cluster.Up) with the
// time of day.
type timestamped struct{ w io.Writer }

func (t timestamped) Write(p []byte) (int, error) {
	if _, err := fmt.Fprintf(t.w, "%s %s", time.Now().Format("15:04:05.000"), p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeNew writes data to a new file (0600), never over an existing one.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("could not write the kubeconfig: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("could not write the kubeconfig: %w", err)
	}
	return nil
}

func newClusterDown(s Streams) *cobra.Command {
	c := &cobra.Command{
		Use:   "down [RUN-ID]",
		Short: "Stop a local cluster and remove everything it made",
		Long: `down stops the cluster RUN-ID (without one: the only running cluster; exit 2
when there are several or none): SIGTERM to its supervisor, which stops
kube-proxy, the nodes (every process in the run's cgroup), the controllers and
the control plane, and removes the cgroups, namespaces, the run's folder, the
kubeconfig and its state file. When the supervisor has not finished within 60
s it is killed and down removes what is left itself, as sim cleanup does.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 1 && !netns.ValidRunID(args[0]) {
				return &UsageError{Err: fmt.Errorf("%q is not a run ID (6 hex characters: sim cluster list)", args[0])}
			}
			if geteuid() != 0 {
				return &EnvError{Err: errors.New("sim cluster down needs root: it stops a cluster's processes and removes its namespaces and cgroups")}
			}
			st, err := pickCluster(args)
			if err != nil {
				return err
			}
			return clusterDown(s, st)
		},
	}
	return c
}

// pickCluster is the state of the cluster named in args, or of the only
// running one.
func pickCluster(args []string) (*clusterState, error) {
	states, err := listClusterStates()
	if err != nil {
		return nil, &EnvError{Err: err}
	}
	if len(args) == 1 {
		for _, st := range states {
			if st.RunID == args[0] {
				return st, nil
			}
		}
		return nil, &UsageError{Err: fmt.Errorf("no cluster %s (sim cluster list shows them)", args[0])}
	}
	var alive []string
	var pick *clusterState
	for _, st := range states {
		if supervisorAlive(st) {
			alive = append(alive, st.RunID)
			pick = st
		}
	}
	switch len(alive) {
	case 1:
		return pick, nil
	case 0:
		msg := "no cluster is running"
		if len(states) > 0 {
			msg += fmt.Sprintf(" (%d dead one(s) left state: sim cluster down RUN-ID or sim cleanup removes them)", len(states))
		}
		return nil, &UsageError{Err: errors.New(msg)}
	}
	return nil, &UsageError{Err: fmt.Errorf("%d clusters are running (%s): name one", len(alive), strings.Join(alive, ", "))}
}

// clusterDown stops st's supervisor and waits for its teardown, falling
// back to removing what the run left itself.
func clusterDown(s Streams, st *clusterState) error {
	start := time.Now()
	how := "supervisor"
	if supervisorAlive(st) {
		fmt.Fprintf(s.Err, "run %s: SIGTERM to supervisor %d\n", st.RunID, st.PID)
		if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("could not signal the supervisor %d: %w", st.PID, err)
		}
		if !waitGone(st, downWait) {
			fmt.Fprintf(s.Err, "run %s: the supervisor still runs after %s: killing it and cleaning up\n", st.RunID, downWait)
			syscall.Kill(st.PID, syscall.SIGKILL)
			waitGone(st, 10*time.Second)
			how = "supervisor killed, cleanup"
		}
	} else {
		how = "supervisor dead, cleanup"
	}
	// A supervisor that finished its teardown removed its state file last.
	if _, err := os.Stat(clusterStatePath(st.RunID)); err == nil || how != "supervisor" {
		if how == "supervisor" {
			how = "supervisor, then cleanup"
		}
		if err := cleanupRun(st.RunID, st); err != nil {
			return fmt.Errorf("could not remove everything run %s left: %w", st.RunID, err)
		}
	}
	fmt.Fprintf(s.Out, "run %s down in %.1f s (%s)\n", st.RunID, time.Since(start).Seconds(), how)
	return nil
}

func newClusterList(s Streams) *cobra.Command {
	var o outputFlag
	c := &cobra.Command{
		Use:   "list",
		Short: "List the local clusters (running, starting, or dead with leftovers)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			states, err := listClusterStates()
			if err != nil {
				return &EnvError{Err: err}
			}
			type row struct {
				*clusterState
				Alive bool `json:"alive"`
			}
			rows := make([]row, 0, len(states))
			for _, st := range states {
				rows = append(rows, row{st, supervisorAlive(st)})
			}
			if o.format == "json" {
				return writeJSON(s.Out, rows)
			}
			if len(rows) == 0 {
				fmt.Fprintln(s.Out, "no local cluster")
				return nil
			}
			w := tabwriter.NewWriter(s.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "RUN\tSTATE\tSUPERVISOR\tNODES\tPROXY\tSTARTED\tKUBECONFIG")
			for _, r := range rows {
				state := r.State
				if !r.Alive {
					state += " (supervisor dead: sim cluster down " + r.RunID + ")"
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.RunID, state, r.PID, strings.Join(r.Nodes, ","), r.ProxyMode,
					r.Started.Local().Format("2006-01-02 15:04:05"), r.Kubeconfig)
			}
			return w.Flush()
		},
	}
	o.add(c)
	return c
}
