package simulate

// The engine self-check: each mode's engines' draws held against the
// oracle's shares, over every service port. It tests the simulator, not a
// dataplane: a correct engine passes it by construction (except with
// probability about α), and a failure is a bug in sim/engine or sim/oracle.
//
// Random modes: a chi-square per stratum (one version of a service port,
// merged over the nodes when every node expects the same shares, per node
// otherwise), summed with their df per service port, each service port a
// member of the report's Holm family; then a Kolmogorov-Smirnov test that
// the ports' p-values are uniform, itself a member. Pooling strata with
// different shares under one expectation (what the section did before)
// makes the statistic under-dispersed: too many p-values near 1.
//
// ipvs rr and wrr rotate: in a (node, version) stratum the eligible
// endpoints' counts differ by at most one (plus one per wrr restart), so a
// chi-square against uniform shares would pass by construction; they get
// that bound instead. The hash and least-connection schedulers are not a
// draw from the oracle's shares and are not tested.

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/report"
	"github.com/kpsim/kpsim/sim/scenario"
)

// pValueBins is the number of bins of the p-value histogram.
const pValueBins = 20

// testMethod says how a mode's draws are tested (report.Method*), and why
// when they are not drawn at random.
func (w *world) testMethod(mode engine.Mode) (method, reason string) {
	if mode != engine.IPVS {
		return report.MethodChiSquare, ""
	}
	s := w.sc.Proxy.IPVSScheduler
	if s == "" {
		s = scenario.DefaultIPVSScheduler
	}
	switch s {
	case "rr", "wrr":
		return report.MethodRotation, s + " is a deterministic rotation, not a random draw"
	case "sh":
		return report.MethodNone, "sh hashes the client address: shares are uniform only over many clients"
	case "dh":
		return report.MethodNone, "dh hashes the ClusterIP: one endpoint takes every connection"
	case "lc", "wlc", "sed", "nq":
		return report.MethodNone, s + " follows the connections each endpoint holds, not a draw"
	}
	return report.MethodChiSquare, "" // mh: a hash of the source address and port, random source ports
}

// versionSample is one stratum of a service port: one version's fresh
// connections, from one node or from every node, against the oracle's
// outcome.
func versionSample(k int, fresh int64, cell func(id int) float64, o *outcome) *sample {
	sm := newSample(k)
	sm.add(fresh, cell, o)
	return sm
}

// portStrata are a service port's strata over every client node: one per
// version, merged over the nodes when every node expects the same shares
// (the mode's totals; a sum of multinomials with the same shares is one
// multinomial), one per node and version otherwise.
func (w *world) portStrata(mi int, res []*nodeResult, acc *modeAcc, s int32) []*sample {
	md := w.modes[mi]
	k := len(w.svcs[s].eps)
	var out []*sample
	for _, g := range w.svcs[s].gvs {
		if !w.gvs[g].nodeDep {
			off := w.gvs[g].cellOff
			out = append(out, versionSample(k, acc.gv[g].Fresh, func(id int) float64 { return float64(acc.cells[off+int32(id)]) }, &md.outs[md.outAt(int(g), 0)]))
			continue
		}
		for ni, nr := range res {
			kg := nr.perNode[g]
			out = append(out, versionSample(k, kg.c.Fresh, func(id int) float64 { return float64(kg.cells[id]) }, &md.outs[md.outAt(int(g), ni)]))
		}
	}
	return out
}

// nodeStrata are a service port's strata on one node: one per version.
func (w *world) nodeStrata(mi int, nr *nodeResult, ni int, s int32) []*sample {
	md := w.modes[mi]
	k := len(w.svcs[s].eps)
	var out []*sample
	for _, g := range w.svcs[s].gvs {
		kg := nr.perNode[g]
		out = append(out, versionSample(k, kg.c.Fresh, func(id int) float64 { return float64(kg.cells[id]) }, &md.outs[md.outAt(int(g), ni)]))
	}
	return out
}

// stratified is the sum of a service port's per-stratum chi-squares.
type stratified struct {
	stat float64
	df   int
	p    float64
	// n counts the connections of the tested strata, leftOut those of
	// strata too small for a chi-square (fewer than two cells with an
	// expected count of stats.MinExpected after merging).
	n, leftOut float64
	strata     int
	// w2n is Σ n_s·w²_s of the one-off alternative at the given MDE over
	// the tested strata: the noncentrality of the summed statistic.
	w2n float64
	// maxDev is the largest |observed − expected| share of a tested
	// stratum.
	maxDev     float64
	impossible bool
}

