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
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/backends"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/differential"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

func init() { extraCommands = append(extraCommands, newRules) }

type rulesFlags struct {
	mode      modeFlag
	layout    string
	node      string
	faults    []string
	affinity  string
	seed      uint64
	subject   string
	listed    bool
	diff      bool
	kubeProxy string
	// nftTimeout bounds each nft transaction of --listed (0: derived).
	nftTimeout time.Duration
}

// Subjects of sim rules --subject.
const (
	subjectKpsim     = "kpsim"
	subjectKubeProxy = "kube-proxy"
)

func newRules(s Streams) *cobra.Command {
	f := rulesFlags{mode: modeFlag{cluster.ModeIPTables}} // --mode's default
	c := &cobra.Command{
		Use:   "rules FILE --mode iptables|nftables [--node NAME] [--listed | --subject kube-proxy [--diff]]",
		Short: "Print the rules the dataplane would apply for a node",
		Long: `rules loads the scenario into the cluster model and prints, without root and
without touching the kernel, the full ruleset the iptables dataplane would
apply on one node: the input of iptables-restore --noflush, then the jump rules
from the built-in chains (applied once per namespace). With --affinity ipset,
the ipset restore input comes first, as comment lines.

--node defaults to the first node in sorted order. --fault builds in a named
fault (repeatable): ` + strings.Join(proxy.FaultNames(), ", ") + `.
--affinity defaults to the scenario's proxy.iptablesAffinity.

As root, three more views read a kernel back (iptables mode: iptables-save,
every IPv4 table; nftables mode: nft list table ip kube-proxy):
  --listed               ours, loaded into a scratch namespace and read back;
  --subject kube-proxy   upstream kube-proxy's, after it synced the scenario's
                         objects from a real kube-apiserver in the run's
                         namespaces (binaries beside sim, or --kube-proxy);
  --subject kube-proxy --diff
                         both, normalized (headers and counters dropped,
                         lines sorted) and diffed: "-" upstream only, "+"
                         ours only; exit 1 when they differ.`,
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
	c.Flags().StringVar(&f.subject, "subject", subjectKpsim, "whose rules: kpsim (ours) or kube-proxy (upstream's, read back; root)")
	c.Flags().BoolVar(&f.listed, "listed", false, "load ours into a scratch namespace and print what the kernel lists (root)")
	nftTimeoutFlag(c, &f.nftTimeout)
	c.Flags().BoolVar(&f.diff, "diff", false, "with --subject kube-proxy: print the normalized diff of upstream's and ours (exit 1 when they differ)")
	c.Flags().StringVar(&f.kubeProxy, "kube-proxy", "", "kube-proxy binary for --subject kube-proxy (default: bin/kube-proxy beside sim)")
	return c
}

func runRules(c *cobra.Command, out io.Writer, file string, f *rulesFlags) error {
	if err := checkRulesFlags(c, f); err != nil {
		return err
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
	o.NFTTimeout = f.nftTimeout
	switch {
	case f.subject == subjectKubeProxy:
		return rulesUpstream(out, m, node, seed, f)
	case f.listed:
		text, err := differential.Listed(context.Background(), f.mode.m, m.State, ncfg, o)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "# kpsim %s rules for node %s (scenario %s; faults %s), loaded into a scratch namespace and read back with %s\n%s",
			f.mode.m, node, sc.Metadata.Name, faults, differential.ReadBackCommand(f.mode.m), text)
		return err
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

// checkRulesFlags refuses contradictory flags (exit 2) and, for the views
// that read a kernel back, a non-root user (exit 3).
func checkRulesFlags(c *cobra.Command, f *rulesFlags) error {
	if f.mode.m == cluster.ModeIPVS {
		return &UsageError{Err: fmt.Errorf("ipvs rendering is not available in sim rules: %w (see sim conform --mode ipvs)", backends.ErrNoRuleset)}
	}
	if f.layout != "" && f.layout != string(nftables.LayoutKubeProxy) && f.layout != string(nftables.LayoutFast) {
		return &UsageError{Err: fmt.Errorf("unknown nftables layout %q: use kube-proxy or fast", f.layout)}
	}
	if f.affinity != "" && f.affinity != string(iptables.AffinityRecent) && f.affinity != string(iptables.AffinityIPSet) {
		return &UsageError{Err: fmt.Errorf("unknown affinity layout %q: use recent or ipset", f.affinity)}
	}
	switch {
	case f.subject != subjectKpsim && f.subject != subjectKubeProxy:
		return &UsageError{Err: fmt.Errorf("unknown --subject %q: use kpsim or kube-proxy", f.subject)}
	case f.diff && f.subject != subjectKubeProxy:
		return &UsageError{Err: fmt.Errorf("--diff compares upstream with ours: it needs --subject kube-proxy")}
	case f.listed && f.subject == subjectKubeProxy:
		return &UsageError{Err: fmt.Errorf("--listed prints ours; --subject kube-proxy prints upstream's (add --diff to compare them)")}
	case c.Flags().Changed("kube-proxy") && f.subject != subjectKubeProxy:
		return &UsageError{Err: fmt.Errorf("--kube-proxy needs --subject kube-proxy")}
	case f.subject == subjectKubeProxy && (len(f.faults) > 0 || f.layout == string(nftables.LayoutFast) || f.affinity == string(iptables.AffinityIPSet)):
		return &UsageError{Err: fmt.Errorf("--subject kube-proxy compares kube-proxy's own layout: --fault, --layout fast and --affinity ipset are ours only")}
	}
	if (f.listed || f.subject == subjectKubeProxy) && geteuid() != 0 {
		return &EnvError{Err: fmt.Errorf("sim rules --listed and --subject kube-proxy need root: they create network namespaces and program netfilter inside them")}
	}
	return nil
}

// rulesUpstream runs the upstream half (and with --diff, ours beside it)
// for the scenario's objects on node, and prints upstream's read-back
// ruleset or the normalized diff.
func rulesUpstream(out io.Writer, m *apiserver.Model, node string, seed *uint64, f *rulesFlags) (err error) {
	bin, err := upstream.Find(f.kubeProxy)
	if err != nil {
		return &EnvError{Err: err}
	}
	// The model streamed its objects into the fake clientset; the real API
	// needs them in hand.
	exp, err := scenario.Expand(m.Loaded, seed)
	if err != nil {
		return err
	}
	cfg, err := differential.ScenarioConfig(exp, f.mode.m, []string{node})
	if err != nil {
		return &UsageError{Err: err}
	}
	cfg.Bin = bin
	ctx := context.Background()
	env, err := differential.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.Close()) }()
	name := m.Expanded.Scenario.Metadata.Name
	if !f.diff {
		text, err := env.Upstream(0)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "# kube-proxy %s %s rules for node %s (scenario %s), read back with %s\n%s",
			env.Version(), f.mode.m, node, name, differential.ReadBackCommand(f.mode.m), text)
		return err
	}
	res, err := env.Compare()
	if err != nil {
		return err
	}
	r := res[0]
	fmt.Fprintf(out, "# %s mode, node %s, scenario %s: kube-proxy %s (-) vs kpsim (+), normalized: %d differing lines of %d\n",
		f.mode.m, node, name, env.Version(), len(r.Diff), r.Lines)
	for _, l := range r.Diff {
		fmt.Fprintln(out, l)
	}
	if len(r.Diff) > 0 {
		return &CheckFailedError{Failed: []string{fmt.Sprintf("%d rule lines differ between kube-proxy and kpsim", len(r.Diff))}}
	}
	return nil
}
