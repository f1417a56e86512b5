package upstream

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// kube-proxy's ports, bound on the node's fabric address.
const (
	MetricsPort = 10249
	HealthzPort = 10256
)

// iptables backends for KubeProxyConfig.IPTablesBackend.
const (
	BackendNFT    = "nft"
	BackendLegacy = "legacy"
)

// KubeProxyConfig is one kube-proxy process in a node namespace.
type KubeProxyConfig struct {
	// Node is --hostname-override; the Node object must exist with an
	// InternalIP in its status (RegisterNode).
	Node string
	// NS is the node namespace.
	NS *netns.Namespace
	// NodeIP is the node's fabric address: the metrics and healthz bind
	// address.
	NodeIP netip.Addr
	// Mode is cluster.ModeIPTables or cluster.ModeNFTables (IPVS is not
	// supported here).
	Mode        cluster.Mode
	ClusterCIDR netip.Prefix
	// IPTablesBackend is "nft" (the default) or "legacy": then a folder in
	// Dir with iptables* links to xtables-legacy-multi goes first on
	// kube-proxy's PATH.
	IPTablesBackend string
	MasqueradeAll   bool
	// MinSyncPeriod and SyncPeriod are passed as --iptables-min-sync-period
	// and --iptables-sync-period, which kube-proxy v1.37 applies to the
	// nftables mode too; 0 leaves kube-proxy's defaults (1 s and 30 s).
	MinSyncPeriod, SyncPeriod time.Duration
	// ExtraArgs go last on the command line.
	ExtraArgs []string
	// Command, when set, runs in kube-proxy's place with kube-proxy's
	// command line after it: a drop-in node proxy such as
	// ["/path/sim", "proxy", "--own-netns"], which must serve kube-proxy's
	// sync metrics on --metrics-bind-address (the first sync is awaited
	// there).
	Command []string
	// Dir holds its kubeconfig (the system:kube-proxy token) and log; the
	// caller creates it.
	Dir string
	// MountNS, when set, is the path of a mount namespace kube-proxy joins
	// (nsenter --mount) instead of mounting a private /run of its own: a
	// real node's, e.g. /proc/PID/ns/mnt of harness/cluster's node
	// launcher, whose /run is a tmpfs of the node already. kube-proxy then
	// shares /run/xtables.lock with the node's kubelet, as on a real node.
	MountNS string
}

// KubeProxy is a running kube-proxy.
type KubeProxy struct {
	cfg        KubeProxyConfig
	proc       *process
	version    string
	metricsURL string
	http       *http.Client
	history    syncHistory // sums per sync count seen by Scrape, for Settle
}

func (cfg *KubeProxyConfig) validate() error {
	switch {
	case cfg.Node == "":
		return errors.New("could not start kube-proxy: no node name")
	case cfg.NS == nil:
		return fmt.Errorf("could not start kube-proxy on %s: no namespace", cfg.Node)
	case !cfg.NodeIP.Is4():
		return fmt.Errorf("could not start kube-proxy on %s: node address %v is not IPv4", cfg.Node, cfg.NodeIP)
	case cfg.Mode != cluster.ModeIPTables && cfg.Mode != cluster.ModeNFTables:
		return fmt.Errorf("could not start kube-proxy on %s: mode %q is not supported here (iptables or nftables)", cfg.Node, cfg.Mode)
	case cfg.IPTablesBackend != "" && cfg.IPTablesBackend != BackendNFT && cfg.IPTablesBackend != BackendLegacy:
		return fmt.Errorf("could not start kube-proxy on %s: iptables backend %q is neither nft nor legacy", cfg.Node, cfg.IPTablesBackend)
	case cfg.Dir == "":
		return fmt.Errorf("could not start kube-proxy on %s: no folder", cfg.Node)
	}
	return nil
}

// args is kube-proxy's command line after the binary.
func (cfg *KubeProxyConfig) args(kubeconfigPath string) []string {
	args := []string{
		"--kubeconfig=" + kubeconfigPath,
		"--hostname-override=" + cfg.Node,
		"--proxy-mode=" + string(cfg.Mode),
		"--metrics-bind-address=" + netip.AddrPortFrom(cfg.NodeIP, MetricsPort).String(),
		"--healthz-bind-address=" + netip.AddrPortFrom(cfg.NodeIP, HealthzPort).String(),
		// Never resize the machine-wide conntrack table (nf_conntrack_max,
		// and the hash size, which is writable from a namespace).
		"--conntrack-max-per-core=0",
	}
	if cfg.ClusterCIDR.IsValid() {
		args = append(args, "--cluster-cidr="+cfg.ClusterCIDR.String())
	}
	if cfg.MasqueradeAll {
		args = append(args, "--masquerade-all")
	}
	if cfg.MinSyncPeriod > 0 {
		args = append(args, "--iptables-min-sync-period="+cfg.MinSyncPeriod.String())
	}
	if cfg.SyncPeriod > 0 {
		args = append(args, "--iptables-sync-period="+cfg.SyncPeriod.String())
	}
	return append(args, cfg.ExtraArgs...)
}

// privateRun is the shell step that gives kube-proxy a /run of its own: it
// runs under `unshare --mount`, mounts a tmpfs on /run in that mount
// namespace and execs kube-proxy ("$0" "$@"), so /run/xtables.lock is the
// node's own and nothing kube-proxy writes there reaches the host.
const privateRun = `mount -t tmpfs -o size=16m,mode=0755 kpsim-run /run && exec "$0" "$@"`

