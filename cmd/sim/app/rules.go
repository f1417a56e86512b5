package app

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/apiserver"
)

func init() { extraCommands = append(extraCommands, newRules) }

type rulesFlags struct {
	mode     string
	layout   string
	node     string
	faults   []string
	affinity string
	seed     uint64
}

func newRules(s Streams) *cobra.Command {
	var f rulesFlags
	c := &cobra.Command{
		Use:   "rules FILE --mode iptables|nftables [--node NAME]",
		Short: "Print the rules the dataplane would apply for a node",
		Long: `rules loads the scenario into the cluster model and prints, without root and
without touching the kernel, the full ruleset the iptables dataplane would
apply on one node: the input of iptables-restore --noflush, then the jump rules
from the built-in chains (applied once per namespace). With --affinity ipset,
the ipset restore input comes first, as comment lines.

--node defaults to the first node in sorted order. --fault builds in a named
fault (repeatable): ` + strings.Join(proxy.FaultNames(), ", ") + `.
--affinity defaults to the scenario's proxy.iptablesAffinity.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return runRules(c, s.Out, args[0], &f)
		},
	}
	c.Flags().StringVar(&f.mode, "mode", "iptables", "proxy mode to render: iptables or nftables")
	c.Flags().StringVar(&f.layout, "layout", "", "nftables layout: kube-proxy (default) or fast")
	c.Flags().StringVar(&f.node, "node", "", "node whose rules to print (default: the first node in sorted order)")
	c.Flags().StringArrayVar(&f.faults, "fault", nil, "named fault to build in (repeatable)")
	c.Flags().StringVar(&f.affinity, "affinity", "", "ClientIP affinity layout: recent (kube-proxy) or ipset")
	c.Flags().Uint64Var(&f.seed, "seed", 0, "override the scenario's seed")
	return c
}

func runRules(c *cobra.Command, out io.Writer, file string, f *rulesFlags) error {
	switch f.mode {
	case "iptables", "nftables":
	case "ipvs":
		return &UsageError{Err: fmt.Errorf("ipvs rendering is not available in sim rules: IPVS state is virtual servers, not a ruleset (see sim conform --mode ipvs)")}
	default:
		return &UsageError{Err: fmt.Errorf("unknown mode %q: use --mode iptables or nftables", f.mode)}
	}
	if f.layout != "" && f.layout != string(nftables.LayoutKubeProxy) && f.layout != string(nftables.LayoutFast) {
		return &UsageError{Err: fmt.Errorf("unknown nftables layout %q: use kube-proxy or fast", f.layout)}
	}
	if f.affinity != "" && f.affinity != string(iptables.AffinityRecent) && f.affinity != string(iptables.AffinityIPSet) {
		return &UsageError{Err: fmt.Errorf("unknown affinity layout %q: use recent or ipset", f.affinity)}
	}
	faults, err := proxy.ParseFaults(f.faults)
	if err != nil {
		return &UsageError{Err: err}
	}
	if _, err := os.Stat(file); err != nil {
		return &UsageError{Err: fmt.Errorf("no such scenario file: %s", file)}
	}
	var seed *uint64
	if c.Flags().Changed("seed") {
		seed = &f.seed
	}
	m, err := apiserver.Open(context.Background(), file, seed)
	if err != nil {
		return err
	}
	defer m.Close()

	nodes := m.State.SortedNodes()
	node := f.node
	switch {
	case node == "" && len(nodes) == 0:
		return &UsageError{Err: fmt.Errorf("scenario %s has no nodes", file)}
	case node == "":
		node = nodes[0]
	case !slices.Contains(nodes, node):
		return &UsageError{Err: fmt.Errorf("no node %q in %s (nodes: %s)", node, file, strings.Join(nodes, ", "))}
	}
	sc := m.Expanded.Scenario
	if f.mode == "nftables" {
		ncfg := nftables.Config{NodeConfig: dataplane.NodeConfig{NodeName: node, MasqueradeAll: sc.Proxy.MasqueradeAll, Faults: faults}, Layout: nftables.Layout(sc.Proxy.NFTablesLayout)}
		if f.layout != "" {
			ncfg.Layout = nftables.Layout(f.layout)
		}
		if p, err := netip.ParsePrefix(sc.Cluster.PodCIDR); err == nil {
			ncfg.ClusterCIDR = p
		}
		text, err := nftables.RenderForNode(m.State, node, ncfg)
		if err != nil {
			return fmt.Errorf("could not render the nftables rules of node %s: %w", node, err)
		}
		_, err = fmt.Fprintf(out, "# kpsim nftables rules for node %s (scenario %s; layout %s; faults %s)\n%s", node, sc.Metadata.Name, ncfg.Layout, faults, text)
		return err
	}
	cfg := iptables.Config{
		NodeConfig: dataplane.NodeConfig{NodeName: node, MasqueradeAll: sc.Proxy.MasqueradeAll, Faults: faults},
		Affinity:   iptables.AffinityMode(sc.Proxy.IPTablesAffinity),
	}
	if f.affinity != "" {
		cfg.Affinity = iptables.AffinityMode(f.affinity)
	}
	if p, err := netip.ParsePrefix(sc.Cluster.PodCIDR); err == nil {
		cfg.ClusterCIDR = p
	}
	r, err := iptables.NewRenderer(cfg)
	if err != nil {
		return &UsageError{Err: err}
	}
	rs, err := r.Render(m.State, nil, true)
	if err != nil {
		return fmt.Errorf("could not render the rules of node %s: %w", node, err)
	}
	return writeRules(out, sc.Metadata.Name, r.Config(), rs)
}

// writeRules prints a ruleset as one iptables-restore input: comments, the
// ipset input as comments, the rules, then the jump rules.
func writeRules(w io.Writer, scenario string, cfg iptables.Config, rs *iptables.Ruleset) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# kpsim iptables rules for node %s (scenario %s; affinity %s; faults %s)\n",
		cfg.NodeName, scenario, cfg.Affinity, cfg.Faults)
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
	_, err := io.WriteString(w, b.String())
	return err
}
