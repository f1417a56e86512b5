package simulate

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/report"
)

// histogramBins is the number of bins of the deviation histogram.
const histogramBins = 20

// maxListed bounds the service ports a report lists by name.
const maxListed = 20

// report merges the node results, in mode and node order, into the report.
func (w *world) report(sum *apiserver.Summary, seed uint64, results [][]*nodeResult, accs []*modeAcc) *report.Report {
	r := &report.Report{
		Scenario: w.sc.Metadata.Name, File: sum.File, Seed: seed, Cluster: sum,
		Calibrations: w.cals, Failed: []string{}, Checks: []report.Check{}, Steps: []report.Step{},
	}
	tr := &w.tr
	clientNodes := 0
	for ni, np := range tr.perNode {
		if np.conns+np.lbConns > 0 || (w.rq != nil && len(w.rq.perNode[ni]) > 0) {
			clientNodes++
		}
	}
	r.Traffic = report.Traffic{
		Connections: tr.total, SpanSeconds: secs(tr.span), ClientNodes: clientNodes,
		SourceAddresses: tr.sources, ConnectionDuration: tr.durDesc, TargetServicePorts: tr.targets,
		RequestClients: w.requestClients(),
	}
	if tr.span > 0 {
		r.Traffic.RatePerSecond = float64(tr.total) / secs(tr.span)
	}
	for _, st := range w.steps {
		rs := report.Step{AtSeconds: secs(st.at), Description: st.desc, ServicePorts: []string{}}
		for _, g := range st.changes {
			rs.ServicePorts = append(rs.ServicePorts, w.svcs[w.gvs[g].svc].label)
		}
		r.Steps = append(r.Steps, rs)
	}
	// One Holm family for the whole report: the checks' chi-square units
	// and the engine self-check's tests, from every mode.
	fam := &family{alpha: w.familyAlpha()}
	type pendingAt struct {
		pendingUnit
		base int
	}
	var pend []pendingAt
	for mi := range w.modes {
		r.Modes = append(r.Modes, w.modeReport(mi, results[mi], accs[mi]))
		cs, ps := w.evalChecks(mi, results[mi])
		for _, pu := range ps {
			pend = append(pend, pendingAt{pu, len(r.Checks)})
		}
		r.Checks = append(r.Checks, cs...)
	}
	r.External = w.externalReport(results, accs)
	// r.Checks and r.Modes are complete: the members may point into them.
	for _, pa := range pend {
		u := &r.Checks[pa.base+pa.c].Units[pa.u]
		pu := pa.pendingUnit
		fam.add(checkUnit, u.P, func(rej bool) { decideUnit(u, pu, rej, fam.alpha, fam.size()) })
	}
	for mi := range w.modes {
		w.selfCheck(mi, results[mi], accs[mi], &r.Modes[mi].SelfCheck, fam)
	}
	fam.decide()
	finishChecks(r.Checks)
	for mi := range r.Modes {
		m := &r.Modes[mi]
		finishSelfCheck(m.Mode, &m.SelfCheck)
		for _, c := range r.Checks {
			if c.Mode == m.Mode && c.Verdict != report.Pass {
				r.Failed = append(r.Failed, string(c.Mode)+"/"+c.Name)
			}
		}
		if m.SelfCheck.Verdict == report.Fail {
			r.Failed = append(r.Failed, string(m.Mode)+"/engine-self-check")
		}
	}
	r.Family = report.Family{Alpha: fam.alpha, Size: fam.size(), CheckUnits: fam.counts[checkUnit],
		SelfCheckPorts: fam.counts[selfCheckPort], UniformityTests: fam.counts[uniformityTest], Rejected: fam.rejected}
	r.Model = w.modelNotes()
	return r
}

func secs(ns int64) float64 { return float64(ns) / 1e9 }