// StartKubeProxy writes kube-proxy's kubeconfig (the system:kube-proxy
// token, the run's CA, the apiserver on the fabric), starts kube-proxy
// inside cfg.NS with a private /run, and waits (60 s at most) for its first
// sync (kubeproxy_sync_proxy_rules_last_timestamp_seconds non-zero). If it
// exits first, the error carries the last 20 lines of its log.
func StartKubeProxy(ctx context.Context, cp *ControlPlane, cfg KubeProxyConfig) (*KubeProxy, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var version string
	var err error
	bin := []string{cp.cfg.Bin.KubeProxy}
	if len(cfg.Command) > 0 {
		bin, version = cfg.Command, strings.Join(cfg.Command, " ")
	} else if version, err = cp.cfg.Bin.Version(); err != nil {
		return nil, err
	}
	kc := filepath.Join(cfg.Dir, "kube-proxy.kubeconfig")
	if err := os.WriteFile(kc, []byte(kubeconfig(cp.Server(), cp.creds.caPEM, KubeProxyUser, cp.creds.proxyToken)), 0o600); err != nil {
		return nil, fmt.Errorf("could not write kube-proxy's kubeconfig: %w", err)
	}
	env := processEnv()
	if cfg.IPTablesBackend == BackendLegacy {
		if env, err = legacyShim(cfg.Dir, env); err != nil {
			return nil, err
		}
	}
	argv, err := cfg.argv(bin, kc)
	if err != nil {
		return nil, err
	}
	p, err := startProcess(cfg.NS, cfg.Dir, "kube-proxy", argv, env)
	if err != nil {
		return nil, err
	}
	k := &KubeProxy{
		cfg: cfg, proc: p, version: version,
		metricsURL: "http://" + netip.AddrPortFrom(cfg.NodeIP, MetricsPort).String() + "/metrics",
		http: &http.Client{
			Transport: &http.Transport{DialContext: dialIn(cfg.NS), Proxy: noProxy, MaxIdleConns: 2},
			Timeout:   10 * time.Second,
		},
	}
	if err := k.waitFirstSync(ctx); err != nil {
		return nil, errors.Join(err, k.Close())
	}
	return k, nil
}

// argv is kube-proxy's whole command line: inside a private /run (unshare)
// or inside MountNS (nsenter).
func (cfg *KubeProxyConfig) argv(bin []string, kubeconfigPath string) ([]string, error) {
	if cfg.MountNS != "" {
		nsenter, err := exec.LookPath("nsenter")
		if err != nil {
			return nil, fmt.Errorf("could not start kube-proxy: %w (util-linux's nsenter joins the node's mount namespace)", err)
		}
		return slices.Concat([]string{nsenter, "--mount=" + cfg.MountNS, "--"}, bin, cfg.args(kubeconfigPath)), nil
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("could not start kube-proxy: %w (util-linux's unshare gives it a private /run)", err)
	}
	return slices.Concat([]string{unshare, "--mount", "--propagation", "private", "sh", "-c", privateRun}, bin, cfg.args(kubeconfigPath)), nil
}

func (k *KubeProxy) waitFirstSync(ctx context.Context) error {
	err := poll(ctx, 50*time.Millisecond, startTimeout, "kube-proxy's first sync", func() (bool, error) {
		if k.proc.exited() {
			return false, &fatalError{k.proc.exitError()}
		}
		m, err := k.Scrape(ctx)
		if err != nil {
			return false, err
		}
		return !m.LastSync.IsZero(), nil
	})
	if err != nil {
		return fmt.Errorf("could not start kube-proxy on %s (log %s): %w", k.cfg.Node, k.LogPath(), err)
	}
	return nil
}

// legacyTools are the commands kube-proxy runs that the legacy shim
// redirects to xtables-legacy-multi (it dispatches on its argv[0]).
var legacyTools = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

// legacyShim makes dir/legacy-bin with iptables* links to
// xtables-legacy-multi and returns env with that folder first on PATH.
func legacyShim(dir string, env []string) ([]string, error) {
	multi, err := exec.LookPath("xtables-legacy-multi")
	if err != nil {
		return nil, fmt.Errorf("could not set up the legacy iptables backend: %w", err)
	}
	shim := filepath.Join(dir, "legacy-bin")
	if err := os.MkdirAll(shim, 0o755); err != nil {
		return nil, fmt.Errorf("could not set up the legacy iptables backend: %w", err)
	}
	for _, t := range legacyTools {
		link := filepath.Join(shim, t)
		os.Remove(link)
		if err := os.Symlink(multi, link); err != nil {
			return nil, fmt.Errorf("could not set up the legacy iptables backend: %w", err)
		}
	}
	path := shim
	out := env[:0:0]
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path += ":" + v
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PATH="+path), nil
}

// Version is kube-proxy's version (`kube-proxy --version`, e.g. "v1.37.2").
func (k *KubeProxy) Version() string { return k.version }

// LogPath is the file that holds kube-proxy's output.
func (k *KubeProxy) LogPath() string { return k.proc.log }

// Node is the node kube-proxy runs as.
func (k *KubeProxy) Node() string { return k.cfg.Node }

// Close stops kube-proxy (SIGTERM, SIGKILL after 10 s) and waits. Its rules
// stay in the node namespace, which goes with the topology.
func (k *KubeProxy) Close() error {
	k.http.CloseIdleConnections()
	if err := k.proc.stop(); err != nil {
		return fmt.Errorf("could not stop kube-proxy on %s: %w", k.cfg.Node, err)
	}
	return nil
}

// PID is kube-proxy's process ID (the unshare or nsenter wrapper execs
// into it).
func (k *KubeProxy) PID() int { return k.proc.cmd.Process.Pid }
