// Package capacity is `sim capacity`: it scales a scenario's shape to a
// ladder of Service counts and answers, per kube-proxy mode and variant,
// what a node pays at each size (objects programmed, full and partial sync
// time, network programming latency under the scaled event rate, the rules
// a first packet walks, conntrack) and the largest size that meets each
// SLO. It runs no traffic simulation: the figures come from cost.Count on
// the generated state, the fitted cost models (cost.NewModel) and
// kube-proxy's sync runner (engine.Syncer). README.md has the flow.
package capacity

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Variant is one mode and backend (or layout) the sweep reports.
type Variant struct {
	Mode    cluster.Mode `json:"mode"`
	Variant string       `json:"variant"`
}

func (v Variant) String() string { return string(v.Mode) + "/" + v.Variant }

// DefaultVariants are the backends kube-proxy ships: iptables over the nft
// and the legacy backend, the nftables mode's own layout, and IPVS.
var DefaultVariants = []Variant{
	{cluster.ModeIPTables, "nft"},
	{cluster.ModeIPTables, "legacy"},
	{cluster.ModeNFTables, "kube-proxy"},
	{cluster.ModeIPVS, "netlink"},
}

// Options configure a sweep.
type Options struct {
	Sizes []int
	// Nodes is NodesScaled (default) or NodesFixed.
	Nodes string
	SLOs  []SLO
	// Calibrations are the sync-time calibrations (simulate.Calibrations).
	Calibrations []cost.Calibration
	// Variants to report; nil means DefaultVariants.
	Variants []Variant
	// EventRate, when > 0, is the endpoint changes per second at the
	// scenario's own size; 0 means the scenario's timeline's rate.
	EventRate float64
	// Seed, when set, replaces the scenario's.
	Seed *uint64
	// Progress, when set, is called after each step (one size's state,
	// then each variant at that size).
	Progress func(done, total int)
}

// Result is a sweep.
type Result struct {
	Scenario string `json:"scenario"`
	Seed     uint64 `json:"seed"`
	Nodes    string `json:"nodes"`
	// Base is the scenario's own shape; EventRate its changes per second
	// and EventRateSource where that came from.
	Base            Shape     `json:"base"`
	EventRate       float64   `json:"eventRatePerSecond"`
	EventRateSource string    `json:"eventRateSource"`
	MinSyncPeriod   float64   `json:"minSyncPeriodSeconds"`
	Models          []Model   `json:"models"`
	Sizes           []Size    `json:"sizes"`
	SLOs            []Answer  `json:"slos"`
	Notes           []string  `json:"notes"`
	Variants        []Variant `json:"-"`
}

// Model is the cost model a variant's sync times come from.
type Model struct {
	Variant
	Form        string  `json:"form"`
	FitError    float64 `json:"fitError"`
	MinServices int     `json:"minServices"`
	MaxServices int     `json:"maxServices"`
	MinObjects  int     `json:"minObjects"`
	MaxObjects  int     `json:"maxObjects"`
	Source      string  `json:"source"`
	Emulated    bool    `json:"emulated"`
	model       cost.Model
}

// Size is one step of the ladder.
type Size struct {
	Services int   `json:"services"`
	Shape    Shape `json:"shape"`
	// EventRate is the changes per second at this size.
	EventRate float64  `json:"eventRatePerSecond"`
	Rows      []Row    `json:"rows"`
	Notes     []string `json:"notes,omitempty"`
}

// Row is one variant at one size, on the node with the most objects.
type Row struct {
	Variant
	Node          string        `json:"node"`
	Objects       int           `json:"objectsPerNode"`
	MedianObjects int           `json:"medianObjectsPerNode"`
	Counts        cost.Counts   `json:"counts"`
	FullSync      cost.Estimate `json:"fullSync"`
	PartialSync   cost.Estimate `json:"partialSync"`
	// StartUpFullSyncOnly: the proxier makes no periodic full sync at this
	// size (iptables, large-cluster mode), so the full sync is the start-up
	// one (and the one after a failed restore) and the programming latency
	// rests on partial syncs.
	StartUpFullSyncOnly bool `json:"startUpFullSyncOnly,omitempty"`
	// Latency is nil when the event rate is zero.
	Latency          *Latency         `json:"programmingLatency,omitempty"`
	FirstPacket      cost.FirstPacket `json:"firstPacketRules"`
	ConntrackEntries int64            `json:"conntrackEntries"`
	ConntrackBytes   int64            `json:"conntrackBytes"`
}

