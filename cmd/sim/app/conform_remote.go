package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kpsim/kpsim/harness/conform"
	"github.com/kpsim/kpsim/harness/remote"
	"github.com/kpsim/kpsim/harness/report"
)

// remoteFlags are sim conform's flags for a run on a cluster.
type remoteFlags struct {
	kubeconfig string
	nodeMap    []string
	images     []string
	pull       string
	settle     time.Duration
	ready      time.Duration
	rejectGap  time.Duration
	printRBAC  bool
}

func (r *remoteFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&r.kubeconfig, "kubeconfig", "", "run on the cluster of this kubeconfig instead of in namespaces here (no root needed): echo pods per endpoint, a prober DaemonSet, the scenario's Services with EndpointSlices the run owns, all in namespaces kpsim-<run>-* removed afterwards; --mode names the cluster's proxy mode (iptables or nftables)")
	c.Flags().StringSliceVar(&r.nodeMap, "node-map", nil, "with --kubeconfig: scenario node=cluster node (repeatable; default: the same names when the cluster has them all, else the scenario's nodes sorted onto the cluster's Ready nodes sorted)")
	c.Flags().StringSliceVar(&r.images, "image", nil, "with --kubeconfig: echo=IMAGE or prober=IMAGE, the agents' images (default "+remote.DefaultEchoImage+" and "+remote.DefaultProberImage+", imported on sim cluster's nodes; push harness/agent's kpsim-agent to your registry for another cluster)")
	c.Flags().StringVar(&r.pull, "image-pull-policy", string(corev1.PullIfNotPresent), "with --kubeconfig: the agents' imagePullPolicy (Always, IfNotPresent, Never)")
	c.Flags().DurationVar(&r.settle, "settle", 3*time.Second, "with --kubeconfig: the time a change is given to reach every node's proxy before probing (after the deploy and after each timeline step); nothing on a cluster says when a node proxy has synced")
	c.Flags().DurationVar(&r.rejectGap, "reject-interval", conform.DefaultRejectInterval, "with --kubeconfig: the gap between the probes of a check whose every probe should be rejected: a node sends a client at most one ICMP error a second after a burst of six (net.ipv4.icmp_ratelimit, 1000 ms by default), and faster probes would read its silence as drops; such a check then sends "+fmt.Sprint(conform.PacedRejectProbes)+" probes. 0: no pacing and the namespace run's count, for nodes whose limit is lifted (sysctl net.ipv4.icmp_ratelimit=0)")
	c.Flags().DurationVar(&r.ready, "ready-timeout", 3*time.Minute, "with --kubeconfig: bound on the wait for the agent pods (a pod that is not Ready by then is named with its node and reason)")
	c.Flags().BoolVar(&r.printRBAC, "print-rbac", false, "print the ClusterRole a --kubeconfig run needs and exit")
}

// options turns the flags into conform.RemoteOptions (bad values: usage).
func (r *remoteFlags) options() (conform.RemoteOptions, error) {
	var ro conform.RemoteOptions
	for _, kv := range r.nodeMap {
		from, to, ok := strings.Cut(kv, "=")
		if !ok || from == "" || to == "" {
			return ro, &UsageError{Err: fmt.Errorf("--node-map %q: want SCENARIO-NODE=CLUSTER-NODE", kv)}
		}
		if ro.Nodes == nil {
			ro.Nodes = map[string]string{}
		}
		if _, dup := ro.Nodes[from]; dup {
			return ro, &UsageError{Err: fmt.Errorf("--node-map names %s twice", from)}
		}
		ro.Nodes[from] = to
	}
	for _, kv := range r.images {
		role, img, ok := strings.Cut(kv, "=")
		switch {
		case !ok || img == "":
			return ro, &UsageError{Err: fmt.Errorf("--image %q: want echo=IMAGE or prober=IMAGE", kv)}
		case role == "echo":
			ro.EchoImage = img
		case role == "prober":
			ro.ProberImage = img
		default:
			return ro, &UsageError{Err: fmt.Errorf("--image %q: the agents are echo and prober", kv)}
		}
	}
	switch p := corev1.PullPolicy(r.pull); p {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
		ro.PullPolicy = p
	default:
		return ro, &UsageError{Err: fmt.Errorf("--image-pull-policy %q: Always, IfNotPresent or Never", r.pull)}
	}
	if r.settle < 0 || r.ready <= 0 || r.rejectGap < 0 {
		return ro, &UsageError{Err: errors.New("--settle and --reject-interval must be >= 0 and --ready-timeout > 0")}
	}
	ro.Settle, ro.Ready, ro.RejectInterval = r.settle, r.ready, r.rejectGap
	if ro.Settle == 0 {
		ro.Settle = time.Nanosecond // conform's default applies to 0
	}
	return ro, nil
}

// onlyLocal lists the flags that make no sense with --kubeconfig.
func (f *conformFlags) remoteConflicts(c *cobra.Command, ck *checkerFlags) error {
	if f.remote.kubeconfig == "" {
		for _, name := range []string{"node-map", "image", "image-pull-policy", "settle", "ready-timeout", "reject-interval"} {
			if c.Flags().Changed(name) {
				return &UsageError{Err: fmt.Errorf("--%s is for --kubeconfig", name)}
			}
		}
		return nil
	}
	for _, name := range []string{"vm", "subject", "kube-proxy", "dump", "fault", "iptables-backend", "affinity", "layout"} {
		if c.Flags().Changed(name) {
			return &UsageError{Err: fmt.Errorf("--%s cannot be used with --kubeconfig: the proxy under test is the cluster's own", name)}
		}
	}
	if ck.calibrate > 0 || ck.repeat > 0 {
		return &UsageError{Err: errors.New("--calibrate and --repeat cannot be used with --kubeconfig")}
	}
	return nil
}

// kubeClient loads a kubeconfig (bad file: usage).
func kubeClient(path string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("--kubeconfig %s: %w", path, err)}
	}
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("--kubeconfig %s: %w", path, err)}
	}
	return client, nil
}

// remoteRun runs the scenarios on the kubeconfig's cluster; conformRun
// reports an environment error as for a run here.
func (f *conformFlags) remoteRun(ctx context.Context, files []string, o conform.Options) (*report.Run, error) {
	ro, err := f.remote.options()
	if err != nil {
		return nil, err
	}
	if ro.Client, err = kubeClient(f.remote.kubeconfig); err != nil {
		return nil, err
	}
	run, err := conform.RunRemote(ctx, files, o, ro)
	var env *conform.EnvironmentError
	if run == nil && err != nil && !errors.As(err, &env) {
		return nil, &UsageError{Err: err} // bad input: the scenarios, --mode, a fault
	}
	return run, err
}
