// Package soak drives a long run of API churn through the real dataplane:
// seeded random changes (readiness flaps, scale up and down, endpoint
// deletions, Service creation and deletion, affinity and traffic-policy
// edits) are written through the cluster model's client-go fake clientset,
// so that informers feed every node's tracker, whose dataplane.Syncer
// programs the real backend in the node's namespace, exactly as in
// harness/conform. Optionally every K-th kernel apply fails for real (see
// FailApply). At the end, after every node has programmed the final
// tracker sequence, each node's kernel state must equal a fresh render of
// the final API state applied to a fresh namespace, nothing may be leaked
// (chains, sets, map elements, ipsets, namespaces) and the process's RSS
// must not grow with the number of changes.
//
//	sim soak FILE --mode M ─► scenario ─► apiserver.Model (fake clientset + informers)
//	     │                                      │ per node: Tracker ─► Syncer ─► counted Backend ─► node netns
//	     ▼                                      │                                     (apply wrapper: K-th fails)
//	 Generator (seeded) ── N changes ──► clientset
//	     │
//	     ▼ settle on tracker sequence numbers, then per node:
//	 canonical dump of node netns  ──diff──  canonical dump of a fresh netns after one full sync of the final state
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/backends"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Options configure a soak.
type Options struct {
	// Mode is cluster.ModeIPTables or cluster.ModeNFTables.
	Mode cluster.Mode
	// Events is the number of API changes (N).
	Events int
	// FailApplyEvery makes every K-th kernel apply fail (0: never).
	FailApplyEvery int
	// Seed overrides the scenario's seed when set.
	Seed *uint64
	// Interval is the mean pause between two changes (each pause is drawn
	// uniformly from [0, 2 Interval)).
	Interval time.Duration
	// IPTablesBackend and NFTablesLayout override the scenario's proxy
	// section when set.
	IPTablesBackend, NFTablesLayout string
	// SettleTimeout bounds the wait for the final state to be programmed.
	SettleTimeout time.Duration
	// Log receives progress lines (nil: discarded).
	Log io.Writer
}

// Validate checks the options that do not need the scenario.
func (o *Options) Validate() error {
	var errs []string
	if o.Mode != cluster.ModeIPTables && o.Mode != cluster.ModeNFTables {
		errs = append(errs, fmt.Sprintf("unknown --mode %q: iptables or nftables", o.Mode))
	}
	if o.Events < 1 || o.Events > MaxEvents {
		errs = append(errs, fmt.Sprintf("--events %d: must be 1..%d", o.Events, MaxEvents))
	}
	if o.FailApplyEvery < 0 || o.FailApplyEvery == 1 {
		errs = append(errs, fmt.Sprintf("--fail-apply-every %d: must be 0 (never) or at least 2 (a retry must be able to succeed)", o.FailApplyEvery))
	}
	if o.Interval < 0 || o.Interval > time.Minute {
		errs = append(errs, fmt.Sprintf("--interval %s: must be 0..1m", o.Interval))
	}
	if o.IPTablesBackend != "" && o.IPTablesBackend != iptables.VariantNFT && o.IPTablesBackend != iptables.VariantLegacy {
		errs = append(errs, fmt.Sprintf("unknown --iptables-backend %q: nft or legacy", o.IPTablesBackend))
	}
	if o.NFTablesLayout != "" && o.NFTablesLayout != string(nftables.LayoutKubeProxy) && o.NFTablesLayout != string(nftables.LayoutFast) {
		errs = append(errs, fmt.Sprintf("unknown --layout %q: kube-proxy or fast", o.NFTablesLayout))
	}
	if len(errs) > 0 {
		return &UsageError{Err: errors.New(strings.Join(errs, "; "))}
	}
	return nil
}

// MaxEvents bounds --events.
const MaxEvents = 1_000_000

// UsageError is bad options (exit 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// EnvironmentError means this machine cannot run a soak (not root, a
// command missing); the message says what.
type EnvironmentError struct{ Err error }

