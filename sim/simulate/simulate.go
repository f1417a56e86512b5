// Package simulate is the discrete-event simulation behind `sim run`: the
// scenario's traffic and events timeline on a virtual clock, through each
// node's simulated dataplane (sim/engine) in each kube-proxy mode, held
// against the oracle (sim/oracle) and priced by the cost model (sim/cost).
//
// The flow (sim/README.md has the long version):
//
//  1. The events timeline is applied through the cluster model's clientset,
//     one API write at a time; after each, the informers' state tells which
//     service ports changed and how. Every state a service port goes
//     through is a version.
//  2. Every version is rendered into rules per mode (per node where rules
//     differ between nodes) and the oracle says what each must do.
//  3. Each (mode, node) pair runs on its own: the node's connections arrive
//     in time order; an API write at time t changes what the oracle expects
//     at t and asks the node's sync runner (engine.Syncer) for a sync; the
//     node's rules change only when a sync that started after the write
//     ends. Between the two, connections still hit the old rules: the
//     exposure window. Nodes run in parallel, each with its own random
//     streams, and their results are merged in a fixed order, so the same
//     seed gives the same report.
package simulate

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/report"
)

// Options configure a simulation.
type Options struct {
	// Modes to simulate; empty means the scenario's proxy.modes.
	Modes []cluster.Mode
	// Calibrations are the sync-time models; nil means Calibrations("").
	Calibrations []cost.Calibration
	// SyncTime, when set, replaces the cost model's sync time (tests).
	SyncTime func(mode cluster.Mode, objects int, full bool) time.Duration
	// Workers bounds the nodes simulated at once; 0 means GOMAXPROCS.
	Workers int
	// Progress, when set, is called (from worker goroutines, serialised)
	// each time a node's run in one mode completes.
	Progress func(done, total int)
	// Fault, when set, injects an engine fault (engine.ParseFault's names)
	// into the engines of the mode it belongs to, so that the engine
	// self-check can be shown to catch it. For tests of the checks; a
	// report made with a fault says so in its model notes.
	Fault string
	// IPVSScheduler, when set, replaces the scenario's proxy.ipvsScheduler
	// (rr, lc, ...): the same workload under another scheduler.
	IPVSScheduler string
}

// IPVSVariant names the ipvs calibration the simulator falls back to when
// results/calibration has none.
const IPVSVariant = "netlink"

// ipvsFallback is an estimate, not a measurement: IPVS is not built into
// the reference machine's kernel, so `sim calibrate` has not measured it.
// kube-proxy's ipvs sync reconciles virtual and real servers one netlink
// call at a time; kubernetes#84906 reports 730 ms for a sync of a little
// over 1,500 Services once its per-call overhead was fixed. This assumes
// 0.5 s at 1,000 Services × 10 endpoints, growing linearly.
func ipvsFallback() cost.Calibration {
	pt := func(services int, seconds float64) cost.Point {
		return cost.Point{Services: services, EndpointsPerService: 10, Objects: cost.SyntheticObjects(cluster.ModeIPVS, services, 10), FullSeconds: seconds}
	}
	return cost.Calibration{
		Mode: cluster.ModeIPVS, Variant: IPVSVariant,
		Source: "estimate, not measured: linear from kubernetes#84906 (730 ms for about 1,500 Services after its fix); IPVS is not in the reference kernel",
		Points: []cost.Point{pt(1000, 0.5), pt(5000, 2.5)},
	}
}

// Calibrations loads the sync-time calibrations from dir (results/calibration
// by convention; "" or a missing folder means none), completed with
// sim/cost's documented defaults and the simulator's ipvs estimate.
func Calibrations(dir string) ([]cost.Calibration, error) {
	var cs []cost.Calibration
	if dir == "" {
		cs = cost.Defaults()
	} else {
		var err error
		if cs, err = cost.LoadCalibrations(dir); err != nil {
			return nil, err
		}
	}
	hasIPVS := false
	for _, c := range cs {
		hasIPVS = hasIPVS || c.Mode == cluster.ModeIPVS
	}
	if !hasIPVS {
		cs = append(cs, ipvsFallback())
	}
	return cs, nil
}

// Run simulates an opened scenario in each mode and returns the report.
// It writes the scenario's events through the model's clientset and then
// releases the model's cluster (apiserver.Model.Release), so a model serves
// one Run. Failed checks are in the report (Report.Failed);
// the error is for what prevented the simulation.
func Run(ctx context.Context, m *apiserver.Model, o Options) (*report.Report, error) {
	sc := m.Loaded.Scenario
	// The summary reads the tracker's state, which the timeline changes.
	sum := apiserver.Summarize(m.Expanded, m.State)
	modes := o.Modes
	if len(modes) == 0 {
		modes = sc.Proxy.Modes
	}
	if len(modes) == 0 {
		modes = []cluster.Mode{cluster.ModeIPTables}
	}
	for _, md := range modes {
		if _, err := engine.ModeOf(md); err != nil {
			return nil, err
		}
	}
	if _, err := engine.ParseFault(o.Fault); err != nil {
		return nil, err
	}
	if o.IPVSScheduler != "" {
		if _, err := engine.ParseScheduler(o.IPVSScheduler); err != nil {
			return nil, err
		}
		sc.Proxy.IPVSScheduler = o.IPVSScheduler
	}
	if o.Calibrations == nil {
		cs, err := Calibrations("")
		if err != nil {
			return nil, err
		}
		o.Calibrations = cs
	}
	w, err := buildWorld(ctx, m, modes, o)
	if err != nil {
		return nil, err
	}
	w.prepareChecks()
	seed := m.Expanded.Seed
	results, accs, err := w.runAll(ctx, seed, o)
	if err != nil {
		return nil, err
	}
	return w.report(sum, seed, results, accs), nil
}

// runAll runs every node (in every mode) on a pool of workers and returns
// the results indexed [mode][node].
func (w *world) runAll(ctx context.Context, seed uint64, o Options) ([][]*nodeResult, []*modeAcc, error) {
	nm, nn := len(w.modes), len(w.nodes)
	results := make([][]*nodeResult, nm)
	accs := make([]*modeAcc, nm)
	for i := range results {
		results[i] = make([]*nodeResult, nn)
		accs[i] = newModeAcc(w)
	}
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	total := nm * nn
	var next, done atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range min(workers, nn) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var wk worker
			for {
				ni := int(next.Add(1) - 1)
				if ni >= nn {
					return
				}
				rs, err := runNode(ctx, w, ni, seed, &wk)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				for mi, r := range rs {
					r.fp = w.firstPacketNode(mi, ni, r, &wk)
				}
				mu.Lock()
				for mi, r := range rs {
					accs[mi].add(r)
				}
				mu.Unlock()
				for mi, r := range rs {
					if w.modes[mi].method == report.MethodRotation {
						r.rot = w.rotationStats(w.modes[mi], ni, r)
					}
					b := wk.bufsOf(mi)
					b.gv, b.cells = r.gv, r.cells
					r.shrink(w)
					results[mi][ni] = r
				}
				d := done.Add(int64(nm))
				if o.Progress != nil {
					mu.Lock()
					o.Progress(int(d), total)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, nil, fmt.Errorf("simulation stopped: %w", firstErr)
	}
	return results, accs, nil
}
