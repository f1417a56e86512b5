// Package backends is the one place that picks a dataplane backend by mode:
// New builds the iptables, nftables or IPVS Backend for a node namespace from
// the shared dataplane.NodeConfig and the per-mode Options, and Render
// prints a node's full ruleset without a kernel, for the modes that have one.
// Callers (the conformance harness, the soak, `sim rules`) never switch on
// the mode themselves.
package backends

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/ipvs"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Options are the per-mode settings; each is read by its mode only, and
// the zero value of each is the backend's default.
type Options struct {
	// IPTablesVariant is the iptables userland, iptables.VariantNFT
	// (default when empty) or iptables.VariantLegacy: the whole ruleset in
	// iptables mode, the constant rules in IPVS mode.
	IPTablesVariant string
	// Affinity is iptables mode's ClientIP affinity layout (default
	// iptables.AffinityRecent).
	Affinity iptables.AffinityMode
	// StaleChainPeriod is iptables mode's iptables.Config.StaleChainPeriod,
	// kube-proxy's --iptables-sync-period (0: its default, 30 s).
	StaleChainPeriod time.Duration
	// Layout is the nftables table layout (default nftables.LayoutKubeProxy).
	Layout nftables.Layout
	// NFTTimeout bounds each nft transaction (--nft-timeout; 0: the bound
	// nftables.CallBound derives from the transaction's size).
	NFTTimeout time.Duration
	// Scheduler is the IPVS scheduler of every virtual server (default rr).
	Scheduler string
	// NodeIPs are the node's addresses, one IPVS virtual server each per
	// node port (empty: node ports are not programmed in IPVS mode).
	NodeIPs []netip.Addr
}

// variant is the iptables userland to use: IPTablesVariant, nft if empty.
func (o Options) variant() string {
	if o.IPTablesVariant == "" {
		return iptables.VariantNFT
	}
	return o.IPTablesVariant
}

func (o Options) iptables(node dataplane.NodeConfig) iptables.Config {
	return iptables.Config{NodeConfig: node, Affinity: o.Affinity, StaleChainPeriod: o.StaleChainPeriod}
}

func (o Options) nftables(node dataplane.NodeConfig) nftables.Config {
	return nftables.Config{NodeConfig: node, Layout: o.Layout}
}

func (o Options) ipvs(node dataplane.NodeConfig) ipvs.Config {
	return ipvs.Config{NodeConfig: node, Scheduler: o.Scheduler, IPTablesVariant: o.IPTablesVariant, NodeIPs: o.NodeIPs}
}

