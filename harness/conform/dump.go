package conform

// sim conform --dump DIR: around every check, the rules of the node the
// check's traffic crosses (the client's node: ClusterIP traffic is DNATed
// where it leaves the client pod) as the real tools print them, before and
// after the check, and the API objects at that moment, so that `sim
// diagnose` can be held against the run's own verdicts (harness/diagnose's
// round-trip tests).
//
// Layout (documented in harness/README.md, "Dumps"):
//
//	DIR/manifest.json                        the run and every dumped check
//	DIR/<NN>-<scenario>/<NNN>-<check>/       one folder per check on one node
//	    api.yaml                             kubectl get nodes,pods,svc,endpointslices -A -o yaml
//	    before.iptables-save, after.iptables-save   iptables-<backend>-save -c (iptables mode)
//	    before.nft, after.nft                nft list ruleset (nftables mode)
//	    before.nft.json, after.nft.json      nft -j list ruleset
//	    before.ipvsadm, after.ipvsadm        ipvsadm -Ln (ipvs mode)
//	    before.ipvsadm-stats, ...            ipvsadm -Ln --stats --exact
//	    before.ipvsadm-conns, ...            ipvsadm -Lnc
//
// Every command runs inside the node namespace (netns.Namespace.Exec);
// nothing is written outside DIR.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/harness/diagnose"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// ErrDumpDir is a --dump folder that cannot be used (bad usage).
var ErrDumpDir = errors.New("bad --dump folder")

// CheckDumpDir requires that dir does not exist or is an empty folder.
func CheckDumpDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w %s: %v", ErrDumpDir, dir, err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("%w %s: it is not empty (the dumps of a run go into a folder of their own)", ErrDumpDir, dir)
	}
	return nil
}

// dumper writes one run's dumps.
type dumper struct {
	dir      string
	mu       sync.Mutex // the suites run one after the other; held for clarity
	manifest diagnose.Manifest
	checks   map[*diagnose.DumpedCheck][]*report.Check
	suites   int
}

func newDumper(dir string) (*dumper, error) {
	if err := CheckDumpDir(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("could not create the dump folder: %w", err)
	}
	return &dumper{dir: dir, checks: map[*diagnose.DumpedCheck][]*report.Check{}}, nil
}

// suiteDumps is one scenario's part of a dump folder.
type suiteDumps struct {
	d     *dumper
	dir   string // relative to d.dir
	count int
}

func (d *dumper) suite(name string) *suiteDumps {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.suites++
	return &suiteDumps{d: d, dir: fmt.Sprintf("%02d-%s", d.suites, slug(name))}
}

// dumped runs check (which appends its verdicts to s.out.Checks) between
// two dumps of node's rules, when the run dumps; the check itself is not
// changed.
func (s *suite) dumped(ctx context.Context, c *scenario.Check, node, phase string, check func()) {
	if s.dumps == nil || s.topo == nil {
		check()
		return
	}
	dc := s.dumps.begin(ctx, s, c, node, phase)
	first := len(s.out.Checks)
	check()
	s.dumps.d.mu.Lock()
	s.dumps.d.checks[dc] = append(s.dumps.d.checks[dc], s.out.Checks[first:]...)
	s.dumps.d.mu.Unlock()
	s.dumps.capture(s, dc, "after", dc.After)
}

// begin makes the check's folder and writes the API objects and the
// "before" dump.
func (sd *suiteDumps) begin(ctx context.Context, s *suite, c *scenario.Check, node, phase string) *diagnose.DumpedCheck {
	sd.count++
	name := c.Name + "-" + node
	if phase != "" {
		name += "-" + phase
	}
	dc := &diagnose.DumpedCheck{Scenario: s.out.Scenario, File: s.l.File, Check: c.Name, Type: c.Type, Node: node, Phase: phase,
		Dir: filepath.Join(sd.dir, fmt.Sprintf("%03d-%s", sd.count, slug(name))), Before: map[string]string{}, After: map[string]string{}}
	if spn, sp, err := s.spn(c); err == nil && sp != nil {
		dc.ServicePort, dc.ClusterIP, dc.Port, dc.Protocol = spn.String(), sp.ClusterIP.String(), int(sp.Port), strings.ToLower(string(spn.Protocol))
	}
	if err := os.MkdirAll(filepath.Join(sd.d.dir, dc.Dir), 0o755); err != nil {
		dc.Errors = append(dc.Errors, err.Error())
	}
	if b, err := apiList(ctx, s); err != nil {
		dc.Errors = append(dc.Errors, "api.yaml: "+err.Error())
	} else if err := os.WriteFile(filepath.Join(sd.d.dir, dc.Dir, "api.yaml"), b, 0o644); err != nil {
		dc.Errors = append(dc.Errors, err.Error())
	} else {
		dc.API = "api.yaml"
	}
	sd.capture(s, dc, "before", dc.Before)
	sd.d.mu.Lock()
	sd.d.manifest.Checks = append(sd.d.manifest.Checks, dc)
	sd.d.mu.Unlock()
	return dc
}