func (e *EnvironmentError) Error() string { return e.Err.Error() }
func (e *EnvironmentError) Unwrap() error { return e.Err }

// Result holds every figure of a soak.
type Result struct {
	Scenario string       `json:"scenario"`
	File     string       `json:"file"`
	Mode     cluster.Mode `json:"mode"`
	// Variant is the iptables backend (nft, legacy) or the nftables layout.
	Variant        string             `json:"variant"`
	Seed           uint64             `json:"seed"`
	Nodes          int                `json:"nodes"`
	ServicesStart  int                `json:"servicesStart"`
	ServicesEnd    int                `json:"servicesEnd"`
	Events         int                `json:"events"`
	Writes         int                `json:"apiWrites"`
	Changes        map[ChangeKind]int `json:"changes"`
	FailApplyEvery int                `json:"failApplyEvery"`
	// Applies is the number of kernel applies the wrapper saw (0 without
	// injection), FailuresInjected how many it made fail.
	Applies          int `json:"applies"`
	FailuresInjected int `json:"failuresInjected"`
	Syncs            int `json:"syncs"`
	FullSyncs        int `json:"fullSyncs"`
	PartialSyncs     int `json:"partialSyncs"`
	FailedSyncs      int `json:"failedSyncs"`
	// Recoveries counts failed syncs followed by a successful one on the
	// same node.
	Recoveries int          `json:"recoveries"`
	PerNode    []NodeResult `json:"perNode"`
	// DiffLines is the number of lines in which the kernels differ from
	// the fresh render, over every node.
	DiffLines int `json:"diffLines"`
	// Leaks lists leaked objects: chains, sets, map elements, ipsets,
	// namespaces.
	Leaks []string `json:"leaks"`
	RSS   RSS      `json:"rss"`
	// SettleSeconds is the wait after the last change until every node
	// had programmed it.
	SettleSeconds float64 `json:"settleSeconds"`
	EventSeconds  float64 `json:"eventSeconds"`
	WallSeconds   float64 `json:"wallSeconds"`
	// RunIDs are the soak's namespace run and the reference's
	// (kpsim-<id>-...).
	RunIDs []string `json:"runIDs"`
	// Failed lists what failed (empty: the soak passed).
	Failed []string `json:"failed"`
}

// NodeResult is one node's figures.
type NodeResult struct {
	Name         string   `json:"name"`
	Syncs        int      `json:"syncs"`
	FullSyncs    int      `json:"fullSyncs"`
	PartialSyncs int      `json:"partialSyncs"`
	FailedSyncs  int      `json:"failedSyncs"`
	Recoveries   int      `json:"recoveries"`
	DumpLines    int      `json:"dumpLines"`
	DiffLines    int      `json:"diffLines"`
	Diff         []string `json:"diff,omitempty"` // the first MaxDiffShown lines
	// SyncErrors are the first failed syncs' errors.
	SyncErrors []string `json:"syncErrors,omitempty"`
}

// maxSyncErrors bounds the sync errors kept per node.
const maxSyncErrors = 5

// MaxDiffShown bounds the diff lines kept per node.
const MaxDiffShown = 200

// Passed reports whether the soak met every requirement.
func (r *Result) Passed() bool { return len(r.Failed) == 0 }

// countingBackend counts a backend's syncs, failures and recoveries.
type countingBackend struct {
	dataplane.Backend
	mu                                         sync.Mutex
	syncs, full, partial, failures, recoveries int
	// pending counts the failed syncs since the last successful one: a
	// success recovers all of them (failures can come in a row when the
	// retry is the next apply to fail).
	pending int
	// errors keeps the first sync errors (for the report).
	errors []string
}

