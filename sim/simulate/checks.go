package simulate

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/report"
	"github.com/kpsim/kpsim/sim/scenario"
)

// prepareChecks marks what the runs must follow for the checks: the
// versions whose per-node counts are kept (checked service ports, and
// versions whose expectation differs between nodes), and the client nodes
// of each affinity check, whose connections the oracle's affinity tracker
// observes.
func (w *world) prepareChecks() {
	w.keep = make([]bool, len(w.gvs))
	for g := range w.gvs {
		// External entries' per-node counts feed the external section
		// (its health-check lags are per node).
		w.keep[g] = w.gvs[g].nodeDep || w.gvs[g].svc >= w.nBase
	}
	for i := range w.sc.Checks {
		c := &w.sc.Checks[i]
		s, err := w.checkService(c)
		if err != nil {
			continue // evalChecks reports it
		}
		for _, g := range w.svcs[s].gvs {
			w.keep[g] = true
		}
		if c.Type != scenario.CheckAffinity && c.Type != scenario.CheckExternalAffinity {
			continue
		}
		if w.affCheck == nil {
			w.affCheck = map[int32][]bool{}
		}
		if w.affCheck[s] == nil {
			w.affCheck[s] = make([]bool, len(w.nodes))
		}
		for _, ni := range w.clientNodes(c, s) {
			w.affCheck[s][ni] = true
		}
	}
}

// clientNodes are the nodes a check of service port s looks at
// (scenario.Check.Nodes), in the world's node order.
func (w *world) clientNodes(c *scenario.Check, s int32) []int {
	all := make([]string, len(w.nodes))
	for ni, n := range w.nodes {
		all[ni] = n.name
	}
	n := w.svcs[s].name
	t := scenario.Target{Service: n.NamespacedName.String(), Port: n.Port, Protocol: string(n.Protocol)}
	in := map[string]bool{}
	for _, name := range c.Nodes(w.sc, all, t) {
		in[name] = true
	}
	var out []int
	for ni, name := range all {
		if in[name] {
			out = append(out, ni)
		}
	}
	return out
}

// familyAlpha is the family-wise level of the report's Holm family: the
// smallest alpha of the scenario's distribution checks, else the default.
func (w *world) familyAlpha() float64 {
	a := 0.0
	for _, c := range w.sc.Checks {
		if c.Type == scenario.CheckDistribution && c.Alpha > 0 && (a == 0 || c.Alpha < a) {
			a = c.Alpha
		}
	}
	if a == 0 {
		a = stats.DefaultFamilyAlpha
	}
	return a
}

// unitCounts sums a node's counts over a service port's versions.
type unitCounts struct {
	decisions, mismatched, inWindow, misrouted int64
	kinds                                      []oracle.Kind
	devs                                       []string
}

func (w *world) unitCounts(mi int, nr *nodeResult, ni int, s int32) unitCounts {
	md := w.modes[mi]
	var u unitCounts
	for _, g := range w.svcs[s].gvs {
		c := nr.perNode[g].c
		u.decisions += c.Decisions
		u.mismatched += c.Mismatched
		u.inWindow += c.InWindow
		u.misrouted += c.Misrouted
		o := &md.outs[md.outAt(int(g), ni)]
		if !slices.Contains(u.kinds, o.kind) {
			u.kinds = append(u.kinds, o.kind)
		}
		for _, d := range o.devs {
			if !slices.Contains(u.devs, d) {
				u.devs = append(u.devs, d)
			}
		}
	}
	return u
}

func kindsString(ks []oracle.Kind) string {
	if len(ks) == 1 {
		return ks[0].String()
	}
	var parts []string
	for _, k := range ks {
		parts = append(parts, k.String())
	}
	return "mixed: " + strings.Join(parts, ", ")
}

// sample is a chi-square's observed counts and expectation over a
// service port's endpoints.
type sample struct {
	obs, exp []float64
	n        float64
}

func newSample(k int) *sample { return &sample{obs: make([]float64, k), exp: make([]float64, k)} }

// add adds one version's fresh connections with the oracle's outcome:
// observed per endpoint, expected fresh/n on each allowed endpoint.
// Versions where the oracle expects no endpoint are left out: their
// connections are mismatches, counted apart.
func (sm *sample) add(fresh int64, cell func(id int) float64, o *outcome) {
	if fresh == 0 || o.kind != oracle.Endpoints || o.n == 0 {
		return
	}
	for id := range sm.obs {
		sm.obs[id] += cell(id)
		if o.allows(int32(id)) {
			sm.exp[id] += float64(fresh) / float64(o.n)
		}
	}
	sm.n += float64(fresh)
}