// modeReport computes one mode's figures (the engine self-check apart),
// one section of report.Mode per step.
func (w *world) modeReport(mi int, res []*nodeResult, acc *modeAcc) report.Mode {
	md := w.modes[mi]
	reqs, ll := w.longLived(mi, res)
	return report.Mode{
		Requests:    reqs,
		LongLived:   ll,
		Mode:        md.name,
		Connections: connectionTotals(acc),
		Rules:       w.ruleFigures(md),
		Sync:        syncFigures(md, res),
		FirstPacket: w.firstPacket(mi, res),
		Conntrack:   w.conntrackPeak(res),
		Affinity:    w.affinityFigures(md, res),
		Local:       w.internalLocal(res),
		Flapping:    w.flapping(res, acc),
		Timeline:    w.timeline(md, res),
	}
}

// connectionTotals adds up the new connections by outcome over versions.
func connectionTotals(acc *modeAcc) report.Connections {
	var c report.Connections
	for _, g := range acc.gv {
		c.Total += g.Total
		c.Established += g.Established
		c.Accepted += g.Accepted
		c.Dropped += g.Dropped
		c.Rejected += g.Rejected
	}
	return c
}

// ruleFigures says what the mode's object count measures and which node
// programs the most objects (the first such node on a tie).
func (w *world) ruleFigures(md *modeData) report.Rules {
	var r report.Rules
	r.Measure = map[engine.Mode]string{
		engine.IPTables: "iptables-restore lines (rules and chains, nat and filter)",
		engine.NFTables: "nftables chains, rules, map elements and sets",
		engine.IPVS:     "ipvs virtual and real servers plus ipset entries",
	}[md.mode]
	for ni, c := range md.counts {
		r.ObjectsTotal += c.Objects
		if ni == 0 || c.Objects > r.ObjectsMax {
			r.ObjectsMax, r.MaxNode, r.Counts = c.Objects, w.nodes[ni].name, c
		}
	}
	return r
}

// syncFigures counts the syncs, one full sync per node before traffic then
// what ran, and takes the quantiles of their durations.
func syncFigures(md *modeData, res []*nodeResult) report.Sync {
	var durs []int64
	sy := report.Sync{Calibration: md.cal, Variant: md.variant, FullEstimate: md.fullEst, PartialEstimate: md.partEst}
	for ni, nr := range res {
		durs = append(durs, md.fullSync[ni])
		sy.Full++
		sy.FullSeconds = max(sy.FullSeconds, secs(md.fullSync[ni]))
		for _, s := range nr.syncs {
			durs = append(durs, s.dur)
			if s.periodic {
				sy.Periodic++
			} else {
				sy.Partial++
			}
		}
	}
	slices.Sort(durs)
	sy.Syncs = len(durs)
	sy.P50Seconds = secs(quantile(durs, 0.5))
	sy.P99Seconds = secs(quantile(durs, 0.99))
	sy.MaxSeconds = secs(durs[len(durs)-1])
	return sy
}

// conntrackPeak is the node with the most live conntrack entries at once
// (the first such node on a tie) and their memory.
func (w *world) conntrackPeak(res []*nodeResult) report.Conntrack {
	var ct report.Conntrack
	for ni, nr := range res {
		if ni == 0 || nr.peakLive > ct.PeakEntries {
			c := cost.ConntrackFor(nr.peakLive)
			ct = report.Conntrack{PeakEntries: c.PeakEntries, Bytes: c.Bytes, Node: w.nodes[ni].name, EntryBytes: cost.ConntrackEntryBytes}
		}
	}
	return ct
}