func (c *countingBackend) Sync(st *cluster.State, changed []cluster.ServicePortName, full bool) (dataplane.SyncResult, error) {
	res, err := c.Backend.Sync(st, changed, full)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.syncs++
	switch {
	case err != nil:
		c.failures++
		c.pending++
		if len(c.errors) < maxSyncErrors {
			c.errors = append(c.errors, err.Error())
		}
	default:
		c.recoveries += c.pending
		c.pending = 0
		if res.Full || full {
			c.full++
		} else {
			c.partial++
		}
	}
	return res, err
}

type node struct {
	name    string
	ns      *netns.Namespace
	backend *countingBackend
	tracker *cluster.Tracker
	syncer  *dataplane.Syncer
}

// Preflight checks that this machine can run a soak in mode.
func Preflight(mode cluster.Mode, variant string, failures bool) error {
	if os.Geteuid() != 0 {
		return &EnvironmentError{errors.New("sim soak needs root: it creates network namespaces and programs netfilter inside them (nothing on the host is changed)")}
	}
	if err := iptables.CheckTools(variant, true); err != nil && mode == cluster.ModeIPTables {
		return &EnvironmentError{err}
	}
	if _, err := lookPath("ipset"); err != nil {
		return &EnvironmentError{errors.New("the ipset command is missing (Debian package ipset): the soak lists ipsets to prove none leaked")}
	}
	if mode == cluster.ModeNFTables {
		if _, err := lookPath("nft"); err != nil {
			return &EnvironmentError{errors.New("the nft command is missing (Debian package nftables)")}
		}
	}
	if failures {
		for _, t := range []struct{ tool, pkg string }{{"flock", "util-linux"}, {"awk", "mawk"}, {"sh", "dash"}} {
			if _, err := lookPath(t.tool); err != nil {
				return &EnvironmentError{fmt.Errorf("the %s command is missing (Debian package %s): the apply-failure wrapper needs it", t.tool, t.pkg)}
			}
		}
	}
	return nil
}

// Timing bounds.
const (
	trackerTimeout = 30 * time.Second
	// backlog is the most informer events a tracker may lag behind the
	// writes before the generator waits: client-go's fake watch holds 100
	// events and panics when full.
	backlog        = 50
	rssSamples     = 200
	firstSyncLimit = 60 * time.Second
)