// cells is the number of endpoints with an expectation.
func (sm *sample) cells() int {
	n := 0
	for _, e := range sm.exp {
		if e > 0 {
			n++
		}
	}
	return n
}

// maxAbsDeviation is the largest |observed − expected| share of one
// endpoint.
func (sm *sample) maxAbsDeviation() float64 {
	if sm.n == 0 {
		return 0
	}
	d := 0.0
	for i := range sm.obs {
		d = max(d, math.Abs(sm.obs[i]-sm.exp[i])/sm.n)
	}
	return d
}

// pendingUnit is a distribution check's chi-square unit waiting for the
// report's Holm family: where it is in the mode's checks, and what its
// power needs once m is known.
type pendingUnit struct {
	c, u  int
	w2    float64 // Σ n_s·w²_s / n over its strata, at the check's MDE
	power float64 // the check's target power
}

// evalChecks applies the scenario's checks to one mode's simulated
// traffic. Every chi-square unit (a distribution check on one client node)
// is returned pending, to be decided in the report's Holm family; the
// other checks, and the rotation checks of ipvs rr and wrr, are exact.
func (w *world) evalChecks(mi int, res []*nodeResult) ([]report.Check, []pendingUnit) {
	md := w.modes[mi]
	var pend []pendingUnit
	var out []report.Check
	for i := range w.sc.Checks {
		c := &w.sc.Checks[i]
		rc := report.Check{Mode: md.name, Name: c.Name, Type: c.Type, ServicePort: c.Service, Verdict: report.Pass, Units: []report.Unit{}}
		if c.Port != "" {
			rc.ServicePort += ":" + c.Port
		}
		s, err := w.checkService(c)
		if err != nil {
			// Validation resolves every check before anything runs; this is
			// reached only by a scenario built in code.
			rc.Verdict, rc.Message = report.Error, err.Error()
			out = append(out, rc)
			continue
		}
		rc.ServicePort = w.svcs[s].label
		nodes := w.clientNodes(c, s)
		if c.Type == scenario.CheckExternalLocalBalance {
			rc.Units = append(rc.Units, w.balanceUnit(mi, res, s))
			out = append(out, rc)
			continue
		}
		if len(nodes) == 0 {
			rc.Verdict, rc.Message = report.Error, "no client sends traffic to it"
			out = append(out, rc)
			continue
		}
		if c.Type == scenario.CheckDistribution {
			rc.Alpha = w.familyAlpha()
		}
		for _, ni := range nodes {
			u, pu, ok := w.evalUnit(mi, res, ni, s, c, &rc)
			if ok {
				pu.c, pu.u = len(out), len(rc.Units)
				pend = append(pend, pu)
			}
			rc.Units = append(rc.Units, u)
		}
		out = append(out, rc)
	}
	return out, pend
}