// affinityFigures measures ClientIP stickiness over every node, with its
// Clopper-Pearson interval, and notes the mode's known affinity limit.
func (w *world) affinityFigures(md *modeData, res []*nodeResult) report.Affinity {
	aff := report.Affinity{}
	for _, g := range w.svcs {
		if sp := w.gvs[g.gvs[0]].sp; sp != nil && sp.ClientIPAffinity {
			aff.ServicePorts++
		}
	}
	for _, nr := range res {
		aff.Bound += nr.bound
		aff.Kept += nr.kept
		aff.RecentEvictedLive += nr.recentEvictedLive
	}
	if aff.Bound > 0 {
		aff.Stickiness = float64(aff.Kept) / float64(aff.Bound)
		aff.CILow, aff.CIHigh = stats.ClopperPearson(int(aff.Kept), int(aff.Bound), 0.99)
	}
	switch {
	case aff.ServicePorts == 0:
		aff.Note = "no service port has sessionAffinity ClientIP"
	case md.mode == engine.IPTables && w.sc.Proxy.IPTablesAffinity == "ipset":
		aff.Note = fmt.Sprintf("iptables with ipset affinity: no per-endpoint client limit below the set's maxelem (%d)", proxy.IPSetMaxElem)
	case md.mode == engine.IPTables:
		aff.Note = fmt.Sprintf("iptables keeps at most %d clients per endpoint (xt_recent ip_list_tot); recentEvictedLive counts clients it forgot inside the timeout: a known deviation, not counted as a violation", engine.RecentListCapacity)
	}
	return aff
}

// internalLocal measures, per client node that sent traffic, the share of
// connections that internalTrafficPolicy Local dropped or rejected.
func (w *world) internalLocal(res []*nodeResult) report.InternalLocal {
	loc := report.InternalLocal{Nodes: []report.LocalNode{}}
	for s := range w.svcs {
		if w.gvs[w.svcs[s].gvs[0]].local {
			loc.ServicePorts++
		}
	}
	var sumFrac float64
	var counted int
	for ni, nr := range res {
		if nr.conns == 0 {
			continue
		}
		ln := report.LocalNode{Node: w.nodes[ni].name, Connections: nr.conns, ToLocal: nr.toLocal, Dropped: nr.localDropped, Rejected: nr.localRejected}
		ln.Fraction = float64(ln.Dropped) / float64(ln.Connections)
		if ln.ToLocal > 0 {
			ln.FractionOfLocal = float64(ln.Dropped) / float64(ln.ToLocal)
		}
		loc.MaxFraction = max(loc.MaxFraction, ln.Fraction)
		loc.MaxRefusedFraction = max(loc.MaxRefusedFraction, float64(ln.Dropped+ln.Rejected)/float64(ln.Connections))
		sumFrac += ln.Fraction
		counted++
		loc.Nodes = append(loc.Nodes, ln)
	}
	if counted > 0 {
		loc.MeanFraction = sumFrac / float64(counted)
	}
	return loc
}

// timeline bins the timeline service port's connections and misroutes over
// nodes, with the eligible endpoints of the version in force at each bin's
// start; nil when the scenario has no timeline service port.
func (w *world) timeline(md *modeData, res []*nodeResult) *report.Timeline {
	if w.tlSvc < 0 {
		return nil
	}
	tl := &report.Timeline{ServicePort: w.svcs[w.tlSvc].label, BinSeconds: secs(w.tlBin),
		Eligible: make([]int, w.tlBins), Connections: make([]int64, w.tlBins), Misrouted: make([]int64, w.tlBins)}
	for _, nr := range res {
		for b := range w.tlBins {
			tl.Connections[b] += nr.tlConns[b]
			tl.Misrouted[b] += nr.tlMis[b]
		}
	}
	sv := &w.svcs[w.tlSvc]
	for b := range w.tlBins {
		t := int64(b) * w.tlBin
		g := sv.gvs[0]
		for _, v := range sv.gvs[1:] {
			if w.steps[w.gvs[v].step].at <= t {
				g = v
			}
		}
		tl.Eligible[b] = md.eligible[g]
	}
	return tl
}

// quantile of sorted values, as apiserver.Summary computes them.
func quantile(v []int64, p float64) int64 {
	if len(v) == 0 {
		return 0
	}
	return v[min(len(v)-1, int(p*float64(len(v))))]
}

