package app

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/harness/diagnose"
)

func init() { extraCommands = append(extraCommands, newDiagnose) }

type diagnoseFlags struct {
	iptables, nft, ipvs string
	before              string
	conntrack           string
	api                 string
	node                string
	peers               []string
	alpha               float64
	output              string
	out                 string
}

// readDump reads one dump; tests replace it.
var readDump = diagnose.ReadFile

// readConntrack reads a conntrack table; tests replace it.
var readConntrack = diagnose.ReadConntrackFile

func newDiagnose(s Streams) *cobra.Command {
	var f diagnoseFlags
	c := &cobra.Command{
		Use:   "diagnose --iptables-save FILE | --nft FILE | --ipvsadm FILE [--before FILE] [--api FILE] [--node NAME] [--peer [NODE=]FILE ...] [--conntrack FILE]",
		Short: "Say whether a real node's load split is normal, from its rules and counters",
		Long: `diagnose reads what a node's tools print (iptables-save -c, nft list ruleset or
nft -j list ruleset, ipvsadm -Ln --stats --exact optionally followed by -Lnc),
finds kube-proxy's rules in it (the rest is ignored and listed), and reports per
service port: the endpoints, the share each gets from the rules as written, the
new connections the counters saw, a verdict (Pearson chi-square of the counts
against the split kube-proxy means, Holm over the dump's ports at --alpha), the
power to see a share off by 10 %, and findings in plain words with the lines
that show them. No root needed; nothing is touched.

--before FILE   an earlier dump of the same node (same format): the counts are
                the differences (a counter that went down: the later counts alone)
--api FILE      the cluster's objects (kubectl get nodes,svc,endpointslices -A
                -o yaml, or a scenario): names ports, finds stale and missing
                endpoints, Local policies without a local endpoint
--node NAME     the node the dump comes from (else inferred from the API)
--peer [NODE=]FILE
                another node's dump of the same cluster (same format, taken
                at about the same time; repeatable). External traffic: each
                port's entries (node port, external and load-balancer IPs)
                with what their rules counted, and the split of connections
                from outside (tested like a port's where the rules count it
                apart: iptables under externalTrafficPolicy Local). Under
                Local a node sees only what entered there: with the other
                nodes' dumps (or --api's placement) each pod's count is held
                against its node's share, and an uneven split is named:
                placement (pods per node), the balancer, or the rules
--conntrack FILE
                conntrack -L of the same node (conntrack -L > FILE 2>&1, any
                -o form): which endpoints its open connections are pinned to,
                per service port (its cluster IP, external and load-balancer
                IPs, node ports as the dump writes them); how much of its
                traffic is on long-lived entries (TCP ESTABLISHED and
                ASSURED, with their remaining timeout) and whether their split
                is the rules' (chi-square, Holm, intervals); entries to
                endpoints the rules no longer list (stale UDP entries are a
                finding: kube-proxy's cleanup deletes them)

Exit codes: 0 nothing wrong; 1 a finding; 2 bad input or usage.`,
		RunE: func(c *cobra.Command, _ []string) error {
			return runDiagnose(s.Out, &f)
		},
	}
	c.Flags().StringVar(&f.iptables, "iptables-save", "", "iptables-save -c output of the node")
	c.Flags().StringVar(&f.nft, "nft", "", "nft list ruleset (or nft -j list ruleset) output of the node")
	c.Flags().StringVar(&f.ipvs, "ipvsadm", "", "ipvsadm -Ln --stats --exact output (optionally followed by ipvsadm -Lnc)")
	c.Flags().StringVar(&f.before, "before", "", "an earlier dump of the same node in the same format: use the counter deltas")
	c.Flags().StringVar(&f.api, "api", "", "Kubernetes objects: kubectl get nodes,svc,endpointslices -A -o yaml, or a scenario file")
	c.Flags().StringVar(&f.node, "node", "", "the node the dump was taken on (default: inferred from --api)")
	c.Flags().StringArrayVar(&f.peers, "peer", nil, "[NODE=]FILE: another node's dump in the same format (repeatable): externalTrafficPolicy Local pods held against their node's share")
	c.Flags().StringVar(&f.conntrack, "conntrack", "", "conntrack -L output of the same node: pinned and long-lived connections per service port, stale entries")
	c.Flags().Float64Var(&f.alpha, "alpha", diagnose.DefaultAlpha, "family-wise level of the dump's tests (Holm over its ports)")
	c.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table, json or markdown")
	c.Flags().StringVar(&f.out, "out", "", "also write report.json and report.md into this folder")
	return c
}

func runDiagnose(w io.Writer, f *diagnoseFlags) error {
	var format diagnose.Format
	var file string
	n := 0
	for _, x := range []struct {
		v string
		f diagnose.Format
	}{{f.iptables, diagnose.FormatIPTablesSave}, {f.nft, diagnose.FormatNFT}, {f.ipvs, diagnose.FormatIPVSAdm}} {
		if x.v != "" {
			n++
			format, file = x.f, x.v
		}
	}
	if n != 1 {
		return &UsageError{Err: errors.New("give exactly one of --iptables-save FILE, --nft FILE, --ipvsadm FILE (see sim diagnose --help)")}
	}
	if !(f.alpha > 0 && f.alpha < 1) {
		return &UsageError{Err: fmt.Errorf("--alpha %g: want a level in (0, 1)", f.alpha)}
	}
	switch f.output {
	case "table", "json", "markdown":
	default:
		return &UsageError{Err: fmt.Errorf("unknown output format %q: use table, json or markdown", f.output)}
	}
	for _, p := range f.peers {
		if _, file := peerArg(p); file == "" {
			return &UsageError{Err: fmt.Errorf("--peer %q: want [NODE=]FILE", p)}
		}
	}
	d, err := readDump(format, file)
	if err != nil {
		return err
	}
	opt := diagnose.Options{Alpha: f.alpha, Node: f.node}
	if f.before != "" {
		if opt.Before, err = readDump(format, f.before); err != nil {
			return err
		}
	}
	if f.api != "" {
		if opt.API, err = diagnose.LoadAPI(f.api); err != nil {
			return err
		}
	}
	if f.conntrack != "" {
		if opt.Conntrack, err = readConntrack(f.conntrack); err != nil {
			return err
		}
	}
	for _, p := range f.peers {
		node, file := peerArg(p)
		pd, err := readDump(format, file)
		if err != nil {
			return err
		}
		opt.Peers = append(opt.Peers, diagnose.Peer{Node: node, Dump: pd})
	}
	r := diagnose.Analyze(d, opt)
	switch f.output {
	case "json":
		err = r.WriteJSON(w)
	case "markdown":
		err = r.WriteMarkdown(w)
	default:
		err = r.WriteTable(w)
	}
	if err != nil {
		return err
	}
	if f.out != "" {
		if err := r.WriteDir(f.out); err != nil {
			return err
		}
	}
	if r.Problems() {
		var failed []string
		seen := map[string]bool{}
		for _, x := range r.Findings {
			if k := strings.TrimSpace(x.Kind + " " + x.Port); x.Level == diagnose.LevelFinding && !seen[k] {
				seen[k] = true
				failed = append(failed, k)
			}
		}
		return &CheckFailedError{Failed: failed}
	}
	return nil
}

// peerArg splits --peer's [NODE=]FILE.
func peerArg(p string) (node, file string) {
	node, file, ok := strings.Cut(p, "=")
	if !ok {
		return "", p
	}
	return node, file
}
