package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/backends"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
)

func init() { extraCommands = append(extraCommands, newRules) }

type rulesFlags struct {
	mode     modeFlag
	layout   string
	node     string
	faults   []string
	affinity string
	seed     uint64
}

func newRules(s Streams) *cobra.Command {
	f := rulesFlags{mode: modeFlag{cluster.ModeIPTables}} // --mode's default
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
	c.Flags().Var(&f.mode, "mode", "proxy mode to render: iptables or nftables")
	c.Flags().StringVar(&f.layout, "layout", "", "nftables layout: kube-proxy (default) or fast")
	c.Flags().StringVar(&f.node, "node", "", "node whose rules to print (default: the first node in sorted order)")
	c.Flags().StringArrayVar(&f.faults, "fault", nil, "named fault to build in (repeatable)")
	c.Flags().StringVar(&f.affinity, "affinity", "", "ClientIP affinity layout: recent (kube-proxy) or ipset")
	c.Flags().Uint64Var(&f.seed, "seed", 0, "override the scenario's seed")
	return c
}

func runRules(c *cobra.Command, out io.Writer, file string, f *rulesFlags) error {
	if f.mode.m == cluster.ModeIPVS {
		return &UsageError{Err: fmt.Errorf("ipvs rendering is not available in sim rules: %w (see sim conform --mode ipvs)", backends.ErrNoRuleset)}
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
	ncfg := dataplane.NodeConfig{NodeName: node, MasqueradeAll: sc.Proxy.MasqueradeAll, Faults: faults}
	if p, err := netip.ParsePrefix(sc.Cluster.PodCIDR); err == nil {
		ncfg.ClusterCIDR = p
	}
	if p, err := netip.ParsePrefix(sc.Cluster.ServiceCIDR); err == nil {
		ncfg.ServiceCIDRs = []netip.Prefix{p}
	}
	o := backends.Options{Affinity: iptables.AffinityMode(sc.Proxy.IPTablesAffinity), Layout: nftables.Layout(sc.Proxy.NFTablesLayout)}
	if f.affinity != "" {
		o.Affinity = iptables.AffinityMode(f.affinity)
	}
	if f.layout != "" {
		o.Layout = nftables.Layout(f.layout)
	}
	r, err := backends.Render(f.mode.m, m.State, ncfg, o)
	if errors.Is(err, backends.ErrInvalidConfig) {
		return &UsageError{Err: err}
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "# kpsim %s rules for node %s (scenario %s; %s; faults %s)\n%s", f.mode.m, node, sc.Metadata.Name, r.Settings, faults, r.Text)
	return err
}
