// Package conform runs conformance scenarios against the real dataplane: it
// builds the scenario's namespaces, programs every node with the chosen
// mode, sends probe connections from the client pods, counts what the
// backends receive, and decides each check against the oracle (sim/oracle)
// with the statistics of harness/stats. One run is one family of tests:
// every check is sized at the first Holm level (α_F / m) and the verdicts
// are Holm-corrected together.
package conform

import (
	"context"
	"errors"
	"fmt"
	"io"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/ipvs"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Options configure a run.
type Options struct {
	Mode cluster.Mode
	// Subject is the proxy under test: SubjectKPSim (empty: the default)
	// or SubjectKubeProxy. SubjectVersion is its version for the report
	// (the caller knows it: the sim binary's, or Binaries.Version()).
	Subject        string
	SubjectVersion string
	// KubeProxy are the binaries of the kube-proxy subject
	// (upstream.Find).
	KubeProxy upstream.Binaries
	Faults    []string
	// Seed overrides every scenario's seed when set.
	Seed *uint64
	// IPTablesBackend ("nft" or "legacy") and IPTablesAffinity ("recent"
	// or "ipset") override the scenarios' proxy section when set.
	IPTablesBackend  string
	IPTablesAffinity string
	// NFTablesLayout ("kube-proxy" or "fast") overrides the scenarios'
	// proxy.nftablesLayout when set.
	NFTablesLayout string
	// NFTTimeout bounds each nft transaction of our nftables dataplane
	// (sim conform --nft-timeout; 0: nftables.CallBound's size-derived
	// bound).
	NFTTimeout time.Duration
	// FamilyAlpha is the family-wise error rate of the whole run (default
	// stats.DefaultFamilyAlpha).
	FamilyAlpha float64
	// FixedSize samples every distribution check at the fixed-size
	// chi-square's n in one look, instead of sequentially (sim conform
	// --fixed: the p-values of --repeat are then uniform on a correct
	// dataplane).
	FixedSize bool
	// Equivalence, when positive, adds to every distribution check an
	// equivalence verdict: every endpoint's share within (1 +- Equivalence)
	// of the expected one (TOST at EquivalenceAlpha).
	Equivalence      float64
	EquivalenceAlpha float64
	// Dump, when set, is a folder (absent or empty) that receives, around
	// every check, the dumps of the client node's rules before and after
	// it, the API objects and a manifest with the run's verdicts (dump.go).
	Dump string
	// Log receives progress lines (nil: discarded).
	Log io.Writer
}

// EnvironmentError means this machine cannot run the conformance suite
// (not root, a command or kernel feature missing); the message says what.
type EnvironmentError struct{ Err error }

func (e *EnvironmentError) Error() string { return e.Err.Error() }
func (e *EnvironmentError) Unwrap() error { return e.Err }

// FaultCatches names, for each fault, the check type that must catch it in
// scenarios/conformance: the harness's claim about its own power.
var FaultCatches = map[proxy.Fault]string{
	proxy.FaultUniformProbability:  "distribution",
	proxy.FaultKeepNotReady:        "flapping",
	proxy.FaultIgnoreLocalPolicy:   "internal-traffic-local",
	proxy.FaultAffinityNoTimeout:   "affinity",
	proxy.FaultKeepDeletedEndpoint: "terminating",
	proxy.FaultDropLastEndpoint:    "distribution",
	proxy.FaultSkewAtMDE:           "distribution",
	proxy.FaultAffinityLeak:        "affinity",
	proxy.FaultAffinityOverstay:    "affinity",
	proxy.FaultLocalMasquerade:     "source-address",
	proxy.FaultLocalIgnored:        "external-distribution",
	proxy.FaultHealthCheckStale:    "health-check",
	proxy.FaultSourceRangesOpen:    "source-ranges",
	proxy.FaultHairpinNoMasquerade: "hairpin",
	proxy.FaultNoConntrackCleanup:  "udp-flow",
	proxy.FaultConntrackFlushAll:   "tcp-established",
}

// Timing bounds.
const (
	settleTimeout = 30 * time.Second
	stickyRounds  = 5
	maxExpiryWait = 10 * time.Second // affinity expiry is checked when timeoutSeconds <= 10
)

// Preflight checks that the machine can run mode: root, and the commands.
func Preflight(o Options) error {
	if !o.Mode.Valid() {
		return fmt.Errorf("unknown mode %q (valid: %s)", o.Mode, cluster.ModeList())
	}
	if os.Geteuid() != 0 {
		return &EnvironmentError{errors.New("sim conform needs root: it creates network namespaces and programs netfilter inside them (nothing on the host is changed)")}
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return &EnvironmentError{errors.New("the ip command is missing (Debian package iproute2)")}
	}
	for _, v := range []string{"nft", "legacy"} {
		if o.IPTablesBackend != "" && o.IPTablesBackend != v {
			continue
		}
		if err := iptables.CheckTools(v, o.IPTablesAffinity == "ipset" || o.Mode == cluster.ModeIPVS); err != nil && (o.IPTablesBackend != "" || v == "nft") {
			return &EnvironmentError{err}
		}
	}
	if o.Mode == cluster.ModeNFTables {
		if _, err := exec.LookPath("nft"); err != nil {
			return &EnvironmentError{errors.New("the nft command is missing (Debian package nftables)")}
		}
	}
	if o.Mode == cluster.ModeIPVS {
		if err := ipvs.Available(); err != nil {
			return &EnvironmentError{fmt.Errorf("%w; sim conform runs IPVS mode in its microVM on such a host (harness/vm)", err)}
		}
	}
	return nil
}

// Run loads every scenario (all of them must be valid before anything is
// created), runs each in namespaces of its own, and returns the report. The
// error is non-nil only for bad input, a missing environment, or a failure
// to report; failed checks are in the report (Run.Failed).
func Run(ctx context.Context, files []string, o Options) (*report.Run, error) {
	o, faults, loaded, err := load(files, o)
	if err != nil {
		return nil, err
	}
	if err := Preflight(o); err != nil {
		return nil, err
	}
	var d *dumper
	if o.Dump != "" {
		if d, err = newDumper(o.Dump); err != nil {
			return nil, err
		}
	}
	run := execute(ctx, loaded, o, func(ctx context.Context, l *scenario.Loaded, alphaUnit float64, run *report.Run) *report.Suite {
		return runSuite(ctx, l, o, faults, alphaUnit, run, d)
	})
	if d != nil {
		if err := d.finish(run); err != nil {
			return run, err
		}
	}
	return run, ctx.Err()
}

// load reads every scenario and the options' defaults and faults. Bad input
// comes first (exit 2), so that a scenario is checked, checks resolved
// included, on any machine, before the environment is.
func load(files []string, o Options) (Options, proxy.Faults, []*scenario.Loaded, error) {
	if o.FamilyAlpha == 0 {
		o.FamilyAlpha = stats.DefaultFamilyAlpha
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	faults, err := proxy.ParseFaults(o.Faults)
	if err != nil {
		return o, nil, nil, err
	}
	for _, f := range faults.Names() {
		if why := proxy.Fault(f).NotBuilt(o.Mode); why != "" {
			return o, nil, nil, proxy.NotBuiltError(proxy.Fault(f), o.Mode, why)
		}
	}
	var loaded []*scenario.Loaded
	for _, f := range files {
		l, err := scenario.LoadFile(f)
		if err != nil {
			return o, nil, nil, err
		}
		if _, err := scenario.Expand(l, o.Seed); err != nil {
			return o, nil, nil, err
		}
		loaded = append(loaded, l)
	}
	return o, faults, loaded, nil
}

// execute runs every scenario with runOne, each check sized at the first
// Holm level of the whole run, and applies Holm over the run's verdicts.
func execute(ctx context.Context, loaded []*scenario.Loaded, o Options, runOne func(context.Context, *scenario.Loaded, float64, *report.Run) *report.Suite) *report.Run {
	faults, _ := proxy.ParseFaults(o.Faults) // load checked them
	run := &report.Run{Mode: string(o.Mode), Subject: subjectName(o.Subject), SubjectVersion: o.SubjectVersion, Kernel: kernelRelease(), FamilyAlpha: o.FamilyAlpha, Faults: faults.Names(), Started: time.Now()}
	if o.Seed != nil {
		run.Seed = *o.Seed
	} else if len(loaded) > 0 {
		run.Seed = *loaded[0].Scenario.Seed
	}
	units := plannedVerdicts(loaded, o.Mode, o.Seed)
	alphaUnit := o.FamilyAlpha / float64(max(units, 1))
	fmt.Fprintf(o.Log, "conform: %d scenarios, %d verdicts planned, each sized at alpha %.3g (family %.3g, Holm)\n", len(loaded), units, alphaUnit, o.FamilyAlpha)
	for _, l := range loaded {
		if ctx.Err() != nil {
			break
		}
		run.Suites = append(run.Suites, runOne(ctx, l, alphaUnit, run))
	}
	holm(run, o.FamilyAlpha)
	run.Duration = time.Since(run.Started)
	return run
}

// plannedVerdicts is m: the verdicts the run will make, known before any
// namespace exists.
func plannedVerdicts(loaded []*scenario.Loaded, mode cluster.Mode, seed *uint64) int {
	units := 0
	for _, l := range loaded {
		units += plannedUnits(l, mode, seed)
	}
	return units
}

// filesIn lists the scenario files of a directory, sorted.
func filesIn(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			out = append(out, dir+"/"+e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// KernelRelease is uname -r.
func KernelRelease() string { return kernelRelease() }

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// clientNodes lists the nodes check c is evaluated from among all
// (scenario.Check.Nodes, the definition sim run uses too), its service port
// resolved in st. A check whose port does not resolve (validation rejects
// such a scenario: only one built in code gets here, and its verdicts
// report the error) is taken to check the port it names, of no protocol.
func clientNodes(sc *scenario.Scenario, c *scenario.Check, all []string, st *cluster.State) []string {
	t := scenario.Target{Service: c.Service, Port: c.Port}
	if st != nil {
		if n, err := cluster.ResolvePort(c.Service, c.Port, maps.Keys(st.Services)); err == nil {
			t = scenario.Target{Service: n.NamespacedName.String(), Port: n.Port, Protocol: string(n.Protocol)}
			if c.Type == scenario.CheckHairpin {
				return hairpinNodes(c, st, n)
			}
		}
	}
	return c.Nodes(sc, all, t)
}

// hairpinNodes are the nodes a hairpin check runs on: those with a ready
// endpoint of the port (the topology makes the first one a pod of its own,
// topology.GroupHairpin), within the check's clientNodes when it names
// them.
func hairpinNodes(c *scenario.Check, st *cluster.State, spn cluster.ServicePortName) []string {
	var out []string
	for _, n := range st.SortedNodes() {
		if len(c.ClientNodes) > 0 && !slices.Contains(c.ClientNodes, n) {
			continue
		}
		if slices.ContainsFunc(st.Endpoints[spn], func(e *cluster.Endpoint) bool { return e.Ready && e.NodeName == n }) {
			out = append(out, n)
		}
	}
	return out
}

// plannedUnits counts the verdicts a scenario will produce in mode (not-run
// verdicts left out), the IPVS scheduler checks' (ipvsExtraUnits) with
// them: each check is evaluated from its clientNodes in the scenario's
// initial state, and the affinity checks ask their own plan (affinityUnits)
// there.
func plannedUnits(l *scenario.Loaded, mode cluster.Mode, seed *uint64) int {
	sc := l.Scenario
	var all []string
	for _, n := range sc.Cluster.Nodes {
		all = append(all, n.Name)
	}
	for i := 1; i <= sc.Cluster.NodeCount; i++ {
		all = append(all, scenario.NodeName(sc.Cluster.NodeNamePattern, i))
	}
	steps := len(apiserver.Timeline(sc))
	var st *cluster.State
	if len(sc.Checks) > 0 {
		st, _ = initialState(l, seed) // nil: load already checked the scenario
	}
	nodesOf := func(c *scenario.Check) []string { return clientNodes(sc, c, all, st) }
	n := ipvsExtraUnits(mode, sc, nodesOf)
	for i := range sc.Checks {
		c := &sc.Checks[i]
		nodes := nodesOf(c)
		switch c.Type {
		case scenario.CheckAffinity:
			if st == nil {
				n += 3 * max(1, len(nodes))
				continue
			}
			or := oracle.Oracle{IPVSScheduler: sc.Proxy.IPVSScheduler}
			r, _ := affinityUnits(or, mode, sc.Proxy.IPVSScheduler, st, c, nodes)
			n += r
		case scenario.CheckFlapping, scenario.CheckTerminating, scenario.CheckHealthCheck:
			n += (1 + steps) * max(1, len(nodes))
		case scenario.CheckSourceRanges:
			n += 2 * max(1, len(nodes))
		case scenario.CheckUDPFlow, scenario.CheckTCPEstablished, scenario.CheckAffinityMoves:
			n += len(establishedPhases(c.Type)) * max(1, len(nodes))
		case scenario.CheckExternalAffinity:
			n += max(1, len(nodes))
			if len(nodes) > 1 {
				n++ // across the entry nodes
			}
		case scenario.CheckServiceCIDR:
			if mode != cluster.ModeNFTables {
				continue // not run
			}
			n += 2 * max(1, len(nodes))
		default:
			n += max(1, len(nodes))
		}
	}
	return n
}

// initialState is the scenario's API state before any event, built from its
// expanded objects the way the proxies' trackers see them.
func initialState(l *scenario.Loaded, seed *uint64) (*cluster.State, error) {
	exp, err := scenario.Expand(l, seed)
	if err != nil {
		return nil, err
	}
	tr := cluster.NewTracker()
	for _, n := range exp.Nodes {
		tr.OnNode(n.Name, n)
	}
	for _, s := range exp.Services {
		tr.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s)
	}
	for _, sl := range exp.Slices {
		tr.OnEndpointSlice(sl.Namespace, sl.Name, sl, sl.Labels[discoveryv1.LabelServiceName])
	}
	st, _ := tr.Drain()
	return st, nil
}

// holm applies Holm's step-down over every verdict of the run that has a
// p-value; a check fails when Holm rejects its null hypothesis.
func holm(run *report.Run, alpha float64) {
	var checks []*report.Check
	var ps []float64
	for _, s := range run.Suites {
		for _, c := range s.Checks {
			if c.Verdict == report.Error || c.Verdict == report.NotRun || c.Type == typeEquivalence {
				continue
			}
			checks = append(checks, c)
			ps = append(ps, c.P)
		}
	}
	rejected := stats.Holm(ps, alpha)
	adjusted := stats.HolmAdjusted(ps)
	for i, c := range checks {
		if rejected[i] {
			c.Verdict = report.Fail
			if c.Message == "" {
				c.Message = fmt.Sprintf("Holm-adjusted p %.3g <= family alpha %g", adjusted[i], alpha)
			}
		} else {
			c.Verdict = report.Pass
		}
	}
}

// configure opens the scenario's cluster model and resolves the options
// every machine shares: seed, random source, iptables variant and affinity
// layout, nftables layout, the oracle's settings. It returns the model and
// the iptables variant.
func (s *suite) configure(ctx context.Context, run *report.Run) (*apiserver.Model, string, error) {
	m, err := apiserver.OpenLoaded(ctx, s.l, s.o.Seed)
	if err != nil {
		return nil, "", err
	}
	s.m = m
	s.seed = m.Expanded.Seed
	s.rng = rand.New(rand.NewPCG(s.seed, 0x636f6e666f726d))
	px := s.l.Scenario.Proxy
	variant := px.IPTablesBackend
	if s.o.IPTablesBackend != "" {
		variant = s.o.IPTablesBackend
	}
	affinity := px.IPTablesAffinity
	if s.o.IPTablesAffinity != "" {
		affinity = s.o.IPTablesAffinity
	}
	s.ipset = affinity == "ipset"
	s.layout = px.NFTablesLayout
	if s.o.NFTablesLayout != "" {
		s.layout = s.o.NFTablesLayout
	}
	if s.o.Mode == cluster.ModeNFTables {
		run.Layout = s.layout
	}
	if s.ipset {
		s.or.RecentCapacity = proxy.IPSetMaxElem // the kernel set's, as sim run
	}
	run.IPTablesBackend = variant
	s.variant = variant
	s.or.IPVSScheduler = px.IPVSScheduler
	return m, variant, nil
}

// suite is one scenario being run.
type suite struct {
	o    Options
	l    *scenario.Loaded
	m    *apiserver.Model
	topo *netns.Topology
	// px is the proxy under test on the suite's nodes (the subject).
	px proxies
	// mc is where the checks run: the kernel (setup) or, in the harness
	// calibration, the simulator's engines.
	mc        machine
	rng       *rand.Rand
	seed      uint64
	alphaUnit float64
	out       *report.Suite
	or        oracle.Oracle
	start     time.Time
	ipset     bool
	layout    string // nftables layout
	variant   string // iptables backend: nft or legacy
	// dumps is the suite's part of the --dump folder, nil when not dumping.
	dumps *suiteDumps
	// remote is a run on a cluster through its API (clusterSuite).
	remote bool
	// rejectGap paces the probes of a check that expects every probe
	// rejected (RemoteOptions.RejectInterval); zero in the namespace run,
	// whose nodes lift their ICMP rate limits.
	rejectGap time.Duration
}

func runSuite(ctx context.Context, l *scenario.Loaded, o Options, faults proxy.Faults, alphaUnit float64, run *report.Run, d *dumper) *report.Suite {
	start := time.Now()
	out := &report.Suite{Scenario: l.Scenario.Metadata.Name, File: l.File, Figures: map[string]any{}}
	fmt.Fprintf(o.Log, "conform: %s (%s)\n", out.Scenario, l.File)
	s := &suite{o: o, l: l, alphaUnit: alphaUnit, out: out, start: start}
	if d != nil {
		s.dumps = d.suite(out.Scenario)
	}
	defer func() { out.Duration = time.Since(start) }()
	if err := s.setup(ctx, faults, run); err != nil {
		out.SetupError = err.Error()
		if env := (*EnvironmentError)(nil); errors.As(err, &env) {
			out.SetupErrorKind = report.KindEnvironment
		}
		s.teardown()
		return out
	}
	defer s.teardown()
	fmt.Fprintf(o.Log, "conform: %s: %d nodes synced, sampling\n", out.Scenario, s.px.nodes())
	s.runChecks(ctx)
	if k, ok := s.mc.(*kernelMachine); ok {
		s.reportRate(k.prober)
	}
	return out
}

// reportRate records the generator's rate in the suite's figures.
func (s *suite) reportRate(p *Prober) {
	out, o := s.out, s.o
	if n, d := p.Rate(); n > 0 && d > 0 {
		out.Figures["probes"] = n
		out.Figures["probesPerSecond"] = float64(n) / d.Seconds()
		fmt.Fprintf(o.Log, "conform: %s: %d probes at %.0f new connections/s\n", out.Scenario, n, float64(n)/d.Seconds())
	}
}

// setup resolves the run's options, builds the scenario's namespaces,
// starts each node's proxy and waits for its first sync, then opens the
// prober that the checks send through.
func (s *suite) setup(ctx context.Context, faults proxy.Faults, run *report.Run) error {
	m, variant, err := s.configure(ctx, run)
	if err != nil {
		return err
	}
	if err := iptables.CheckTools(variant, s.ipset || s.o.Mode == cluster.ModeIPVS); err != nil {
		return err
	}
	topo, err := s.buildNamespaces(ctx, m)
	if err != nil {
		return err
	}
	px, err := s.newProxies(variant, faults)
	if err != nil {
		return err
	}
	s.px = px
	if err := px.start(ctx, topo); err != nil {
		return err
	}
	p, err := NewProber(ctx, topo)
	if err != nil {
		return err
	}
	s.mc = &kernelMachine{s: s, prober: p, start: time.Now()}
	if s.o.Mode == cluster.ModeIPVS {
		if err := s.keepResets(); err != nil {
			return err
		}
	}
	return nil
}

// buildNamespaces builds the scenario's nodes and pods as namespaces under
// a new run ID, and keeps the topology for teardown.
func (s *suite) buildNamespaces(ctx context.Context, m *apiserver.Model) (*netns.Topology, error) {
	id, err := netns.NewRunID()
	if err != nil {
		return nil, err
	}
	cfg, err := topology.FromModel(m, id)
	if err != nil {
		return nil, err
	}
	if s.o.Subject == SubjectKubeProxy {
		if cfg.ControlPlane, err = controlPlanePrefix(cfg); err != nil {
			return nil, fmt.Errorf("could not place the control plane: %w", err)
		}
	}
	fmt.Fprintf(s.o.Log, "conform: %s: building namespaces (run %s)\n", s.out.Scenario, id)
	topo, err := netns.Build(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("could not build the namespaces: %w", err)
	}
	s.topo = topo
	fmt.Fprintf(s.o.Log, "conform: %s: namespaces built, syncing\n", s.out.Scenario)
	return topo, nil
}

func (s *suite) teardown() {
	fmt.Fprintf(s.o.Log, "conform: %s: tearing down\n", s.out.Scenario)
	if s.px != nil {
		s.px.stop()
	}
	if k, ok := s.mc.(*kernelMachine); ok {
		k.prober.Close()
	}
	if s.px != nil {
		s.px.close()
	}
	if s.topo != nil {
		fmt.Fprintf(s.o.Log, "conform: %s: removing namespaces\n", s.out.Scenario)
		if err := s.topo.Close(); err != nil {
			s.out.SetupError = strings.TrimSpace(s.out.SetupError + " teardown: " + err.Error())
		}
	}
	if s.m != nil {
		s.m.Close()
	}
	fmt.Fprintf(s.o.Log, "conform: %s: torn down\n", s.out.Scenario)
}

// state drains the model's own tracker: the API state the checks expect.
func (s *suite) state() *cluster.State {
	st, _ := s.m.Tracker.Drain()
	return st
}

// clientOn returns the first client pod on a node.
func (s *suite) clientOn(nodeName string) *netns.Client {
	for _, c := range s.mc.clients() {
		if c.Node == nodeName {
			return c
		}
	}
	return nil
}

func (s *suite) spn(c *scenario.Check) (cluster.ServicePortName, *cluster.ServicePort, error) {
	st := s.state()
	n, err := cluster.ResolvePort(c.Service, c.Port, maps.Keys(st.Services))
	if err != nil {
		return cluster.ServicePortName{}, nil, err
	}
	return n, st.Services[n], nil
}

func (s *suite) runChecks(ctx context.Context) {
	sc := s.l.Scenario
	allNodes := s.state().SortedNodes()
	var timelineChecks []*scenario.Check
	for i := range sc.Checks {
		c := &sc.Checks[i]
		if ctx.Err() != nil {
			return
		}
		nodes := clientNodes(sc, c, allNodes, s.state())
		if why := s.notRunnable(c); why != "" {
			s.out.Checks = append(s.out.Checks, &report.Check{Name: c.Name, Type: c.Type, Service: c.Service, Verdict: report.NotRun, Message: why})
			continue
		}
		switch c.Type {
		case scenario.CheckFlapping, scenario.CheckTerminating, scenario.CheckHealthCheck:
			timelineChecks = append(timelineChecks, c)
			s.stateChecks(ctx, c, nodes, "initial")
		case scenario.CheckExternalLocalBalance:
			s.dumped(ctx, c, "", "", func() { s.localBalance(ctx, c) })
		case scenario.CheckSourceRanges:
			for _, nd := range nodes {
				for _, ph := range []string{phaseAllowed, phaseDenied} {
					s.dumped(ctx, c, nd, ph, func() { s.outcomeCheck(ctx, c, nd, ph) })
				}
			}
		case scenario.CheckServiceCIDR:
			for _, nd := range nodes {
				for _, ph := range []string{phaseUnknownPort, phaseUnallocated} {
					s.dumped(ctx, c, nd, ph, func() { s.outcomeCheck(ctx, c, nd, ph) })
				}
			}
		case scenario.CheckAffinity:
			for _, nd := range nodes {
				s.dumped(ctx, c, nd, "", func() { s.affinity(ctx, c, nd) })
			}
		case scenario.CheckUDPFlow, scenario.CheckTCPEstablished, scenario.CheckAffinityMoves:
			s.established(ctx, c, nodes)
		case scenario.CheckExternalAffinity:
			for _, nd := range nodes {
				s.dumped(ctx, c, nd, "", func() { s.outcomeCheck(ctx, c, nd, "") })
			}
			if len(nodes) > 1 {
				s.dumped(ctx, c, "", phaseAcross, func() { s.affinityAcross(ctx, c, nodes) })
			}
		default:
			for _, nd := range nodes {
				if s.o.Mode == cluster.ModeIPVS && c.Type == scenario.CheckDistribution {
					s.dumped(ctx, c, nd, "", func() { s.ipvsDistribution(ctx, c, nd) }) // scheduler-aware (ipvs.go)
					continue
				}
				s.dumped(ctx, c, nd, "", func() { s.outcomeCheck(ctx, c, nd, "") })
			}
		}
	}
	if len(timelineChecks) == 0 {
		return
	}
	var props []float64
	for i, step := range apiserver.Timeline(sc) {
		if ctx.Err() != nil {
			return
		}
		prop, err := s.mc.apply(ctx, step)
		if ae := (*applyError)(nil); errors.As(err, &ae) {
			s.out.Checks = append(s.out.Checks, &report.Check{Name: fmt.Sprintf("timeline step %d", i+1), Type: "timeline", Verdict: report.Error, Message: ae.Error()})
			return
		}
		if err != nil {
			for _, c := range timelineChecks {
				s.out.Checks = append(s.out.Checks, &report.Check{Name: c.Name + " @ step " + fmt.Sprint(i+1), Type: c.Type, Service: c.Service,
					Verdict: report.Error, ErrorKind: report.KindEnvironment, Message: "settle: " + err.Error()})
			}
			return
		}
		worst := time.Duration(0)
		for _, d := range prop {
			worst = max(worst, d)
		}
		props = append(props, worst.Seconds())
		phase := fmt.Sprintf("step %d (%s)", i+1, step)
		for _, c := range timelineChecks {
			s.stateChecks(ctx, c, clientNodes(sc, c, allNodes, s.state()), phase)
		}
	}
	if len(props) > 0 {
		sort.Float64s(props)
		s.out.Figures["propagationSeconds"] = map[string]float64{"p50": props[len(props)/2], "max": props[len(props)-1], "n": float64(len(props))}
	}
}

func (s *suite) stateChecks(ctx context.Context, c *scenario.Check, nodes []string, phase string) {
	if c.Type == scenario.CheckHealthCheck {
		s.dumped(ctx, c, "", phase, func() { s.healthCheck(ctx, c, phase) })
		return
	}
	for _, nd := range nodes {
		s.dumped(ctx, c, nd, phase, func() { s.outcomeCheck(ctx, c, nd, phase) })
	}
}

func (s *suite) zone(node string) string {
	if n := s.state().Nodes[node]; n != nil {
		return n.Zone
	}
	return ""
}

func appendDev(l []report.Deviation, d report.Deviation) []report.Deviation {
	for _, x := range l {
		if x == d {
			return l
		}
	}
	return append(l, d)
}

// notRunnable says why a check cannot run in the namespaces, or "": its
// port is SCTP (the probes are TCP and UDP), or an endpoint is a node's own
// address (a host-network pod, the API server behind default/kubernetes):
// the connection reaches the node namespace, where nothing counts it.
func (s *suite) notRunnable(c *scenario.Check) string {
	st := s.state()
	spn, sp, err := s.spn(c)
	if err != nil || sp == nil {
		return ""
	}
	if s.remote {
		if why := remoteNotRunnable(c); why != "" {
			return why
		}
	}
	if c.Type == scenario.CheckServiceCIDR && s.o.Mode != cluster.ModeNFTables {
		return "only kube-proxy's nftables mode filters the service CIDR (unknown ports rejected, unallocated addresses dropped); " + string(s.o.Mode) + " mode has no such rule"
	}
	if why := establishedNotRunnable(c, sp); why != "" {
		return why
	}
	if sp.Name.Protocol == "SCTP" {
		return "the port is SCTP and the probes are TCP and UDP only (the rules for it are programmed and checked by sim rules and the differential tests)"
	}
	for _, ep := range st.Endpoints[spn] {
		if node := topology.HostEndpoint(st, ep.IP); node != "" {
			return fmt.Sprintf("endpoint %s is node %s's own address (host network); a connection to it ends in the node namespace, where no observer counts it", ep.IP, node)
		}
	}
	return ""
}

func protoOf(sp *cluster.ServicePort) traffic.Proto {
	if sp.Name.Protocol == "UDP" {
		return traffic.UDP
	}
	return traffic.TCP
}