// testStrata runs a chi-square per stratum (stats.ChiSquareGOF, which
// merges cells below stats.MinExpected) and sums the statistics and their
// df; p is the chi-square's survival at the sums. A stratum where an
// endpoint the oracle excludes received a connection makes p 0. tested is
// false when no stratum had df ≥ 1 and none was impossible.
func testStrata(strata []*sample, mde float64) (st stratified, tested bool, err error) {
	for _, sm := range strata {
		if sm.n == 0 {
			continue
		}
		r, err := stats.ChiSquareGOF(sm.obs, sm.exp)
		switch {
		case stats.IsTooFewObservations(err):
			st.leftOut += sm.n
			continue
		case err != nil:
			return st, false, err
		}
		if len(r.Impossible) > 0 {
			st.impossible = true
		}
		if r.DF == 0 {
			continue // one eligible endpoint: nothing to fit
		}
		cells := 0
		for _, e := range sm.exp {
			if e > 0 {
				cells++
			}
		}
		st.stat += r.Statistic
		st.df += r.DF
		st.n += sm.n
		st.strata++
		st.maxDev = max(st.maxDev, r.MaxAbsDeviation)
		if mde > 0 {
			st.w2n += sm.n * stats.EffectW2(stats.Uniform(cells), stats.OneOffAlternative(cells, mde))
		}
	}
	switch {
	case st.impossible:
		st.p = 0
	case st.df > 0:
		st.p = distuv.ChiSquared{K: float64(st.df)}.Survival(st.stat)
	default:
		return st, false, nil
	}
	return st, true, nil
}

// rotStat is one version's rotation figures on one node (ipvs rr, wrr).
type rotStat struct {
	// n counts the fresh connections; spread is max − min of the eligible
	// endpoints' counts (when at least two are eligible); forbidden counts
	// fresh connections to endpoints the oracle excludes.
	n, spread, forbidden int32
	eligible             int32
}

// rotationStats computes a node's rotation figures per version from its
// full counts (before shrink drops them).
func (w *world) rotationStats(md *modeData, ni int, r *nodeResult) []rotStat {
	out := make([]rotStat, len(w.gvs))
	for g := range w.gvs {
		o := &md.outs[md.outAt(g, ni)]
		k := len(w.svcs[w.gvs[g].svc].eps)
		cells := r.cells[w.gvs[g].cellOff : w.gvs[g].cellOff+int32(k)]
		rs := rotStat{n: int32(r.gv[g].Fresh)}
		lo, hi := int32(math.MaxInt32), int32(0)
		for id, c := range cells {
			if o.kind != oracle.Endpoints || !o.allows(int32(id)) {
				rs.forbidden += int32(c)
				continue
			}
			rs.eligible++
			lo, hi = min(lo, int32(c)), max(hi, int32(c))
		}
		if rs.eligible >= 2 {
			rs.spread = hi - lo
		}
		out[g] = rs
	}
	return out
}

// rotationBound is the largest max − min count a correct rotation can give
// in one (node, version) stratum of version g: 1 for rr, whose mark
// survives the deletion of a drained real server (ip_vs_del_dest moves it
// to the previous dest); for wrr one more per such deletion, which
// restarts it from the head (ip_vs_wrr_dest_changed): at most the real
// servers of the service port's earlier versions on the node that version
// g does not have (each is deleted once, when it has drained).
func (w *world) rotationBound(md *modeData, g int32, ni int) int32 {
	if w.sc.Proxy.IPVSScheduler != "wrr" {
		return 1
	}
	cur := md.ruleAt(int(g), ni)
	gone := map[int32]bool{}
	for _, e := range w.svcs[w.gvs[g].svc].gvs {
		if e == g {
			break
		}
		for _, b := range md.ruleAt(int(e), ni).Backends {
			if !hasBackend(cur, b.ID) {
				gone[b.ID] = true
			}
		}
	}
	return 1 + int32(len(gone))
}

// rotationCheck is the rotation check of one service port over the given
// nodes' strata: the strata checked (two or more eligible endpoints, two
// or more connections) and their connections, the spread and bound of the
// stratum that exceeds its bound the most (or comes closest), the fresh
// connections to excluded endpoints, and whether any stratum broke the
// rotation.
type rotationCheck struct {
	strata        int
	n             int64
	spread, bound int32
	forbidden     int64
	broken        bool
}