// Run loads file, runs the soak and returns its figures. The error is
// non-nil for bad input (a *scenario.ErrorList or *UsageError), a missing
// environment (*EnvironmentError) or a run that could not complete; a soak
// that ran and found a difference, a leak or RSS growth returns its Result
// with Failed set and a nil error.
func Run(ctx context.Context, file string, o Options) (*Result, error) {
	start := time.Now()
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = 2 * time.Minute
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	l, err := scenario.LoadFile(file)
	if err != nil {
		return nil, err
	}
	exp, err := scenario.Expand(l, o.Seed)
	if err != nil {
		return nil, err
	}
	px := l.Scenario.Proxy
	variant := px.IPTablesBackend
	if o.IPTablesBackend != "" {
		variant = o.IPTablesBackend
	}
	layout := px.NFTablesLayout
	if o.NFTablesLayout != "" {
		layout = o.NFTablesLayout
	}
	if err := Preflight(o.Mode, variant, o.FailApplyEvery > 0); err != nil {
		return nil, err
	}
	res := &Result{Scenario: l.Scenario.Metadata.Name, File: file, Mode: o.Mode, Seed: exp.Seed, Events: o.Events, FailApplyEvery: o.FailApplyEvery,
		Changes: map[ChangeKind]int{}, Leaks: []string{}, Failed: []string{}}
	res.Variant = variant
	if o.Mode == cluster.ModeNFTables {
		res.Variant = layout
	}
	var fa *FailApply
	if o.FailApplyEvery > 0 {
		if fa, err = InstallFailApply("", o.Mode, variant, o.FailApplyEvery); err != nil {
			var mt *MissingToolError
			if errors.As(err, &mt) {
				return nil, &EnvironmentError{err}
			}
			return nil, err
		}
		defer fa.Remove()
	}
	s := &soak{o: o, l: l, res: res, fa: fa, variant: variant, layout: layout}
	defer s.teardown()
	if err := s.run(ctx); err != nil {
		return res, err
	}
	s.teardown()
	s.checkNamespaces()
	res.RunIDs = s.runIDs
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

type soak struct {
	o               Options
	l               *scenario.Loaded
	res             *Result
	fa              *FailApply
	variant, layout string
	podCIDR         netip.Prefix
	serviceCIDRs    []netip.Prefix
	m               *apiserver.Model
	topo, ref       *netns.Topology
	stopSignals     []func()
	cancel          context.CancelFunc
	nodes           []*node
	runIDs          []string
	tornDown        bool
	wg              sync.WaitGroup
}

func (s *soak) logf(format string, a ...any) { fmt.Fprintf(s.o.Log, "soak: "+format+"\n", a...) }

func (s *soak) newBackend(ns *netns.Namespace, nodeName string) (dataplane.Backend, error) {
	px := s.l.Scenario.Proxy
	return backends.New(s.o.Mode, ns, dataplane.NodeConfig{NodeName: nodeName, ClusterCIDR: s.podCIDR, ServiceCIDRs: s.serviceCIDRs, MasqueradeAll: px.MasqueradeAll},
		backends.Options{IPTablesVariant: s.variant, Affinity: iptables.AffinityMode(px.IPTablesAffinity), Layout: nftables.Layout(s.layout)})
}

func (s *soak) run(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	ctx, serviceCIDR, id, err := s.setup(ctx)
	if err != nil {
		return err
	}
	base, writes, rss, err := s.drive(ctx, serviceCIDR, id)
	if err != nil {
		return err
	}
	if err := s.settle(ctx, base, writes, rss); err != nil {
		return err
	}
	m, res := s.m, s.res
	// Stop the sync loops before reading the kernels: nothing changes now.
	cancel()
	s.wg.Wait()
	if s.fa != nil {
		if err := s.fa.SetEnabled(false); err != nil {
			return err
		}
		res.Applies, res.FailuresInjected = s.fa.Applies(), s.fa.Injected()
	}
	for _, n := range s.nodes {
		c := n.backend
		c.mu.Lock()
		nr := NodeResult{Name: n.name, Syncs: c.syncs, FullSyncs: c.full, PartialSyncs: c.partial, FailedSyncs: c.failures, Recoveries: c.recoveries, SyncErrors: c.errors}
		c.mu.Unlock()
		res.PerNode = append(res.PerNode, nr)
		res.Syncs += nr.Syncs
		res.FullSyncs += nr.FullSyncs
		res.PartialSyncs += nr.PartialSyncs
		res.FailedSyncs += nr.FailedSyncs
		res.Recoveries += nr.Recoveries
	}
	// Every failed sync must be one the wrapper caused: a failure of its
	// own (a delete the kernel refuses, a missing chain) is a finding.
	if extra := res.FailedSyncs - res.FailuresInjected; extra > 0 {
		res.Failed = append(res.Failed, fmt.Sprintf("%d sync(s) failed beyond the %d apply failures injected (see perNode.syncErrors)", extra, res.FailuresInjected))
	}
	st, _ := m.Tracker.Drain()
	return s.compare(parent, st)
}

// setup builds the namespaces and starts a sync loop per node; the
// context it returns ends the run on SIGINT/SIGTERM.
func (s *soak) setup(ctx context.Context) (context.Context, netip.Prefix, string, error) {
	m, err := apiserver.OpenLoaded(ctx, s.l, s.o.Seed)
	if err != nil {
		return nil, netip.Prefix{}, "", err
	}
	s.m = m
	clearActions(m)
	if s.podCIDR, err = netip.ParsePrefix(s.l.Scenario.Cluster.PodCIDR); err != nil {
		return nil, netip.Prefix{}, "", fmt.Errorf("could not parse the pod CIDR: %w", err)
	}
	serviceCIDR, err := netip.ParsePrefix(s.l.Scenario.Cluster.ServiceCIDR)
	if err != nil {
		return nil, netip.Prefix{}, "", fmt.Errorf("could not parse the service CIDR: %w", err)
	}
	s.serviceCIDRs = []netip.Prefix{serviceCIDR}
	id, err := netns.NewRunID()
	if err != nil {
		return nil, netip.Prefix{}, "", err
	}
	cfg, err := topology.FromModel(m, id)
	if err != nil {
		return nil, netip.Prefix{}, "", err
	}
	for i := range cfg.Nodes {
		cfg.Nodes[i].Clients = nil // no traffic: the soak reads rules, it sends nothing
	}
	topo, err := netns.New(cfg)
	if err != nil {
		return nil, netip.Prefix{}, "", err
	}
	s.topo = topo
	s.runIDs = append(s.runIDs, id)
	ctx, stop := netns.WithSignalCleanup(ctx, topo)
	s.stopSignals = append(s.stopSignals, stop)
	if err := topo.Build(ctx); err != nil {
		return nil, netip.Prefix{}, "", fmt.Errorf("could not build the namespaces: %w", err)
	}
	px := s.l.Scenario.Proxy
	retry := max(px.MinSyncPeriod.Duration, 200*time.Millisecond)
	for _, n := range topo.Nodes() {
		tr, err := m.Cluster.AddTrackerSynced(ctx, trackerTimeout)
		if err != nil {
			return nil, netip.Prefix{}, "", err
		}
		b, err := s.newBackend(n.NS, n.Config.Name)
		if err != nil {
			return nil, netip.Prefix{}, "", err
		}
		cb := &countingBackend{Backend: b}
		sy := dataplane.NewSyncer(dataplane.SyncConfig{MinSyncPeriod: px.MinSyncPeriod.Duration, SyncPeriod: px.SyncPeriod.Duration, RetryPeriod: retry}, cb, tr, nil)
		first := sy.Synced()
		s.wg.Add(1)
		go func() { defer s.wg.Done(); _ = sy.Run(ctx) }()
		select {
		case <-first:
		case <-ctx.Done():
			return nil, netip.Prefix{}, "", ctx.Err()
		case <-time.After(firstSyncLimit):
			_, _, last := sy.Stats()
			return nil, netip.Prefix{}, "", fmt.Errorf("node %s: the first sync did not complete within %s: %v", n.Config.Name, firstSyncLimit, last)
		}
		s.nodes = append(s.nodes, &node{name: n.Config.Name, ns: n.NS, backend: cb, tracker: tr, syncer: sy})
	}
	return ctx, serviceCIDR, id, nil
}

// drive writes the seeded changes, paced by the model's tracker, and
// returns each tracker's sequence before them and the writes made.
func (s *soak) drive(ctx context.Context, serviceCIDR netip.Prefix, id string) (map[*cluster.Tracker]uint64, int, *rssRecorder, error) {
	m, res := s.m, s.res
	res.Nodes = len(s.nodes)
	gen, err := NewGenerator(ctx, m.Cluster.Client, serviceCIDR, scenario.NewRand(res.Seed, streamSoak), boundsFor(m.State))
	if err != nil {
		return nil, 0, nil, err
	}
	res.ServicesStart = gen.Services()
	s.logf("%s %s (%s), seed %d, namespaces %s*: %d nodes, %d Services, %d changes, every %s on average; fail every %d-th apply",
		s.o.Mode, res.Variant, s.l.File, res.Seed, netns.RunPrefix(id), len(s.nodes), gen.Services(), s.o.Events, s.o.Interval, s.o.FailApplyEvery)

	// The model's tracker sees every write too: it paces the generator
	// and gives the final state.
	base := map[*cluster.Tracker]uint64{m.Tracker: m.Tracker.Seq()}
	for _, n := range s.nodes {
		base[n.tracker] = n.tracker.Seq()
	}
	rss := newRSSRecorder(s.o.Events)
	rss.sample(0)
	pace := scenario.NewRand(res.Seed, streamPace)
	every := max(1, s.o.Events/rssSamples)
	t0 := time.Now()
	writes := 0
	for i := 1; i <= s.o.Events; i++ {
		if err := ctx.Err(); err != nil {
			return nil, 0, nil, err
		}
		if err := waitSeq(ctx, m.Tracker, base[m.Tracker]+uint64(max(0, writes-backlog)), trackerTimeout); err != nil {
			return nil, 0, nil, fmt.Errorf("change %d: %w", i, err)
		}
		ch, err := gen.Next(ctx)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("change %d: %w", i, err)
		}
		writes += ch.Writes
		if i%100 == 0 {
			clearActions(m)
		}
		if i%every == 0 || i == s.o.Events {
			rss.sample(i)
		}
		if i%max(1, s.o.Events/10) == 0 {
			s.logf("%d/%d changes (%s), %d API writes, RSS %.1f MiB", i, s.o.Events, ch, writes, rss.last())
		}
		if s.o.Interval > 0 {
			time.Sleep(time.Duration(pace.Int64N(int64(2 * s.o.Interval))))
		}
	}
	clearActions(m)
	res.EventSeconds = time.Since(t0).Seconds()
	res.Writes = writes
	res.Changes = gen.Counts()
	res.ServicesEnd = gen.Services()
	return base, writes, rss, nil
}