// Run sweeps the loaded scenario over o.Sizes.
func Run(ctx context.Context, l *scenario.Loaded, o Options) (*Result, error) {
	sc := l.Scenario
	if sc.Generate == nil || sc.Generate.Services == 0 {
		return nil, scenario.ErrorList{{File: l.File, Pos: l.PosOf("generate"), Field: "generate", Message: "sim capacity scales the generate section, and this scenario has none"}}
	}
	if o.Nodes == "" {
		o.Nodes = NodesScaled
	}
	if o.Variants == nil {
		o.Variants = DefaultVariants
	}
	st, exp, err := stateOf(l, o.Seed)
	if err != nil {
		return nil, err
	}
	res := &Result{Scenario: l.File, Seed: exp.Seed, Nodes: o.Nodes, Base: shapeOf(sc.Generate.Services, st), Variants: o.Variants}
	res.MinSyncPeriod = sc.Proxy.MinSyncPeriod.Duration.Seconds()
	res.EventRate, res.EventRateSource = eventRate(sc, o.EventRate)
	if err := res.models(o); err != nil {
		return nil, err
	}
	ct := conntrackOf(sc, exp, res.Base)
	total := len(o.Sizes) * (1 + len(res.Models))
	done := 0
	step := func() {
		done++
		if o.Progress != nil {
			o.Progress(done, total)
		}
	}
	for _, n := range o.Sizes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sz, err := res.size(l, n, o, ct, step)
		if err != nil {
			return nil, err
		}
		res.Sizes = append(res.Sizes, sz)
	}
	res.SLOs = answer(res, o.SLOs)
	res.notes(ct)
	return res, nil
}

// models builds each variant's cost model from its calibration.
func (res *Result) models(o Options) error {
	for _, v := range o.Variants {
		cal, ok := cost.Find(o.Calibrations, v.Mode, v.Variant)
		if !ok {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: no calibration, not reported", v))
			continue
		}
		m, err := cost.NewModel(cal)
		if err != nil {
			return fmt.Errorf("could not model %s: %w", v, err)
		}
		res.Models = append(res.Models, Model{Variant: v, Form: m.Form, FitError: m.FitError, MinServices: m.MinServices, MaxServices: m.MaxServices,
			MinObjects: m.MinObjects, MaxObjects: m.MaxObjects, Source: m.Source, Emulated: cal.Emulation != nil, model: m})
	}
	return nil
}

// size builds the scaled state at n Services and fills every variant's row.
func (res *Result) size(l *scenario.Loaded, n int, o Options, ct conntrack, step func()) (Size, error) {
	sl, notes, err := scaled(l, res.Base, n, o.Nodes)
	if err != nil {
		return Size{}, fmt.Errorf("could not scale %s to %d Services: %w", l.File, n, err)
	}
	st, _, err := stateOf(sl, o.Seed)
	if err != nil {
		return Size{}, fmt.Errorf("could not generate %d Services: %w", n, err)
	}
	sz := Size{Services: n, Shape: shapeOf(n, st), EventRate: res.EventRate * float64(n) / float64(res.Base.Services), Notes: notes}
	step()
	counts := map[cluster.Mode]nodeCounts{}
	p := l.Scenario.Proxy
	for vi, m := range res.Models {
		nc, ok := counts[m.Mode]
		if !ok {
			if nc, err = countNodes(m.Mode, st); err != nil {
				return Size{}, err
			}
			counts[m.Mode] = nc
		}
		row := Row{Variant: m.Variant, Node: nc.worstNode, Objects: nc.worst.Objects, MedianObjects: nc.median.Objects, Counts: nc.worst}
		row.FullSync = m.model.Full(nc.worst)
		row.PartialSync = m.model.Partial(nc.worst)
		pc := pacingOf(m.Mode, p, st.ProxiedEndpoints())
		row.StartUpFullSyncOnly = pc.noPeriodicFull
		row.Latency = latencyOf(sz.EventRate, res.Seed^uint64(n)*0x9e3779b97f4a7c15^uint64(vi+1), pc, row.FullSync, row.PartialSync)
		row.FirstPacket = firstPacket(m.Mode, nc.order)
		row.ConntrackEntries, row.ConntrackBytes = ct.entries, ct.entries*cost.ConntrackEntryBytes
		sz.Rows = append(sz.Rows, row)
		step()
	}
	return sz, nil
}

