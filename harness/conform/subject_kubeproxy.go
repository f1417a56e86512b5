package conform

// The kube-proxy subject runs the unmodified upstream binary the way it runs
// in a cluster: etcd and kube-apiserver in the run's control-plane namespace
// (harness/upstream), the scenario's objects written through the real API
// (apiserver.Seed, Node InternalIPs = the node namespaces' addresses), one
// kube-proxy process per node namespace, and the timeline written through
// apiserver.Connect(cp.Client()).Apply, the same writer the model uses. A
// change is settled on kube-proxy's own sync metrics (KubeProxy.Settle: a
// sync that started after the write), never on the rules under test.
//
// The suite's model (the fake clientset) still receives every step too: the
// oracle's expectations come from it, as for the kpsim subject, so the
// subject cannot change what is expected of it.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// kubeProxies is the kube-proxy subject of one suite.
type kubeProxies struct {
	s       *suite
	podCIDR netip.Prefix
	variant string
	cp      *upstream.ControlPlane
	api     *apiserver.Cluster // the real API, through the one writer
	list    []*upstream.KubeProxy
}

var _ proxies = (*kubeProxies)(nil)

func (s *suite) newKubeProxies(podCIDR netip.Prefix, variant string) (proxies, error) {
	if s.o.Mode != cluster.ModeIPTables && s.o.Mode != cluster.ModeNFTables {
		return nil, fmt.Errorf("the kube-proxy subject runs iptables and nftables modes, not %s", s.o.Mode)
	}
	if s.o.KubeProxy.KubeProxy == "" {
		return nil, &EnvironmentError{errors.New("the kube-proxy subject has no binaries (Options.KubeProxy: upstream.Find)")}
	}
	return &kubeProxies{s: s, podCIDR: podCIDR, variant: variant}, nil
}

// controlPlanePrefix is where the kube-proxy subject's control plane sits
// on the fabric: the last host address of the node network (of the first
// node's prefix when the scenario names none), which no node takes.
func controlPlanePrefix(cfg *netns.Config) (netip.Prefix, error) {
	if len(cfg.Nodes) == 0 {
		return netip.Prefix{}, errors.New("no node to place the control plane beside")
	}
	p := cfg.Nodes[0].Addr.Masked()
	a := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += host - 1 // the last address before the broadcast address
	addr := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	for _, n := range cfg.Nodes {
		if n.Addr.Addr() == addr {
			return netip.Prefix{}, fmt.Errorf("node %s holds %s, the control plane's address", n.Name, addr)
		}
	}
	return netip.PrefixFrom(addr, p.Bits()), nil
}

func (k *kubeProxies) start(ctx context.Context, topo *netns.Topology) error {
	s := k.s
	dir := netns.RunDir(topo.RunID())
	if err := os.MkdirAll(filepath.Join(dir, "cp"), 0o700); err != nil {
		return &EnvironmentError{fmt.Errorf("could not create the run folder: %w", err)}
	}
	svcCIDR, err := netip.ParsePrefix(s.l.Scenario.Cluster.ServiceCIDR)
	if err != nil {
		return fmt.Errorf("the kube-proxy subject needs the scenario's service CIDR: %w", err)
	}
	cp, err := upstream.StartControlPlane(ctx, upstream.ControlPlaneConfig{NS: topo.ControlPlane(), Addr: topo.Config().ControlPlane.Addr(),
		Dir: filepath.Join(dir, "cp"), ServiceCIDR: svcCIDR, Bin: s.o.KubeProxy, Log: s.o.Log})
	if err != nil {
		return &EnvironmentError{fmt.Errorf("could not start the control plane: %w", err)}
	}
	k.cp = cp
	addrs, cidrs := map[string]netip.Addr{}, map[string]netip.Prefix{}
	for _, n := range topo.Nodes() {
		addrs[n.Config.Name], cidrs[n.Config.Name] = n.Config.Addr.Addr(), n.Config.PodCIDR
	}
	// The model streamed its objects into the fake clientset; the same
	// expansion (same seed) gives them again.
	exp, err := scenario.Expand(s.l, &s.seed)
	if err != nil {
		return err
	}
	if _, err := apiserver.Seed(ctx, cp.Client(), exp, apiserver.SeedOptions{NodeAddrs: addrs, PodCIDRs: cidrs}); err != nil {
		return fmt.Errorf("could not write the scenario into the API: %w", err)
	}
	if k.api, err = apiserver.Connect(cp.Client()); err != nil {
		return err
	}
	if err := k.api.Start(ctx, settleTimeout); err != nil {
		return fmt.Errorf("the real API's informers: %w", err)
	}
	for _, n := range topo.Nodes() {
		if err := k.startNode(ctx, n, dir); err != nil {
			return err
		}
	}
	return nil
}