// settle waits until every node has programmed the final state and its
// last sync succeeded, and records the RSS verdict.
func (s *soak) settle(ctx context.Context, base map[*cluster.Tracker]uint64, writes int, rss *rssRecorder) error {
	m, res := s.m, s.res
	// Settle on sequence numbers: every tracker has received every write,
	// and every node's last successful sync had drained them all.
	t1 := time.Now()
	if err := waitSeq(ctx, m.Tracker, base[m.Tracker]+uint64(writes), trackerTimeout); err != nil {
		return fmt.Errorf("the model's tracker: %w", err)
	}
	for _, n := range s.nodes {
		target := base[n.tracker] + uint64(writes)
		if err := waitSeq(ctx, n.tracker, target, trackerTimeout); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
		if err := waitApplied(ctx, n.syncer, target, s.o.SettleTimeout); err != nil {
			res.Failed = append(res.Failed, fmt.Sprintf("node %s: %v", n.name, err))
		}
	}
	// The sync loops keep running after the final state is programmed
	// (periodic and retry syncs), so an injected failure can still land
	// here: stop injecting, then wait until every node's last sync has
	// succeeded, so each injected failure has its recovery.
	if s.fa != nil {
		if err := s.fa.SetEnabled(false); err != nil {
			return err
		}
	}
	for _, n := range s.nodes {
		if err := waitRecovered(ctx, n.backend, s.o.SettleTimeout); err != nil {
			res.Failed = append(res.Failed, fmt.Sprintf("node %s: %v", n.name, err))
		}
	}
	res.SettleSeconds = time.Since(t1).Seconds()
	rss.sample(s.o.Events)
	res.RSS = rss.verdict()
	if !res.RSS.Pass {
		res.Failed = append(res.Failed, fmt.Sprintf("RSS grew with N: last-quarter median %.1f MiB > limit %.1f MiB (first-quarter median %.1f MiB)",
			res.RSS.LastQuarterMiB, res.RSS.LimitMiB, res.RSS.FirstQuarterMiB))
	}
	return nil
}