// New builds mode's Backend programming the node namespace ns. A backend
// that holds descriptors (IPVS) also implements io.Closer.
func New(mode cluster.Mode, ns *netns.Namespace, node dataplane.NodeConfig, o Options) (dataplane.Backend, error) {
	var b dataplane.Backend
	var err error
	switch mode {
	case cluster.ModeIPTables:
		b, err = nonNil(iptables.NewBackend(ns, o.iptables(node), o.variant()))
	case cluster.ModeNFTables:
		b, err = nonNil(nftables.NewNamespaceBackend(ns, o.nftables(node), o.NFTTimeout))
	case cluster.ModeIPVS:
		b, err = nonNil(ipvs.NewBackend(ns, o.ipvs(node)))
	default:
		_, err = cluster.ParseMode(string(mode))
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// nonNil turns a backend constructor's result into an interface that is nil
// on error (not a typed nil pointer).
func nonNil[B dataplane.Backend](b B, err error) (dataplane.Backend, error) {
	if err != nil {
		return nil, err
	}
	return b, nil
}

// ErrNoRuleset is wrapped by Render's error for IPVS mode, whose state is
// virtual servers, not a ruleset.
var ErrNoRuleset = errors.New("IPVS state is virtual servers, not a ruleset")

// ErrInvalidConfig is wrapped by Render's error when the settings are
// refused (bad input, not a render failure).
var ErrInvalidConfig = errors.New("invalid configuration")

// Rendered is one node's full ruleset as text.
type Rendered struct {
	// Settings names the per-mode settings in effect, defaults resolved:
	// "affinity recent" (iptables) or "layout kube-proxy" (nftables).
	Settings string
	// Text is the ruleset. iptables: a count comment, the ipset restore
	// input as comments, the iptables-restore --noflush input and the
	// jump rules from the built-in chains, each after a comment line.
	// nftables: the table as `nft list` prints it.
	Text string
}

// Render renders the full ruleset of node.NodeName in mode from st, without
// touching the kernel.
func Render(mode cluster.Mode, st *cluster.State, node dataplane.NodeConfig, o Options) (Rendered, error) {
	switch mode {
	case cluster.ModeIPTables:
		return renderIPTables(st, o.iptables(node))
	case cluster.ModeNFTables:
		cfg := o.nftables(node)
		if cfg.Layout == "" {
			cfg.Layout = nftables.LayoutKubeProxy
		}
		text, err := nftables.RenderForNode(st, node.NodeName, cfg)
		if err != nil {
			return Rendered{}, fmt.Errorf("could not render the nftables rules of node %s: %w", node.NodeName, err)
		}
		return Rendered{Settings: "layout " + string(cfg.Layout), Text: text}, nil
	case cluster.ModeIPVS:
		return Rendered{}, fmt.Errorf("could not render ipvs mode: %w", ErrNoRuleset)
	}
	_, err := cluster.ParseMode(string(mode))
	return Rendered{}, err
}

func renderIPTables(st *cluster.State, cfg iptables.Config) (Rendered, error) {
	r, err := iptables.NewRenderer(cfg)
	if err != nil {
		return Rendered{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	rs, err := r.Render(st, nil, true)
	if err != nil {
		return Rendered{}, fmt.Errorf("could not render the rules of node %s: %w", cfg.NodeName, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# %d lines; nat %d chains %d rules; filter %d chains %d rules\n",
		rs.Lines, rs.NATChains, rs.NATRules, rs.FilterChains, rs.FilterRules)
	if rs.IPSetRestore != "" {
		b.WriteString("# ipset restore -exist input, applied before the rules:\n")
		for _, l := range strings.SplitAfter(rs.IPSetRestore, "\n") {
			if l != "" {
				b.WriteString("#   " + l)
			}
		}
	}
	b.WriteString("# iptables-restore --noflush input:\n")
	b.WriteString(rs.Restore)
	b.WriteString("# jump rules from the built-in chains, applied once per namespace:\n")
	b.WriteString(rs.Jumps)
	return Rendered{Settings: "affinity " + string(r.Config().Affinity), Text: b.String()}, nil
}

// NewHealth starts kube-proxy's health servers for a node in its namespace:
// /healthz and /livez on the node's address, port dataplane.HealthzPort
// (kube-proxy's --healthz-bind-address as the harness passes it), and the
// health check node ports on the addresses kube-proxy's default
// --nodeport-addresses gives the mode: the node's address in nftables mode
// ("primary"), every address of the namespace in iptables and IPVS mode.
// Nothing listens outside ns. healthTimeout is kube-proxy's, twice
// --iptables-sync-period.
func NewHealth(mode cluster.Mode, ns *netns.Namespace, node dataplane.NodeConfig, nodeIP netip.Addr, healthTimeout time.Duration) (*dataplane.HealthServer, error) {
	cfg := dataplane.HealthConfig{
		NodeName: node.NodeName, HealthTimeout: healthTimeout, Faults: node.Faults,
		Healthz: netip.AddrPortFrom(nodeIP, dataplane.HealthzPort),
		Listen: func(a netip.AddrPort) (net.Listener, error) {
			var l net.Listener
			err := ns.Do(func() (err error) { l, err = net.Listen("tcp4", a.String()); return err })
			return l, err
		},
	}
	if mode == cluster.ModeNFTables {
		cfg.Addrs = []netip.Addr{nodeIP}
	}
	return dataplane.NewHealthServer(cfg)
}