// dumpCommand is one tool invocation of a mode's dump.
type dumpCommand struct {
	format string // diagnose's name, the file's suffix
	suffix string
	argv   []string
}

// dumpCommands are the mode's tools, as a user would run them on a node.
func dumpCommands(mode cluster.Mode, variant string) []dumpCommand {
	switch mode {
	case cluster.ModeIPTables:
		return []dumpCommand{{"iptables-save", "iptables-save", []string{iptables.Tool(variant, "save"), "-c"}}}
	case cluster.ModeNFTables:
		return []dumpCommand{
			{"nft", "nft", []string{"nft", "list", "ruleset"}},
			{"nft-json", "nft.json", []string{"nft", "-j", "list", "ruleset"}},
		}
	case cluster.ModeIPVS:
		return []dumpCommand{
			{"ipvsadm", "ipvsadm", []string{"ipvsadm", "-Ln"}},
			{"ipvsadm-stats", "ipvsadm-stats", []string{"ipvsadm", "-Ln", "--stats", "--exact"}},
			{"ipvsadm-conns", "ipvsadm-conns", []string{"ipvsadm", "-Lnc"}},
		}
	}
	return nil
}

// capture runs the mode's tools in the node namespace into when.<suffix>.
func (sd *suiteDumps) capture(s *suite, dc *diagnose.DumpedCheck, when string, files map[string]string) {
	n, ok := s.topo.Node(dc.Node)
	if !ok {
		dc.Errors = append(dc.Errors, "no node namespace "+dc.Node)
		return
	}
	for _, cmd := range dumpCommands(s.o.Mode, s.variant) {
		out, err := n.NS.Exec(cmd.argv[0], cmd.argv[1:]...)
		if err != nil {
			dc.Errors = append(dc.Errors, err.Error())
			continue
		}
		name := when + "." + cmd.suffix
		if err := os.WriteFile(filepath.Join(sd.d.dir, dc.Dir, name), out, 0o644); err != nil {
			dc.Errors = append(dc.Errors, err.Error())
			continue
		}
		files[cmd.format] = name
	}
}

// apiList is what `kubectl get nodes,pods,svc,endpointslices -A -o yaml`
// prints for the suite's API at this moment: a v1 List whose items carry
// apiVersion and kind.
func apiList(ctx context.Context, s *suite) ([]byte, error) {
	cl := s.m.Cluster.Client
	var items []runtime.RawExtension
	add := func(apiVersion, kind string, obj any) error {
		b, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		m["apiVersion"], m["kind"] = apiVersion, kind
		b, err = json.Marshal(m)
		if err != nil {
			return err
		}
		items = append(items, runtime.RawExtension{Raw: b})
		return nil
	}
	nodes, err := cl.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range nodes.Items {
		if err := add("v1", "Node", &nodes.Items[i]); err != nil {
			return nil, err
		}
	}
	pods, err := cl.CoreV1().Pods(corev1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if err := add("v1", "Pod", &pods.Items[i]); err != nil {
			return nil, err
		}
	}
	svcs, err := cl.CoreV1().Services(corev1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range svcs.Items {
		if err := add("v1", "Service", &svcs.Items[i]); err != nil {
			return nil, err
		}
	}
	slices, err := cl.DiscoveryV1().EndpointSlices(corev1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range slices.Items {
		if err := add(discoveryv1.SchemeGroupVersion.String(), "EndpointSlice", &slices.Items[i]); err != nil {
			return nil, err
		}
	}
	list := metav1.List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}, Items: items}
	b, err := json.Marshal(&list)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(b)
}

// finish fills the verdicts (final, after Holm) and writes the manifest.
func (d *dumper) finish(run *report.Run) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := &d.manifest
	m.Mode, m.Subject, m.Faults, m.Seed, m.Kernel, m.FamilyAlpha = run.Mode, run.Subject, run.Faults, run.Seed, run.Kernel, run.FamilyAlpha
	m.Layout = run.Layout
	if run.Mode == string(cluster.ModeIPTables) || run.Mode == string(cluster.ModeIPVS) {
		m.IPTablesBackend = run.IPTablesBackend
	}
	if m.Checks == nil {
		m.Checks = []*diagnose.DumpedCheck{}
	}
	for _, dc := range m.Checks {
		dc.Verdicts = dc.Verdicts[:0]
		for _, rc := range d.checks[dc] {
			dc.Verdicts = append(dc.Verdicts, diagnose.DumpedVerdict{Name: rc.Name, Phase: rc.Phase, Verdict: rc.Verdict, Test: rc.Test, P: rc.P, N: rc.N, Message: rc.Message})
		}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(d.dir, diagnose.ManifestFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("could not write the dump manifest: %w", err)
	}
	return nil
}

// slug makes a folder name of s: lower-case letters, digits and dashes.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimRight(b.String(), "-")
}