// Random streams of the soak, apart from the scenario's own.
const (
	streamSoak = 0x736f616b // the changes
	streamPace = 0x70616365 // the pauses between them
)

// boundsFor keeps the cluster within half and one and a half times its
// initial number of Services, and each Service under 60 endpoints.
func boundsFor(st *cluster.State) Bounds {
	svcs := map[string]bool{}
	for n := range st.Services {
		svcs[n.Namespace+"/"+n.Name] = true
	}
	n := len(svcs)
	return Bounds{MinServices: n / 2, MaxServices: max(n+5, n*3/2), MaxEndpoints: 60, MaxNodeFill: 0.8}
}

// compare applies a fresh render of st in a fresh namespace per node and
// diffs each node's kernel against it.
func (s *soak) compare(ctx context.Context, st *cluster.State) error {
	res := s.res
	id, err := netns.NewRunID()
	if err != nil {
		return err
	}
	cfg, err := topology.FromState(st, topology.Options{RunID: id})
	if err != nil {
		return fmt.Errorf("could not derive the reference namespaces: %w", err)
	}
	ref, err := netns.New(cfg)
	if err != nil {
		return err
	}
	s.ref = ref
	s.runIDs = append(s.runIDs, id)
	ctx, stop := netns.WithSignalCleanup(ctx, ref)
	s.stopSignals = append(s.stopSignals, stop)
	if err := ref.Build(ctx); err != nil {
		return fmt.Errorf("could not build the reference namespaces: %w", err)
	}
	// kube-proxy's nftables mode deletes the chains a sync flushed in a
	// later sync, a second on (its periodic sync at the latest): run that
	// sync on every node, so that the kernel is compared without them.
	if s.o.Mode == cluster.ModeNFTables {
		time.Sleep(1100 * time.Millisecond)
		for _, n := range s.nodes {
			if _, err := n.backend.Sync(st, nil, false); err != nil {
				return fmt.Errorf("node %s: the sync deleting stale chains: %w", n.name, err)
			}
		}
	}
	for i, n := range s.nodes {
		rn, ok := ref.Node(n.name)
		if !ok {
			return fmt.Errorf("the reference has no node %s", n.name)
		}
		b, err := s.newBackend(rn.NS, n.name)
		if err != nil {
			return err
		}
		if _, err := b.Sync(st, nil, true); err != nil {
			return fmt.Errorf("could not apply the fresh render for node %s: %w", n.name, err)
		}
		want, err := s.dump(rn.NS)
		if err != nil {
			return err
		}
		got, err := s.dump(n.ns)
		if err != nil {
			return err
		}
		d := Diff(want, got)
		nr := &res.PerNode[i]
		nr.DumpLines, nr.DiffLines = len(got), len(d)
		nr.Diff = d[:min(len(d), MaxDiffShown)]
		res.DiffLines += len(d)
		for _, l := range d {
			if leak := leakOf(l); leak != "" {
				res.Leaks = append(res.Leaks, n.name+": "+leak)
			}
		}
		if len(d) > 0 {
			res.Failed = append(res.Failed, fmt.Sprintf("node %s: the kernel differs from a fresh render of the final state in %d line(s)", n.name, len(d)))
		}
	}
	return nil
}

