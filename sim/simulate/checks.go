package simulate

import (
	"fmt"
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
		w.keep[g] = w.gvs[g].nodeDep
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
		if c.Type != scenario.CheckAffinity {
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

// clientNodes are the nodes a check looks at: its clientNodes, or every
// node with a client that sends to the service port.
func (w *world) clientNodes(c *scenario.Check, s int32) []int {
	var out []int
	for ni, n := range w.nodes {
		if len(c.ClientNodes) > 0 {
			if slices.Contains(c.ClientNodes, n.name) {
				out = append(out, ni)
			}
			continue
		}
		if w.sends(ni, s) {
			out = append(out, ni)
		}
	}
	return out
}

// sends reports whether a client on node ni targets service port s.
func (w *world) sends(ni int, s int32) bool {
	for _, g := range w.tr.perNode[ni].groups {
		if slices.Contains(w.tr.groups[g.group].targets, s) {
			return true
		}
	}
	return false
}

// familyAlpha is the family-wise level of a mode's statistical units: the
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
	nn := len(w.nodes)
	var u unitCounts
	for _, g := range w.svcs[s].gvs {
		c := nr.perNode[g].c
		u.decisions += c.Decisions
		u.mismatched += c.Mismatched
		u.inWindow += c.InWindow
		u.misrouted += c.Misrouted
		o := &md.outs[md.out[int(g)*nn+ni]]
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

// test runs the chi-square. tested is false when there are fewer than two
// eligible endpoints or fewer than MinExpected connections per endpoint;
// cells is the number of endpoints with an expectation.
func (sm *sample) test() (r stats.Result, tested bool, cells int, err error) {
	for _, e := range sm.exp {
		if e > 0 {
			cells++
		}
	}
	if cells < 2 || sm.n < stats.MinExpected*float64(cells) {
		return stats.Result{N: sm.n}, false, cells, nil
	}
	r, err = stats.ChiSquareGOF(sm.obs, sm.exp)
	if err != nil {
		if stats.IsTooFewObservations(err) {
			return stats.Result{N: sm.n}, false, cells, nil
		}
		return r, false, cells, err
	}
	return r, true, cells, nil
}

// chiSquareNode tests one node's fresh connections to a checked service
// port against the oracle, over every version.
func (w *world) chiSquareNode(mi int, nr *nodeResult, ni int, s int32) (stats.Result, bool, int, error) {
	md := w.modes[mi]
	nn := len(w.nodes)
	sm := newSample(len(w.svcs[s].eps))
	for _, g := range w.svcs[s].gvs {
		k := nr.perNode[g]
		sm.add(k.c.Fresh, func(id int) float64 { return float64(k.cells[id]) }, &md.outs[md.out[int(g)*nn+ni]])
	}
	return sm.test()
}

// chiSquareAll tests the fresh connections to a service port from every
// node: expected Σ n·p over nodes and versions (from the mode's totals
// where the expectation is the same on every node).
func (w *world) chiSquareAll(mi int, res []*nodeResult, acc *modeAcc, s int32) (stats.Result, bool, int, error) {
	md := w.modes[mi]
	nn := len(w.nodes)
	sm := newSample(len(w.svcs[s].eps))
	for _, g := range w.svcs[s].gvs {
		if !w.gvs[g].nodeDep {
			off := w.gvs[g].cellOff
			sm.add(acc.gv[g].Fresh, func(id int) float64 { return float64(acc.cells[off+int32(id)]) }, &md.outs[md.out[int(g)*nn]])
			continue
		}
		for ni, nr := range res {
			k := nr.perNode[g]
			sm.add(k.c.Fresh, func(id int) float64 { return float64(k.cells[id]) }, &md.outs[md.out[int(g)*nn+ni]])
		}
	}
	return sm.test()
}

// evalChecks applies the scenario's checks to one mode's simulated
// traffic. Every statistical unit (a chi-square per check and client node)
// is one member of the mode's Holm family; the other checks are exact.
func (w *world) evalChecks(mi int, res []*nodeResult) []report.Check {
	md := w.modes[mi]
	alphaF := w.familyAlpha()
	type ref struct{ c, u int }
	var ps []float64
	var refs []ref
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
		if len(nodes) == 0 {
			rc.Verdict, rc.Message = report.Error, "no client sends traffic to it"
			out = append(out, rc)
			continue
		}
		if c.Type == scenario.CheckDistribution {
			rc.Alpha = alphaF
		}
		for _, ni := range nodes {
			nr := res[ni]
			uc := w.unitCounts(mi, nr, ni, s)
			u := report.Unit{ClientNode: w.nodes[ni].name, Verdict: report.Pass, Expected: kindsString(uc.kinds),
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
				r, tested, cells, err := w.chiSquareNode(mi, nr, ni, s)
				exact("a DROP or REJECT, or an endpoint the oracle excludes")
				if u.Verdict != report.Pass {
					break
				}
				switch {
				case err != nil:
					u.Verdict, u.Message = report.Error, err.Error()
				case !tested && cells == 1:
					u.Message = "one eligible endpoint: every connection must reach it, and did"
				case !tested && cells == 0:
					u.Message = "the oracle expects no endpoint: outcomes checked exactly"
				case !tested:
					u.Verdict = report.Error
					u.Message = fmt.Sprintf("too few connections for a chi-square: %g over %d endpoints (need %g)", r.N, cells, stats.MinExpected*float64(cells))
				default:
					u.Test, u.Statistic, u.DF, u.P, u.N, u.MaxAbsDeviation = r.Test, r.Statistic, r.DF, r.P, int64(r.N), r.MaxAbsDeviation
					w2 := stats.EffectW2(stats.Uniform(cells), stats.OneOffAlternative(cells, c.MDE))
					m := max(1, w.distributionUnits())
					u.Power = stats.ChiSquarePower(int(r.N), w2, cells-1, alphaF/float64(m))
					u.RequiredN = stats.ChiSquareSampleSize(w2, cells-1, alphaF/float64(m), c.Power)
					ps = append(ps, r.P)
					refs = append(refs, ref{len(out), len(rc.Units)})
				}
			case c.Type == scenario.CheckAffinity:
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
			}
			rc.Units = append(rc.Units, u)
		}
		out = append(out, rc)
	}
	if len(ps) > 0 {
		rej := stats.Holm(ps, alphaF)
		for i, r := range refs {
			if rej[i] {
				u := &out[r.c].Units[r.u]
				u.Verdict = report.Fail
				u.Message = fmt.Sprintf("chi-square p = %.3g rejects the oracle's distribution (Holm, family α = %g over %d units)", u.P, alphaF, len(ps))
			}
		}
	}
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
	return out
}

// distributionUnits is the number of chi-square units the checks can give:
// the Holm family's size, for the power of each.
func (w *world) distributionUnits() int {
	n := 0
	for i := range w.sc.Checks {
		c := &w.sc.Checks[i]
		if c.Type != scenario.CheckDistribution {
			continue
		}
		if s, err := w.checkService(c); err == nil {
			n += len(w.clientNodes(c, s))
		}
	}
	return n
}