// pacingOf is a mode's sync runner: minSyncPeriod from the scenario
// (kube-proxy's 1 s default), maxInterval one hour for iptables and
// nftables, syncPeriod for ipvs (as sim/simulate sets them). The iptables
// proxier makes no periodic full sync in large-cluster mode, more than
// cluster.LargeClusterEndpoints endpoints (v1.37.2 pkg/proxy/iptables
// proxier.go: "Avoid regular full syncs for large clusters"); the nftables
// proxier makes one per FullSyncPeriod at any size.
func pacingOf(mode cluster.Mode, p scenario.Proxy, endpoints int) pacing {
	// The ipvs proxier's periodic runs reconcile what the kernel already
	// holds (a steady-state sync, cost.Model.Partial): only its start-up
	// sync programs everything.
	pc := pacing{maxInterval: time.Hour, noPeriodicFull: mode == cluster.ModeIPVS || mode == cluster.ModeIPTables && endpoints > cluster.LargeClusterEndpoints}
	if p.MinSyncPeriod != nil {
		pc.minSync = p.MinSyncPeriod.Duration
	}
	if mode == cluster.ModeIPVS && p.SyncPeriod != nil {
		pc.maxInterval = p.SyncPeriod.Duration
	}
	return pc
}

// latencyOf runs the latency stream with the sync times at their estimate
// and at both ends of their bands.
func latencyOf(rate float64, seed uint64, p pacing, full, partial cost.Estimate) *Latency {
	if rate <= 0 {
		return nil
	}
	n := latencyEvents(rate)
	l := &Latency{EventsPerSecond: rate, Events: n, Extrapolated: full.Extrapolated || partial.Extrapolated}
	l.P50, l.P99, l.SpanSeconds = programmingLatency(rate, n, seed, p, full.Seconds, partial.Seconds)
	_, lo, _ := programmingLatency(rate, n, seed, p, full.Low, partial.Low)
	_, hi, _ := programmingLatency(rate, n, seed, p, full.High, partial.High)
	// The p99 is not monotonic in the sync times (minSyncPeriod's pacing
	// batches events differently when syncs are shorter), so the band is
	// the envelope of the three runs: it always holds the estimate.
	l.P99Low, l.P99High = min(lo, hi, l.P99), max(lo, hi, l.P99)
	return l
}

// firstPacket is the rules a new connection's first packet walks
// (cost.FirstPackets, KUBE-SERVICES in service-port name order as
// sim/simulate orders it), with connections spread evenly: one for each
// cluster IP, node port, external IP and load-balancer IP that has
// endpoints to reach. In iptables mode it grows with the Service count;
// nftables and IPVS walk the same rules at any size.
func firstPacket(mode cluster.Mode, order []cost.ServicePortInput) cost.FirstPacket {
	return cost.FirstPackets(mode, order, nil, true)
}

// eventRate is the scenario's API writes per second: its timeline's steps
// over the time from 0 to the last one, unless the caller gives a rate.
func eventRate(sc *scenario.Scenario, override float64) (float64, string) {
	if override > 0 {
		return override, "--event-rate"
	}
	steps := apiserver.Timeline(sc)
	if len(steps) == 0 {
		return 0, "the scenario has no events: no programming latency"
	}
	last := steps[len(steps)-1].At
	if last <= 0 {
		return 0, "every event is at 0 s: no rate"
	}
	return float64(len(steps)) / last.Seconds(), fmt.Sprintf("the timeline: %d API write(s) over %s", len(steps), last)
}