// startNode starts one node's kube-proxy (which waits for its first sync).
// A scenario without a minimum sync period gets 0 s, as the kpsim subject
// has none, rather than kube-proxy's default of 1 s.
func (k *kubeProxies) startNode(ctx context.Context, n *netns.Node, dir string) error {
	px := k.s.l.Scenario.Proxy
	k.s.liftICMPLimits(n)
	if err := k.untrackControl(n); err != nil {
		return err
	}
	d := filepath.Join(dir, "kube-proxy-"+n.Config.Name)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return &EnvironmentError{fmt.Errorf("could not create %s: %w", d, err)}
	}
	var extra []string
	if px.MinSyncPeriod.Duration == 0 {
		extra = append(extra, "--iptables-min-sync-period=0s")
	}
	kp, err := upstream.StartKubeProxy(ctx, k.cp, upstream.KubeProxyConfig{Node: n.Config.Name, NS: n.NS, NodeIP: n.Config.Addr.Addr(),
		Mode: k.s.o.Mode, ClusterCIDR: k.podCIDR, IPTablesBackend: k.variant, MasqueradeAll: px.MasqueradeAll,
		MinSyncPeriod: px.MinSyncPeriod.Duration, SyncPeriod: px.SyncPeriod.Duration, ExtraArgs: extra, Dir: d})
	if err != nil {
		return fmt.Errorf("node %s: kube-proxy: %w", n.Config.Name, err)
	}
	k.list = append(k.list, kp)
	return nil
}

func (k *kubeProxies) nodes() int { return len(k.list) }

// untrackControl keeps kube-proxy's own connections out of the node
// namespace's connection tracking: its watch of the API server and the
// harness's scrapes of its metrics. The probes' independence proof counts
// the namespace's conntrack entries per block (probe_independence.go), and
// those connections, re-tracked after each flush, would count as probes'.
// The rules go in the raw table, which kube-proxy does not write; the
// connections' packets are then "untracked", which no kube-proxy rule
// matches (its rules match new, invalid or DNATed states).
func (k *kubeProxies) untrackControl(n *netns.Node) error {
	bin := "iptables-nft"
	if k.variant == "legacy" {
		bin = "iptables-legacy"
	}
	api := strconv.Itoa(upstream.APIServerPort)
	metrics := strconv.Itoa(upstream.MetricsPort)
	for _, rule := range [][]string{
		{"OUTPUT", "-p", "tcp", "--dport", api},
		{"PREROUTING", "-p", "tcp", "--sport", api},
		{"OUTPUT", "-p", "tcp", "--dport", metrics},
		{"OUTPUT", "-p", "tcp", "--sport", metrics},
		{"PREROUTING", "-p", "tcp", "--dport", metrics},
		{"PREROUTING", "-p", "tcp", "--sport", metrics},
	} {
		args := append([]string{"-w", "-t", "raw", "-A", rule[0]}, rule[1:]...)
		var stderr strings.Builder
		cmd := exec.Command(bin, append(args, "-j", "NOTRACK")...)
		cmd.Stderr = &stderr
		if err := n.NS.Run(cmd); err != nil {
			return &EnvironmentError{fmt.Errorf("node %s: could not untrack kube-proxy's own connections (%s %s): %w: %s", n.Config.Name, bin, strings.Join(args, " "), err, stderr.String())}
		}
	}
	return nil
}