// flapping measures the exposure window of every timeline step on every
// node, and the connections decided by stale rules.
func (w *world) flapping(res []*nodeResult, acc *modeAcc) report.Flapping {
	f := report.Flapping{Steps: []report.StepWindow{}}
	var all []int64
	for k, st := range w.steps {
		sw := report.StepWindow{Step: k + 1, AtSeconds: secs(st.at)}
		var ws []int64
		for _, nr := range res {
			x := nr.window[k]
			if x < 0 {
				continue
			}
			ws = append(ws, x)
			if st.at+x > w.tr.span {
				sw.Open++
			}
		}
		for _, g := range st.changes {
			sw.ConnectionsInWindow += acc.gv[g].InWindow
			sw.Misrouted += acc.gv[g].Misrouted
		}
		if len(ws) > 0 {
			slices.Sort(ws)
			sw.WindowP50Seconds = secs(quantile(ws, 0.5))
			sw.WindowMaxSeconds = secs(ws[len(ws)-1])
			all = append(all, ws...)
		}
		f.Steps = append(f.Steps, sw)
	}
	for _, c := range acc.gv {
		f.ConnectionsInWindow += c.InWindow
		f.Misrouted += c.Misrouted
		f.Refused += c.Refused
		f.MismatchedAfterSync += c.Mismatched
	}
	if len(all) > 0 {
		slices.Sort(all)
		f.WindowP50Seconds = secs(quantile(all, 0.5))
		f.WindowMaxSeconds = secs(all[len(all)-1])
	}
	return f
}

// histogram bins deviations on a log scale, four bins a decade from
// 10^-5 to 1 (the same bins in every mode, so they overlay); smaller
// values count in the first bin.
func histogram(v []float64) []report.Bin {
	bins := make([]report.Bin, histogramBins)
	for i := range bins {
		bins[i].Lo = math.Pow(10, -5+float64(i)/4)
		bins[i].Hi = math.Pow(10, -5+float64(i+1)/4)
	}
	for _, x := range v {
		i := 0
		if x > 0 {
			i = int(math.Floor((math.Log10(x) + 5) * 4))
		}
		bins[max(0, min(histogramBins-1, i))].Count++
	}
	return bins
}

// modelNotes states what the simulation models, for the report.
func (w *world) modelNotes() []string {
	p := w.sc.Proxy
	minSync := time.Duration(0)
	if p.MinSyncPeriod != nil {
		minSync = p.MinSyncPeriod.Duration
	}
	notes := []string{
		fmt.Sprintf("traffic: %d connections over %s of virtual time, one arrival per equal slot at a uniform offset inside it (stratified, so counts per interval are exact); client addresses are synthetic (100.64.0.0/10); source ports from 32768-60999", w.tr.total, time.Duration(w.tr.span)),
		"events are written through the cluster model's clientset at their time; the oracle follows the API state at once, a node's rules only when a sync that started after the write ends",
		fmt.Sprintf("sync runner per node: kube-proxy's BoundedFrequencyRunner (minSyncPeriod %s, burst 2, one run at a time); the initial full sync ends before traffic starts; sync times from the cost model at the node's size", minSync),
		"per-node conntrack: an established flow keeps its endpoint; new connections that reuse a live tuple follow it and are not counted as decisions; a node's table is split by service port into cache-sized shards, which changes nothing without nf_conntrack_max (not modelled)",
		"misrouted: a connection decided by stale rules that reached an endpoint the API state no longer allowed (not ready, terminating with ready peers, removed); mismatchedAfterSync: any outcome different from the oracle's while the node's rules were up to date",
		"conntrack peak: live entries counted from each new flow's start to its end plus TIME_WAIT (120 s) or the UDP timeout (30 s), at about 1/4096 of the run; kernel memory at cost.ConntrackEntryBytes per entry",
	}
	notes = append(notes, w.requestNotes()...)
	for _, md := range w.modes {
		if md.fault != engine.NoFault {
			notes = append(notes, fmt.Sprintf("engine fault injected in %s: %s (a test of the engine self-check): this is a report of a deliberately broken engine", md.name, md.fault))
		}
	}
	return notes
}