// evalUnit is one check on one client node. ok is true when the unit is a
// chi-square that waits for the family (pu tells how).
func (w *world) evalUnit(mi int, res []*nodeResult, ni int, s int32, c *scenario.Check, rc *report.Check) (u report.Unit, pu pendingUnit, ok bool) {
	nr := res[ni]
	uc := w.unitCounts(mi, nr, ni, s)
	u = report.Unit{ClientNode: w.nodes[ni].name, Verdict: report.Pass, Expected: kindsString(uc.kinds),
		Decisions: uc.decisions, Mismatched: uc.mismatched, InWindow: uc.inWindow, Misrouted: uc.misrouted}
	for _, d := range uc.devs {
		if !slices.Contains(rc.Deviations, d) {
			rc.Deviations = append(rc.Deviations, d)
		}
	}
	exact := func(what string) {
		if uc.mismatched > 0 {
			u.Verdict = report.Fail
			u.Message = fmt.Sprintf("%d of %d connections decided by up-to-date rules disagreed with the oracle (%s)", uc.mismatched, uc.decisions, what)
		}
	}
	switch {
	case uc.decisions == 0:
		u.Verdict, u.Message = report.Error, "no connection from this node was decided by up-to-date rules"
	case c.Type == scenario.CheckDistribution:
		exact("a DROP or REJECT, or an endpoint the oracle excludes")
		if u.Verdict != report.Pass {
			break
		}
		pu, ok = w.distributionUnit(mi, res, ni, s, c, &u)
	case c.Type == scenario.CheckAffinity || c.Type == scenario.CheckExternalAffinity:
		ac := nr.aff[s]
		if ac == nil {
			ac = &affCount{}
		}
		u.Bound, u.Violations, u.Known = ac.bound, ac.violations, ac.known
		switch {
		case ac.violations > 0:
			u.Verdict = report.Fail
			u.Message = fmt.Sprintf("%d of %d connections of bound clients reached another endpoint", ac.violations, ac.bound)
		case ac.bound == 0:
			u.Verdict, u.Message = report.Error, "no client reconnected inside the affinity timeout: stickiness was not exercised"
		case ac.known > 0:
			u.Message = fmt.Sprintf("%d connection(s) lost their endpoint to a documented limit (known deviation)", ac.known)
		}
	case c.Type == scenario.CheckNoEndpoints:
		exact("REJECT expected")
		if u.Verdict == report.Pass && (len(uc.kinds) != 1 || uc.kinds[0] != oracle.Reject) {
			u.Verdict = report.Fail
			u.Message = "the service port has usable endpoints: the oracle expects " + kindsString(uc.kinds) + ", not REJECT"
		}
	case c.Type == scenario.CheckInternalTrafficLocal:
		exact("DROP where the oracle says DROP, local endpoints otherwise")
	case c.Type == scenario.CheckFlapping:
		exact("misrouted after the sync completed")
		if u.Verdict == report.Pass && uc.inWindow > 0 {
			u.Message = fmt.Sprintf("%d connection(s) decided by stale rules inside the exposure window, %d of them misrouted (expected there)", uc.inWindow, uc.misrouted)
		}
	case c.Type == scenario.CheckTerminating:
		exact("the terminating-endpoint fallback")
	case c.Type == scenario.CheckUDPFlow || c.Type == scenario.CheckTCPEstablished || c.Type == scenario.CheckAffinityMoves:
		exact("new connections")
		if u.Verdict == report.Pass {
			u.Message = "new connections only: sim run does not model established flows (sim conform checks them on the kernel)"
		}
	case c.Type == scenario.CheckExternalDistribution:
		exact("a DROP or REJECT, or an endpoint the oracle excludes, for a connection entering at this node")
		if u.Verdict == report.Pass {
			pu, ok = w.distributionUnit(mi, res, ni, s, c, &u)
		}
	default:
		exact("endpoints the oracle allows")
		if u.Verdict == report.Pass {
			u.Message = "only the endpoints chosen are checked: sim run does not model source addresses, health check answers, source ranges or hairpin (sim conform checks them on the kernel)"
		}
	}
	return u, pu, ok
}

// distributionUnit tests one node's fresh connections to a checked service
// port the mode's way: a chi-square per version summed (pending for the
// family), the rotation bound (ipvs rr, wrr), or nothing beyond the exact
// check (the other ipvs schedulers).
func (w *world) distributionUnit(mi int, res []*nodeResult, ni int, s int32, c *scenario.Check, u *report.Unit) (pendingUnit, bool) {
	md := w.modes[mi]
	strata := w.nodeStrata(mi, res[ni], ni, s)
	eligible := 0
	var n float64
	for _, sm := range strata {
		eligible = max(eligible, sm.cells())
		n += sm.n
	}
	method, reason := w.testMethod(md.mode)
	switch {
	case eligible == 1:
		u.Message = "one eligible endpoint: every connection must reach it, and did"
		return pendingUnit{}, false
	case eligible == 0:
		u.Message = "the oracle expects no endpoint: outcomes checked exactly"
		return pendingUnit{}, false
	case method == report.MethodNone:
		u.Message = "no chi-square: " + reason + "; outcomes checked exactly"
		return pendingUnit{}, false
	case method == report.MethodRotation:
		rc := w.checkRotation(mi, res, []int{ni}, s)
		u.Test, u.Statistic, u.N, u.Strata = "rotation", float64(rc.spread), rc.n, rc.strata
		switch {
		case rc.broken:
			u.Verdict = report.Fail
			u.Message = fmt.Sprintf("%s, yet one version's eligible endpoints' counts differ by %d (bound %d), %d connection(s) to excluded endpoints", reason, rc.spread, rc.bound, rc.forbidden)
		case rc.strata == 0:
			u.Verdict, u.Message = report.Error, fmt.Sprintf("too few connections for the rotation check: %g over its versions (need two in one version)", n)
		default:
			u.Message = fmt.Sprintf("%s: no chi-square (it would pass by construction); in each of %d version(s) the eligible endpoints' counts differ by at most %d (largest %d)", reason, rc.strata, rc.bound, rc.spread)
		}
		return pendingUnit{}, false
	}
	st, tested, err := testStrata(strata, c.MDE)
	switch {
	case err != nil:
		u.Verdict, u.Message = report.Error, err.Error()
		return pendingUnit{}, false
	case !tested:
		u.Verdict = report.Error
		u.Message = fmt.Sprintf("too few connections for a chi-square: %g over %d eligible endpoints in %d version(s) (need %g per endpoint in one version)", n, eligible, len(strata), stats.MinExpected)
		return pendingUnit{}, false
	}
	u.Test, u.Statistic, u.DF, u.P, u.N, u.MaxAbsDeviation, u.Strata = "chi-square goodness of fit, summed over versions", st.stat, st.df, st.p, int64(st.n), st.maxDev, st.strata
	return pendingUnit{w2: st.w2n / st.n, power: c.Power}, true
}