// checkRotation runs the rotation check of service port s on the given
// nodes.
func (w *world) checkRotation(mi int, res []*nodeResult, nodes []int, s int32) rotationCheck {
	md := w.modes[mi]
	var rc rotationCheck
	for _, g := range w.svcs[s].gvs {
		for _, ni := range nodes {
			rs := res[ni].rot[g]
			rc.forbidden += int64(rs.forbidden)
			if rs.forbidden > 0 {
				rc.broken = true
			}
			if rs.eligible < 2 || rs.n < 2 {
				continue
			}
			rc.strata++
			rc.n += int64(rs.n)
			b := w.rotationBound(md, g, ni)
			if rs.spread > b {
				rc.broken = true
			}
			if rc.strata == 1 || rs.spread-b > rc.spread-rc.bound {
				rc.spread, rc.bound = rs.spread, b
			}
		}
	}
	return rc
}

// allNodes is 0..n−1.
func (w *world) allNodes() []int {
	out := make([]int, len(w.nodes))
	for i := range out {
		out[i] = i
	}
	return out
}

// selfCheck fills one mode's engine self-check and puts its tests into the
// report's family; finishSelfCheck completes it after the family's
// decision.
func (w *world) selfCheck(mi int, res []*nodeResult, acc *modeAcc, sc *report.SelfCheck, fam *family) {
	md := w.modes[mi]
	*sc = report.SelfCheck{What: report.SelfCheckWhat, Verdict: report.Pass, Findings: []string{}}
	sc.Method, sc.Reason = w.testMethod(md.mode)
	sc.Note = "sample: connections decided afresh by up-to-date rules (not conntrack, not affinity); a stratum is one version of a service port, merged over the client nodes when every node expects the same shares, per node otherwise (internalTrafficPolicy Local, topology hints)"
	if sc.Method == report.MethodNone {
		sc.Verdict = report.NotTested
		sc.Skipped = len(w.svcs)
		return
	}
	var ps, devs []float64
	for s := range w.svcs {
		label := w.svcs[s].label
		strata := w.portStrata(mi, res, acc, int32(s))
		var dev float64
		for _, sm := range strata {
			if sm.n >= stats.MinExpected*float64(sm.cells()) {
				dev = max(dev, sm.maxAbsDeviation())
			}
		}
		if sc.Method == report.MethodRotation {
			rc := w.checkRotation(mi, res, w.allNodes(), int32(s))
			if rc.strata == 0 && rc.forbidden == 0 {
				sc.Skipped++
				continue
			}
			sc.ServicePorts++
			sc.Strata += rc.strata
			w.noteRotation(sc, rc, label)
		} else {
			st, tested, err := testStrata(strata, 0)
			if err != nil || !tested {
				sc.Skipped++
				continue
			}
			sc.ServicePorts++
			sc.Strata += st.strata
			sc.LeftOut += int64(st.leftOut)
			ps = append(ps, st.p)
			if st.p < sc.WorstP || sc.WorstPServicePort == "" {
				sc.WorstP, sc.WorstPServicePort = st.p, label
			}
			fam.add(selfCheckPort, st.p, func(rej bool) {
				if rej {
					sc.Rejected++
					if len(sc.RejectedServicePorts) < maxListed {
						sc.RejectedServicePorts = append(sc.RejectedServicePorts, label)
					}
				}
			})
		}
		devs = append(devs, dev)
		if dev > sc.WorstDeviation || sc.WorstDeviationServicePort == "" {
			sc.WorstDeviation, sc.WorstDeviationServicePort = dev, label
		}
	}
	sc.Histogram = histogram(devs)
	if sc.Method == report.MethodChiSquare {
		sc.Uniformity = uniformity(ps)
		if len(ps) > 0 {
			fam.add(uniformityTest, sc.Uniformity.P, func(rej bool) { sc.Uniformity.Rejected = rej })
		}
	}
}

// noteRotation counts one service port's rotation check in the section.
func (w *world) noteRotation(sc *report.SelfCheck, rc rotationCheck, label string) {
	rt := sc.Rotation
	if rt == nil {
		s := w.sc.Proxy.IPVSScheduler
		if s == "" {
			s = scenario.DefaultIPVSScheduler
		}
		rt = &report.Rotation{Scheduler: s}
		sc.Rotation = rt
	}
	rt.Strata += rc.strata
	rt.Forbidden += rc.forbidden
	if rt.ServicePort == "" || int(rc.spread-rc.bound) > rt.Spread-rt.Bound {
		rt.Spread, rt.Bound, rt.ServicePort = int(rc.spread), int(rc.bound), label
	}
	if rc.broken {
		sc.Rejected++
		if len(sc.RejectedServicePorts) < maxListed {
			sc.RejectedServicePorts = append(sc.RejectedServicePorts, label)
		}
	}
}

