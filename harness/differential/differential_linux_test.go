package differential

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// outEnv names a folder where the tests also write every difference found,
// one file per mode and kind (differential-<mode>-<kind>.txt), for the
// people fixing them; unset: only the test's own temporary folder.
const outEnv = "KPSIM_DIFFERENTIAL_OUT"

var modes = []cluster.Mode{cluster.ModeIPTables, cluster.ModeNFTables}

// differences collects what a test found, for its files and its summary.
type differences struct {
	t     *testing.T
	mode  cluster.Mode
	kind  string
	dir   string
	text  strings.Builder
	count int
}

func newDifferences(t *testing.T, mode cluster.Mode, kind string) *differences {
	return &differences{t: t, mode: mode, kind: kind, dir: t.TempDir()}
}

// record reports one differing comparison: the failure names where
// (scenario seeds or file, step), prints the first 60 diff lines and
// writes both rulesets into the test's temporary folder.
func (d *differences) record(where string, r Result, attributed map[string][]string) {
	d.t.Helper()
	d.count++
	base := filepath.Join(d.dir, fmt.Sprintf("%03d", d.count))
	for suffix, text := range map[string]string{"upstream": r.Upstream, "ours": r.Ours} {
		if err := os.WriteFile(base+"-"+suffix+".txt", []byte(text), 0o644); err != nil {
			d.t.Fatal(err)
		}
	}
	head := r.Diff[:min(60, len(r.Diff))]
	d.t.Errorf("%s mode, %s, node %s: %d normalized lines differ (- kube-proxy only, + ours only; rulesets in %s-{upstream,ours}.txt); first %d:\n%s",
		d.mode, where, r.Node, len(r.Diff), base, len(head), strings.Join(head, "\n"))
	fmt.Fprintf(&d.text, "=== %s, node %s: %d lines differ\n", where, r.Node, len(r.Diff))
	for _, k := range SortedKeys(attributed) {
		name := k
		if name == "" {
			name = "not attributable to one scenario"
		}
		fmt.Fprintf(&d.text, "--- %s\n%s\n", name, strings.Join(attributed[k], "\n"))
	}
}

// flush writes the collected differences where outEnv says.
func (d *differences) flush() {
	dir := os.Getenv(outEnv)
	if dir == "" {
		return
	}
	p := filepath.Join(dir, fmt.Sprintf("differential-%s-%s.txt", d.mode, d.kind))
	text := fmt.Sprintf("# %s mode, %s: %d differing comparisons (%s)\n%s", d.mode, d.kind, d.count, time.Now().UTC().Format(time.RFC3339), d.text.String())
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		d.t.Errorf("could not write %s: %v", p, err)
	}
}

func requireDifferential(t *testing.T) upstream.Binaries {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.SkipIfShort(t, "starts etcd, kube-apiserver and kube-proxy and compares hundreds of rulesets (minutes)")
	testenv.RequireCommands(t, "iptables-save", "iptables-restore", "nft")
	return upstream.FindForTest(t)
}

// TestDifferentialRandom runs RandomScenarios seeded random scenarios per
// mode, split by PlanRandom into a small and a large regime (an Env each),
// comparing after every step of every batch.
func TestDifferentialRandom(t *testing.T) {
	bin := requireDifferential(t)
	t.Parallel()
	plan := PlanRandom(1, RandomScenarios, DefaultGenConfig())
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			diffs := newDifferences(t, mode, "random")
			defer diffs.flush()
			total := 0
			for _, r := range plan {
				total += runRegime(t, bin, mode, r, diffs)
			}
			t.Logf("%s mode: %d scenarios, %d differing comparisons, in %s", mode, total, diffs.count, time.Since(start).Round(time.Second))
			if total < 500 {
				t.Errorf("%d scenarios run, want at least 500", total)
			}
		})
	}
}