// decideUnit applies the family's decision and m to a pending unit.
func decideUnit(u *report.Unit, pu pendingUnit, rejected bool, alpha float64, m int) {
	a := alpha / float64(max(1, m))
	u.Power = stats.ChiSquarePower(int(u.N), pu.w2, u.DF, a)
	u.RequiredN = stats.ChiSquareSampleSize(pu.w2, u.DF, a, pu.power)
	if rejected {
		u.Verdict = report.Fail
		u.Message = fmt.Sprintf("chi-square p = %.3g rejects the oracle's distribution (Holm, family α = %g over the report's %d tests)", u.P, alpha, m)
	}
}

// finishChecks sets each check's verdict from its units, after the
// family's decision.
func finishChecks(out []report.Check) {
	for i := range out {
		rc := &out[i]
		if rc.Verdict != report.Pass {
			continue
		}
		var bad []string
		for _, u := range rc.Units {
			switch u.Verdict {
			case report.Fail:
				rc.Verdict = report.Fail
				bad = append(bad, u.ClientNode)
			case report.Error:
				if rc.Verdict == report.Pass {
					rc.Verdict = report.Error
				}
				bad = append(bad, u.ClientNode)
			}
		}
		if len(bad) > 0 {
			rc.Message = fmt.Sprintf("%s on %d of %d client node(s): %s", rc.Verdict, len(bad), len(rc.Units), strings.Join(bad, ", "))
		}
	}
}

// balanceUnit is an external-local-balance check in sim run: one verdict
// for the balancer, from every node's connections to the entry's initial
// state: no connection decided against the oracle, and each pod's share
// inside its simultaneous interval around what the oracle expects of a
// balancer over the client's nodes (the external section's figures).
func (w *world) balanceUnit(mi int, res []*nodeResult, x int32) report.Unit {
	u := report.Unit{ClientNode: "load balancer", Verdict: report.Pass}
	if w.ext == nil || len(w.ext.byEntry[x]) == 0 {
		u.Verdict, u.Message = report.Error, "no client outside the cluster sends to it through a load balancer"
		return u
	}
	acc := &modeAcc{gv: make([]gvCount, len(w.gvs)), cells: make([]uint64, w.cells)}
	for ni, nr := range res {
		for _, g := range w.svcs[x].gvs {
			if kg := nr.perNode[g]; kg != nil {
				acc.gv[g].add(&kg.c)
				off := w.gvs[g].cellOff
				for i, c := range kg.cells {
					acc.cells[off+int32(i)] += uint64(c)
				}
			}
		}
		uc := w.unitCounts(mi, nr, ni, x)
		u.Decisions += uc.decisions
		u.Mismatched += uc.mismatched
	}
	s, ids, ok := w.externalPods(x)
	if !ok {
		u.Verdict, u.Message = report.Error, "the oracle expects no endpoint to receive its connections"
		return u
	}
	m := w.externalShares(w.modes[mi].name, x, ids, &s, res, acc)
	switch {
	case u.Mismatched > 0:
		u.Verdict, u.Message = report.Fail, fmt.Sprintf("%d of %d connections decided by up-to-date rules disagreed with the oracle", u.Mismatched, u.Decisions)
	case m.Sample == 0:
		u.Verdict, u.Message = report.Error, "no connection of the initial state was decided by up-to-date rules"
	case !m.Within:
		u.Verdict, u.Message = report.Fail, fmt.Sprintf("a pod's share is outside its %.1f%% simultaneous interval around the oracle's (busiest/idlest %.2f, expected %.2f)", 100*extConfidence, m.BusiestToIdlest, s.Expected)
	default:
		u.Message = fmt.Sprintf("%d connections; every pod's share inside its %.1f%% simultaneous interval around the oracle's (busiest/idlest %.2f, expected %.2f)", m.Sample, 100*extConfidence, m.BusiestToIdlest, s.Expected)
	}
	return u
}