// uniformity tests p-values against U(0,1) (Kolmogorov-Smirnov) and counts
// the tails.
func uniformity(ps []float64) *report.Uniformity {
	u := &report.Uniformity{Test: "Kolmogorov-Smirnov against U(0,1)", N: len(ps), Expected: 0.05 * float64(len(ps)), P: 1}
	u.D, u.P = stats.KSUniform(ps)
	u.Histogram = make([]report.Bin, pValueBins)
	for i := range u.Histogram {
		u.Histogram[i].Lo = float64(i) / pValueBins
		u.Histogram[i].Hi = float64(i+1) / pValueBins
	}
	for _, p := range ps {
		if p <= 0.05 {
			u.AtMost05++
		}
		if p >= 0.95 {
			u.AtLeast95++
		}
		u.Histogram[max(0, min(pValueBins-1, int(p*pValueBins)))].Count++
	}
	return u
}

// finishSelfCheck sets the verdict and says in plain words what the
// self-check found, after the family's decision.
func finishSelfCheck(mode cluster.Mode, sc *report.SelfCheck) {
	u, rt := sc.Uniformity, sc.Rotation
	switch {
	case sc.Method == report.MethodNone:
		sc.Findings = append(sc.Findings, fmt.Sprintf("%s: not tested: %s; a chi-square against uniform shares would fail a correct engine or pass by construction.", mode, sc.Reason))
		return
	case sc.ServicePorts == 0:
		sc.Findings = append(sc.Findings, string(mode)+": no service port had two eligible endpoints and enough connections: nothing was tested.")
		return
	case sc.Method == report.MethodRotation:
		if sc.Rejected > 0 {
			sc.Verdict = report.Fail
			sc.Findings = append(sc.Findings, fmt.Sprintf("%s: the rotation is broken in %d of %d service ports (worst: max − min count %d against a bound of %d, in %s; %d connection(s) to excluded endpoints): the simulator's ipvs engine does not rotate as ip_vs_%s does. This is a bug in the simulator, not a finding about a kernel.",
				mode, sc.Rejected, sc.ServicePorts, rt.Spread, rt.Bound, rt.ServicePort, rt.Forbidden, rt.Scheduler))
			return
		}
		sc.Findings = append(sc.Findings, fmt.Sprintf("%s: %s, so no chi-square (its p-values would sit near 1: a pass by construction); instead, in each of %d (node, version) strata of %d service ports, the eligible endpoints' counts differ by at most the rotation's bound (1, plus one per restart wrr can make; closest: max − min %d against %d): the engine rotates as ip_vs_%s does.",
			mode, sc.Reason, rt.Strata, sc.ServicePorts, rt.Spread, rt.Bound, rt.Scheduler))
		return
	}
	tails := fmt.Sprintf("%d at p ≤ 0.05 and %d at p ≥ 0.95, %.1f expected each", u.AtMost05, u.AtLeast95, u.Expected)
	if sc.Rejected > 0 {
		sc.Verdict = report.Fail
		sc.Findings = append(sc.Findings, fmt.Sprintf("%s: Holm rejects the oracle's shares for %d of %d service ports (worst p = %.3g, %s): the engine's draws differ from what the oracle expects. This is a bug in the simulator's engine or oracle, not a finding about a kernel.",
			mode, sc.Rejected, sc.ServicePorts, sc.WorstP, sc.WorstPServicePort))
	}
	if u.Rejected {
		sc.Verdict = report.Fail
		how := "too many small p-values: the draws do not follow the oracle's shares"
		if u.AtLeast95 > u.AtMost05 {
			how = "too many large p-values: the test is too lenient (or the draws too even) to mean what it says"
		}
		sc.Findings = append(sc.Findings, fmt.Sprintf("%s: the per-port p-values are not uniform (KS D = %.3f, p = %.3g; %s): %s. The self-check fails on this alone.", mode, u.D, u.P, tails, how))
	}
	if sc.Verdict == report.Pass {
		sc.Findings = append(sc.Findings, fmt.Sprintf("%s: none of %d service ports rejected, and their p-values are consistent with uniform (KS D = %.3f, p = %.3g; %s): the engine draws as the oracle says.", mode, sc.ServicePorts, u.D, u.P, tails))
	}
}
