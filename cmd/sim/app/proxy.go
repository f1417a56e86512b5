package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/backends"
	"github.com/kpsim/kpsim/dataplane/conntrack"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
)

func init() { extraCommands = append(extraCommands, newProxy) }

type proxyFlags struct {
	kubeconfig    string
	hostname      string
	mode          string
	clusterCIDR   string
	masqueradeAll bool
	minSync       time.Duration
	sync          time.Duration
	faults        []string
	netns         string
	ownNS         bool
	// accepted for kube-proxy's command lines, not used
	v          int
	bind       string
	healthzBA  string
	metricsBA  string
	conntrackP int32
}

func newProxy(s Streams) *cobra.Command {
	var f proxyFlags
	c := &cobra.Command{
		Use:   "proxy --kubeconfig FILE --hostname-override NODE",
		Short: "Run kpsim's dataplane as a node's proxy, in kube-proxy's place (root)",
		Long: `proxy is a drop-in for kube-proxy on a test cluster's node: it takes
kube-proxy's main flags, watches the cluster's API server (Services,
EndpointSlices, Nodes) and programs this repository's iptables, nftables or
IPVS dataplane for the node, with kube-proxy's health check node ports and
/healthz, and its conntrack cleanup. With --fault it injects a named fault,
so that a conformance run on the cluster (sim conform --kubeconfig) can be
shown to catch it.

It programs a named network namespace (--netns, e.g. a node of sim cluster
up: kpsim-RUNID-node-a), or, only when asked with --own-netns, the one it
runs in: the node's own netfilter, as kube-proxy does (sim cluster up
--node-proxy kpsim starts it so inside each node's namespace). With
--metrics-bind-address it serves kube-proxy's sync metrics there. It leaves
its rules on exit, as kube-proxy does. Runs until SIGINT or SIGTERM.

Exit 2 for bad flags, 3 when it cannot run here (not root, the API server
unreachable, the node unknown), 1 when its sync loop fails.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return runProxy(c, s, &f) },
	}
	c.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "the kubeconfig of the cluster whose API server to watch (required)")
	c.Flags().StringVar(&f.hostname, "hostname-override", "", "the node's name (default: the host name)")
	c.Flags().StringVar(&f.mode, "proxy-mode", "iptables", "iptables, nftables or ipvs")
	c.Flags().StringVar(&f.clusterCIDR, "cluster-cidr", "", "the pods' CIDR: traffic from outside it to a cluster IP is masqueraded")
	c.Flags().BoolVar(&f.masqueradeAll, "masquerade-all", false, "masquerade all traffic to cluster IPs")
	c.Flags().DurationVar(&f.minSync, "iptables-min-sync-period", time.Second, "the least time between two syncs")
	c.Flags().DurationVar(&f.sync, "iptables-sync-period", 30*time.Second, "the retry interval after a failed sync (and the health timeout's half)")
	c.Flags().StringSliceVar(&f.faults, "fault", nil, "inject a named fault (repeatable): "+fmt.Sprint(proxy.FaultNames()))
	c.Flags().StringVar(&f.netns, "netns", "", "program this named network namespace (under /run/netns)")
	c.Flags().BoolVar(&f.ownNS, "own-netns", false, "program the network namespace sim runs in (a node's own: on a real node, the host's)")
	c.Flags().IntVar(&f.v, "v", 0, "accepted for kube-proxy's command lines (log level; unused)")
	c.Flags().StringVar(&f.bind, "bind-address", "", "accepted for kube-proxy's command lines (unused)")
	c.Flags().StringVar(&f.healthzBA, "healthz-bind-address", "", "accepted for kube-proxy's command lines (/healthz is served on the node address, port 10256)")
	c.Flags().StringVar(&f.metricsBA, "metrics-bind-address", "", "ADDRESS:PORT (in the programmed namespace) to serve kube-proxy's sync metrics on, /metrics")
	c.Flags().Int32Var(&f.conntrackP, "conntrack-max-per-core", 0, "accepted for kube-proxy's command lines (the conntrack table's size is left alone)")
	return c
}

// proxyArgs are sim proxy's flags, parsed.
type proxyArgs struct {
	mode    cluster.Mode
	faults  proxy.Faults
	metrics netip.AddrPort // invalid: no metrics server
	cidr    netip.Prefix
}

// parse checks the flags (usage errors) and fills the host name when it
// is not given.
func (f *proxyFlags) parse() (proxyArgs, error) {
	var a proxyArgs
	a.mode = cluster.Mode(f.mode)
	if !a.mode.Valid() {
		return a, &UsageError{Err: fmt.Errorf("--proxy-mode %q: %s", f.mode, cluster.ModeList())}
	}
	var err error
	if a.faults, err = proxy.ParseFaults(f.faults); err != nil {
		return a, &UsageError{Err: err}
	}
	for _, name := range a.faults.Names() {
		if why := proxy.Fault(name).NotBuilt(a.mode); why != "" {
			return a, &UsageError{Err: proxy.NotBuiltError(proxy.Fault(name), a.mode, why)}
		}
	}
	if f.kubeconfig == "" {
		return a, &UsageError{Err: errors.New("--kubeconfig is required")}
	}
	if (f.netns == "") == !f.ownNS {
		return a, &UsageError{Err: errors.New("give exactly one of --netns NAME (a namespace to program) and --own-netns (the one sim runs in)")}
	}
	if f.metricsBA != "" {
		if a.metrics, err = netip.ParseAddrPort(f.metricsBA); err != nil {
			return a, &UsageError{Err: fmt.Errorf("--metrics-bind-address: %w", err)}
		}
	}
	if f.clusterCIDR != "" {
		if a.cidr, err = netip.ParsePrefix(f.clusterCIDR); err != nil {
			return a, &UsageError{Err: fmt.Errorf("--cluster-cidr: %w", err)}
		}
	}
	if f.minSync < 0 || f.sync <= 0 {
		return a, &UsageError{Err: errors.New("--iptables-min-sync-period must be >= 0 and --iptables-sync-period > 0")}
	}
	if f.hostname == "" {
		if f.hostname, err = os.Hostname(); err != nil {
			return a, &EnvError{Err: fmt.Errorf("no --hostname-override and no host name: %w", err)}
		}
	}
	return a, nil
}

func runProxy(c *cobra.Command, s Streams, f *proxyFlags) error {
	a, err := f.parse()
	if err != nil {
		return err
	}
	client, err := kubeClient(f.kubeconfig)
	if err != nil {
		return err
	}
	if geteuid() != 0 {
		return &EnvError{Err: errors.New("sim proxy needs root: it programs netfilter")}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nodeIP, err := nodeInternalIP(ctx, client, f.hostname)
	if err != nil {
		return err
	}
	var ns *netns.Namespace
	if f.ownNS {
		ns, err = netns.Current("own-" + f.hostname)
	} else {
		ns, err = netns.Open(f.netns)
	}
	if err != nil {
		return &EnvError{Err: err}
	}
	defer ns.Close()
	api, err := apiserver.Connect(client)
	if err != nil {
		return err
	}
	tr, err := api.AddTracker()
	if err != nil {
		return err
	}
	if err := api.Start(ctx, apiserver.SyncTimeout); err != nil {
		return &EnvError{Err: fmt.Errorf("the API server's objects: %w", err)}
	}
	defer api.Stop()
	cfg := dataplane.NodeConfig{NodeName: f.hostname, ClusterCIDR: a.cidr, NodeIPs: []netip.Addr{nodeIP}, MasqueradeAll: f.masqueradeAll, Faults: a.faults}
	b, err := backends.New(a.mode, ns, cfg, backends.Options{NodeIPs: []netip.Addr{nodeIP}})
	if err != nil {
		return &EnvError{Err: err}
	}
	if cl, ok := b.(io.Closer); ok {
		defer cl.Close()
	}
	sy := dataplane.NewSyncer(dataplane.SyncConfig{MinSyncPeriod: f.minSync, SyncPeriod: f.sync, RetryPeriod: f.sync}, b, tr, nil)
	h, err := backends.NewHealth(a.mode, ns, cfg, nodeIP, 2*f.sync)
	if err != nil {
		return &EnvError{Err: err}
	}
	defer h.Close()
	sy.SetHealth(h)
	ct, err := conntrack.NewNamespaceTable(ns)
	if err != nil {
		return &EnvError{Err: err}
	}
	sy.SetConntrack(conntrack.Cleaner{Table: ct, Faults: a.faults})
	if a.metrics.IsValid() {
		srv, err := serveSyncMetrics(ns, a.metrics, sy)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	fmt.Fprintf(s.Err, "sim proxy: node %s (%s), %s mode in %s, faults %v: syncing\n", f.hostname, nodeIP, a.mode, ns.Name, a.faults.Names())
	go func() {
		select {
		case <-sy.Synced():
			fmt.Fprintf(s.Err, "sim proxy: first sync done\n")
		case <-ctx.Done():
		}
	}()
	if err := sy.Run(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("sync loop: %w", err)
	}
	return nil
}

// nodeInternalIP is the IPv4 InternalIP of the Node called name.
func nodeInternalIP(ctx context.Context, client kubernetes.Interface, name string) (netip.Addr, error) {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, &EnvError{Err: fmt.Errorf("node %s: %w", name, err)}
	}
	for _, a := range node.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && ip.Is4() {
			return ip, nil
		}
	}
	return netip.Addr{}, &EnvError{Err: fmt.Errorf("node %s has no IPv4 InternalIP", name)}
}

// serveSyncMetrics serves the syncer's kube-proxy metrics on /metrics at
// addr, listening inside ns.
func serveSyncMetrics(ns *netns.Namespace, addr netip.AddrPort, sy *dataplane.Syncer) (*http.Server, error) {
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", addr.String()); return err }); err != nil {
		return nil, &EnvError{Err: fmt.Errorf("--metrics-bind-address %s: %w", addr, err)}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_ = sy.Metrics().WriteText(w)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}