// dump is the canonical kernel state of a namespace for the mode: the
// iptables tables (iptables mode) or the whole nftables ruleset (nftables
// mode), then the ipsets.
func (s *soak) dump(ns *netns.Namespace) ([]string, error) {
	var out []string
	if s.o.Mode == cluster.ModeNFTables {
		b, err := ns.Exec("nft", "list", "ruleset")
		if err != nil {
			return nil, fmt.Errorf("could not list the nftables ruleset in %s: %w: %s", ns.Name, err, b)
		}
		out = append(out, CanonicalNFT(string(b))...)
	} else {
		b, err := ns.Exec(iptables.Tool(s.variant, "save"))
		if err != nil {
			return nil, fmt.Errorf("could not save the iptables rules in %s: %w: %s", ns.Name, err, b)
		}
		out = append(out, CanonicalIPTablesSave(string(b))...)
	}
	b, err := ns.Exec("ipset", "save")
	if err != nil {
		return nil, fmt.Errorf("could not save the ipsets in %s: %w: %s", ns.Name, err, b)
	}
	for _, l := range CanonicalIPSetSave(string(b)) {
		out = append(out, "ipset "+l)
	}
	return out, nil
}

// leakOf names the object a "+" diff line (only in the soaked kernel)
// declares, when it is a whole object: an iptables chain, an nftables
// chain, set or map, a map or set element, an ipset.
func leakOf(line string) string {
	l, ok := strings.CutPrefix(line, "+ ")
	if !ok {
		return ""
	}
	l = strings.TrimSpace(l)
	switch {
	case strings.HasPrefix(l, ":"):
		return "chain " + strings.Fields(l)[0][1:]
	case strings.HasPrefix(l, "chain "), strings.HasPrefix(l, "set "), strings.HasPrefix(l, "map "), strings.HasPrefix(l, "table "):
		return strings.TrimSuffix(l, " {")
	case strings.HasPrefix(l, "element "):
		return "map/set " + l
	case strings.HasPrefix(l, "ipset create "):
		return "ipset " + strings.Fields(l)[2]
	}
	return ""
}