// counters reads upstream's iptables counters in the node namespace
// (`iptables-save -c`) and maps them with the chain names our renderer
// gives the suite's current state: kube-proxy names its KUBE-SVC-/SEP-
// chains by the same hashes, so a KUBE-SEP- chain's DNAT counter is that
// endpoint's new connections, and the filter REJECT/DROP rules name their
// destination. nftables mode keeps no counters (kube-proxy adds none): nil,
// which the checks report as unavailable.
func (k *kubeProxies) counters(name string) []dataplane.Counter {
	if k.s.o.Mode != cluster.ModeIPTables {
		return nil
	}
	n, ok := k.s.topo.Node(name)
	if !ok {
		return nil
	}
	r, err := iptables.NewRenderer(iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: name, ClusterCIDR: k.podCIDR,
		MasqueradeAll: k.s.l.Scenario.Proxy.MasqueradeAll}})
	if err != nil {
		return nil
	}
	rs, err := r.Render(k.s.state(), nil, true)
	if err != nil {
		return nil
	}
	save := "iptables-nft-save"
	if k.variant == "legacy" {
		save = "iptables-legacy-save"
	}
	var out strings.Builder
	cmd := exec.Command(save, "-c")
	cmd.Stdout = &out
	if err := n.NS.Run(cmd); err != nil {
		return nil
	}
	return iptables.ParseCounters(out.String(), rs.Chains)
}

// apply writes the step into the model (the oracle's state) and through
// the real API, then waits for a sync of every kube-proxy that started
// after the write (upstream's Settle). A step that wrote nothing to the real
// API queues no sync: nothing to wait for.
func (k *kubeProxies) apply(ctx context.Context, step apiserver.Step) (map[string]time.Duration, error) {
	before := make([]upstream.Metrics, len(k.list))
	for i, kp := range k.list {
		m, err := kp.Scrape(ctx)
		if err != nil {
			return nil, fmt.Errorf("node %s: kube-proxy's metrics: %w", kp.Node(), err)
		}
		before[i] = m
	}
	t0 := time.Now()
	if _, err := k.s.m.Cluster.Apply(ctx, step); err != nil {
		return nil, &applyError{err}
	}
	writes, err := k.api.Apply(ctx, step)
	if err != nil {
		return nil, &applyError{fmt.Errorf("the real API: %w", err)}
	}
	out := map[string]time.Duration{}
	if writes == 0 {
		return out, nil
	}
	for i, kp := range k.list {
		programmed := 0 // slice writes carry a trigger time: each is observed once programmed
		if step.Action != apiserver.ActServiceUpdate {
			programmed = writes
		}
		s, err := kp.Settle(ctx, upstream.Change{Since: t0, Before: &before[i], Programmed: programmed}, settleTimeout)
		if err != nil {
			return nil, fmt.Errorf("the change was not programmed: %w", err)
		}
		out[kp.Node()] = s.Ended.Sub(t0)
	}
	return out, nil
}

func (k *kubeProxies) stop() {
	for _, kp := range k.list {
		if err := kp.Close(); err != nil {
			fmt.Fprintf(k.s.o.Log, "conform: %s: stopping kube-proxy: %v\n", kp.Node(), err)
		}
	}
	if k.api != nil {
		k.api.Stop()
	}
}

func (k *kubeProxies) close() {
	if k.cp != nil {
		if err := k.cp.Close(); err != nil {
			fmt.Fprintf(k.s.o.Log, "conform: stopping the control plane: %v\n", err)
		}
	}
}