// conntrack is a node's conntrack table under the scenario's traffic.
type conntrack struct {
	entries int64
	note    string
}

// conntrackOf estimates the busiest node's live entries by Little's law:
// its new connections per second times how long each stays in the table
// (its duration plus TCP's TIME_WAIT), capped at its connections. sim run
// measures the same peak by simulating; here traffic per node does not
// grow with the Service count (clients are per node), so the figure is the
// same at every size.
func conntrackOf(sc *scenario.Scenario, exp *scenario.Expanded, base Shape) conntrack {
	t := sc.Traffic
	if t == nil || base.Nodes == 0 {
		return conntrack{note: "no traffic: no conntrack entries"}
	}
	total, span := float64(t.Connections), 0.0
	if t.Duration != nil {
		span = t.Duration.Seconds()
		if total == 0 {
			total = t.Rate * span
		}
	} else {
		var last time.Duration
		for _, s := range apiserver.Timeline(sc) {
			last = max(last, s.At)
		}
		settle := 10 * time.Second
		if p := sc.Proxy.MinSyncPeriod; p != nil {
			settle = max(settle, 4*p.Duration)
		}
		span = (last + settle).Seconds()
	}
	mean := 0.0
	if d := t.ConnectionDuration; d != nil {
		mean = d.Mean.Seconds()
	}
	perNode := total / float64(base.Nodes)
	live := math.Min(perNode, perNode/span*(mean+engine.DefaultTCPTimeWait.Seconds()))
	return conntrack{entries: int64(math.Round(live)), note: fmt.Sprintf("conntrack: Little's law on %.0f connections per node over %.0f s, each held %.1f s (its mean duration plus TCP TIME_WAIT), capped at the node's connections; clients are per node, so the figure does not grow with the Service count", perNode, span, mean+engine.DefaultTCPTimeWait.Seconds())}
}

func (res *Result) notes(ct conntrack) {
	res.Notes = append(res.Notes,
		"figures are the node with the most objects (medianObjectsPerNode is the median node's)",
		fmt.Sprintf("nodes %s: %s", res.Nodes, nodesNote(res.Nodes)),
		fmt.Sprintf("event rate %.3g/s at %d Services (%s), proportional to the Service count; programming latency over a seeded Poisson stream of %s (%d-%d events) per size and variant through kube-proxy's sync runner (minSyncPeriod %.3g s, burst 2, one sync at a time), syncs partial except the periodic ones and one per FullSyncPeriod (%s), which take the full time; in iptables mode above %d endpoints (kube-proxy's large-cluster mode) and in IPVS mode (whose every later run reconciles what the kernel holds: the calibration's resync) only the start-up sync is full (rows marked startUpFullSyncOnly)", res.EventRate, res.Base.Services, res.EventRateSource, LatencySpan, MinLatencyEvents, MaxLatencyEvents, res.MinSyncPeriod, FullSyncPeriod, cluster.LargeClusterEndpoints),
		ct.note,
		"first-packet rules (cost.FirstPackets): rules evaluated before the DNAT, connections spread evenly over every cluster IP, node port, external IP and load-balancer IP with endpoints to reach on the node; p50/p99 over every path, and by path (node port; load-balancer and external IP; JSON also clusterIP). In iptables mode a node port's first packet walks all of KUBE-SERVICES first; nftables and IPVS walk the same rules at any size")
	for _, m := range res.Models {
		if m.Emulated {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: calibrated in the microVM under emulation, each point divided by the VM/host ratio measured at its size (the same calibration in the VM and on the host)", m.Variant))
		}
	}
}

func nodesNote(policy string) string {
	if policy == NodesFixed {
		return "cluster.nodeCount kept; the same nodes hold more pods"
	}
	return "cluster.nodeCount scaled with the Service count, so that pods per node and traffic per node stay the scenario's (kube-proxy's per-node rules depend on the Service and endpoint counts, not on the node count, except for internalTrafficPolicy Local)"
}