// runRegime runs one regime's batches in a fresh Env and returns its
// scenarios. Every comparison of the small regime must have stayed at or
// under the large-cluster threshold at every moment, every one of the
// large regime over it.
func runRegime(t *testing.T, bin upstream.Binaries, mode cluster.Mode, r Regime, diffs *differences) int {
	t.Helper()
	start := time.Now()
	gc := DefaultGenConfig()
	cfg := Config{
		Mode: mode, Bin: bin, Log: testLog{t},
		Nodes:       []Node{{Name: gc.Node, IP: mustAddr("198.18.0.1"), Labels: map[string]string{"topology.kubernetes.io/zone": gc.Zone}}},
		NodeNetwork: mustPrefix("198.18.0.0/16"), ClusterCIDR: gc.PodCIDR, ServiceCIDR: gc.ServiceCIDR,
		SyncPeriod: time.Hour, Ballast: r.Ballast,
		// Stale chains keep their rules only in iptables mode's
		// large-cluster mode.
		Rounds: mode == cluster.ModeIPTables && r.Ballast > 0,
	}
	env, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.Close(); err != nil {
			t.Error(err)
		}
	}()
	var st stats
	before := diffs.count
	for _, scs := range r.Batches {
		err := env.RunBatch(context.Background(), scs, func(c Comparison) error {
			st.add(c)
			for _, res := range c.Results {
				if len(res.Diff) > 0 {
					diffs.record(fmt.Sprintf("%s regime, batch of seeds %d-%d, step %d (%d endpoints)", r.Name, scs[0].Seed, scs[len(scs)-1].Seed, c.Step, c.Endpoints), res, Attribute(res.Diff, scs))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		st.scenarios += len(scs)
		for _, sc := range scs {
			st.steps += len(sc.Steps)
		}
	}
	t.Logf("%s mode, %s regime (kube-proxy %s, ballast %d): %d scenarios in %d batches, %d steps, %d comparisons (%d over 1,000 endpoints), %d differing, in %s",
		mode, r.Name, env.Version(), r.Ballast, st.scenarios, len(r.Batches), st.steps, st.comparisons, st.large, diffs.count-before, time.Since(start).Round(time.Second))
	if r.Ballast == 0 && st.peakLarge > 0 || r.Ballast > 0 && st.large < st.comparisons {
		t.Errorf("%s regime: %d of %d comparisons peaked over %d endpoints, %d ended over it", r.Name, st.peakLarge, st.comparisons, LargeClusterThreshold, st.large)
	}
	return st.scenarios
}

type stats struct{ scenarios, steps, comparisons, large, peakLarge int }

func (s *stats) add(c Comparison) {
	s.comparisons++
	if c.Endpoints > LargeClusterThreshold {
		s.large++
	}
	if c.Peak > LargeClusterThreshold {
		s.peakLarge++
	}
}

// scenarioFiles lists the files of scenarios/ the comparison covers, with
// the nodes compared on each: every file on its first node, the
// 1,000-Service file on two of its nodes. 30000-services.yaml is the opt-in
// TestDifferentialLarge (build tag differential_large).
func scenarioFiles(t *testing.T) map[string][]string {
	t.Helper()
	root := filepath.Join("..", "..", "scenarios")
	files := map[string][]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		switch filepath.Base(p) {
		case "30000-services.yaml":
			return nil
		case "1000-services.yaml":
			files[p] = []string{"", ""} // two nodes, chosen once expanded
			return nil
		}
		files[p] = nil
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDifferentialScenarios compares every file of scenarios/ (expanded and
// seeded into a fresh control plane) in both modes; files whose modes list
// has neither iptables nor nftables (IPVS-only) are skipped.
func TestDifferentialScenarios(t *testing.T) {
	bin := requireDifferential(t)
	files := scenarioFiles(t)
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	slices.Sort(names)
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			diffs := newDifferences(t, mode, "scenarios")
			defer diffs.flush()
			compared := 0
			for _, f := range names {
				if compareFile(t, bin, mode, f, len(files[f]), diffs) {
					compared++
				}
			}
			t.Logf("%s mode: %d scenario files compared, %d differing comparisons, in %s", mode, compared, diffs.count, time.Since(start).Round(time.Second))
		})
	}
}

// compareFile compares one scenario file on nodes nodes (0: the first one);
// false when the file does not run in mode.
func compareFile(t *testing.T, bin upstream.Binaries, mode cluster.Mode, file string, nodes int, diffs *differences) bool {
	t.Helper()
	l, err := scenario.LoadFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	// Only IPVS-only files are skipped: a file without proxy.modes reads
	// as [iptables] after defaults, and its objects are as valid in
	// nftables mode.
	if m := l.Scenario.Proxy.Modes; len(m) > 0 && !slices.Contains(m, cluster.ModeIPTables) && !slices.Contains(m, cluster.ModeNFTables) {
		t.Logf("%s: an IPVS-only scenario (modes %v)", file, m)
		return false
	}
	exp, err := scenario.Expand(l, nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var pick []string
	for i := 0; i < nodes && i < len(exp.Nodes); i++ {
		pick = append(pick, exp.Nodes[i].Name)
	}
	cfg, err := ScenarioConfig(exp, mode, pick)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Bin, cfg.Log = bin, testLog{t}
	env, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	defer func() {
		if err := env.Close(); err != nil {
			t.Error(err)
		}
	}()
	res, err := env.Compare()
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for _, r := range res {
		if len(r.Diff) > 0 {
			diffs.record(file, r, map[string][]string{"": r.Diff})
		}
	}
	return true
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