// teardown stops the sync loops and removes every namespace; it runs once.
func (s *soak) teardown() {
	if s.tornDown {
		return
	}
	s.tornDown = true
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	for _, t := range []*netns.Topology{s.ref, s.topo} {
		if t == nil {
			continue
		}
		if err := t.Close(); err != nil {
			s.res.Failed = append(s.res.Failed, "teardown: "+err.Error())
		}
	}
	for _, stop := range s.stopSignals {
		stop()
	}
	if s.m != nil {
		s.m.Close()
	}
}

// checkNamespaces requires that no namespace or run marker of the soak's
// runs is left after teardown.
func (s *soak) checkNamespaces() {
	entries, _ := os.ReadDir(netns.NetnsDir)
	for _, id := range s.runIDs {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), netns.RunPrefix(id)) {
				s.res.Leaks = append(s.res.Leaks, "namespace "+e.Name())
			}
		}
		if _, err := os.Stat(filepath.Join(netns.MarkerDir, id+".pid")); err == nil {
			s.res.Leaks = append(s.res.Leaks, "run marker "+id)
		}
	}
	sort.Strings(s.res.Leaks)
	s.res.Leaks = slices.Compact(s.res.Leaks)
	for _, l := range s.res.Leaks {
		if strings.HasPrefix(l, "namespace ") || strings.HasPrefix(l, "run marker ") {
			s.res.Failed = append(s.res.Failed, "leaked "+l)
		}
	}
}

// clearActions empties the fake clientset's record of every call: client-go
// keeps one deep copy per action forever, which would make RSS grow with N
// (the soak's own footprint, not the proxy's).
func clearActions(m *apiserver.Model) {
	if c, ok := m.Cluster.Client.(interface{ ClearActions() }); ok {
		c.ClearActions()
	}
}

func waitSeq(ctx context.Context, t *cluster.Tracker, target uint64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for t.Seq() < target {
		if time.Now().After(deadline) {
			return fmt.Errorf("the tracker did not receive the API writes within %s (at %d, want %d)", limit, t.Seq(), target)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func waitApplied(ctx context.Context, sy *dataplane.Syncer, target uint64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		applied, _ := sy.Applied()
		if applied >= target {
			return nil
		}
		if time.Now().After(deadline) {
			_, _, last := sy.Stats()
			return fmt.Errorf("the final state was not programmed within %s (applied sequence %d of %d; last sync error: %v)", limit, applied, target, last)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitRecovered waits until the backend's last sync succeeded.
func waitRecovered(ctx context.Context, c *countingBackend, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c.mu.Lock()
		failing, last := c.pending > 0, ""
		if n := len(c.errors); n > 0 {
			last = c.errors[n-1]
		}
		c.mu.Unlock()
		if !failing {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the last sync failed and no sync succeeded within %s of the final state (last error kept: %s)", limit, last)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
