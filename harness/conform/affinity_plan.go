package conform

// The affinity check's plan: which of its three verdicts (first choice,
// stickiness, expiry) test something in a mode, with which test, and how
// many clients, rounds and expiry cycles each needs to reach the check's
// power at the unit's alpha. The plan is pure (no namespace, no clock), so
// the run's planner counts the verdicts (m) with the same function the
// check uses (affinityVerdicts).

import (
	"fmt"
	"maps"
	"math"
	"time"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Sizing of the affinity verdicts.
const (
	// affinityFirstChoiceMDE is the smallest relative MDE the first-choice
	// test is sized for: one endpoint's share of first choices off by 50 %
	// (w^2 = 0.125 for 3 endpoints: 370 fresh choices at alpha 3e-5, power
	// 0.99). The check's own mde (10 %) would need 9,244 client addresses.
	// At 50 % the test catches gross selection faults (one endpoint never or
	// twice as often chosen, a missing or doubled rule); the
	// uniform-probability fault with 3 endpoints (shares 1/3, 2/9, 4/9,
	// w^2 = 0.074) is caught with power 0.76 at 370 choices and is caught
	// for certain by the distribution check, which is sized at the mde.
	affinityFirstChoiceMDE = 0.5
	// affinityLeakFraction is the alternative the stickiness verdict is
	// sized for: a tenth of the clients lose affinity inside the timeout
	// (the affinity-leak fault).
	affinityLeakFraction = 0.1
	// minStickyRounds and maxStickyRounds bound the rounds inside the
	// timeout after the first one (stickyRounds, run.go, is the maximum).
	minStickyRounds = 2
	maxStickyRounds = stickyRounds
	// maxExpiryCycles bounds the expiry cycles (idle past the timeout, one
	// round), and expiryIdleBudget the idle they may take together: 8 cycles
	// of 4 s for a 3 s timeout in iptables and nftables mode, 2 of 71 s in
	// ipvs mode (a template outlives a short timeout by a minute).
	maxExpiryCycles  = 8
	expiryIdleBudget = 150 * time.Second
	// maxFreshRounds bounds the rounds of synthetic addresses for the
	// first choices (each after the first costs one idle past the timeout).
	maxFreshRounds = 2
)

// Verdict kinds of an affinity plan.
const (
	kindChiSquare = "chi-square"
	kindBinomial  = "exact binomial (less)"
	kindRotation  = "deterministic (rr rotation)"
	kindDetermin  = "deterministic"
	kindNotRun    = "none"
)

// verdictPlan is one verdict of the plan.
type verdictPlan struct {
	Kind   string // one of the kind constants
	Reason string // why the verdict is not run (Kind == kindNotRun)
}

func (v verdictPlan) run() bool { return v.Kind != kindNotRun }

// affinityPlan is the shape of an affinity check for one mode, scheduler
// and service port, before any client is known.
type affinityPlan struct {
	First, Sticky, Expiry verdictPlan
	// Idle is how long an expiry cycle idles before its round.
	Idle time.Duration
}

// planAffinity decides which verdicts run and with which test. eligible is
// the number of endpoints the oracle allows from the client node; 0 means
// the check cannot run at all (an error, no verdict).
func planAffinity(mode cluster.Mode, scheduler string, sp *cluster.ServicePort, eligible int) affinityPlan {
	if scheduler == "" {
		scheduler = scenario.DefaultIPVSScheduler
	}
	var p affinityPlan
	ipvs := mode == cluster.ModeIPVS
	random := !ipvs || scheduler == "mh"
	switch {
	case eligible < 2:
		p.First = verdictPlan{Kind: kindDetermin}
	case random:
		p.First = verdictPlan{Kind: kindChiSquare}
	case scheduler == "rr" || scheduler == "wrr":
		p.First = verdictPlan{Kind: kindRotation}
	default:
		// sh, dh (a hash), lc and friends (counts): the choice is not random.
		p.First = verdictPlan{Kind: kindDetermin}
	}
	p.Sticky = verdictPlan{Kind: kindDetermin}
	idle, checked := expiryWait(mode, sp)
	p.Idle = idle
	switch {
	case !checked:
		p.Expiry = verdictPlan{Kind: kindNotRun, Reason: fmt.Sprintf("timeoutSeconds %d is longer than this check can wait (%s in %s mode, %s in ipvs mode)",
			sp.AffinityTimeout, maxExpiryWait, "iptables and nftables", ipvsMaxExpiryWait)}
	case eligible < 2:
		p.Expiry = verdictPlan{Kind: kindNotRun, Reason: "a single eligible endpoint: a fresh choice cannot differ from the bound one"}
	case random:
		p.Expiry = verdictPlan{Kind: kindBinomial}
	case scheduler == "rr" || scheduler == "wrr":
		p.Expiry = verdictPlan{Kind: kindRotation}
	case scheduler == "sh" || scheduler == "dh":
		p.Expiry = verdictPlan{Kind: kindNotRun, Reason: "ipvs " + scheduler + " hashes the " + map[string]string{"sh": "source", "dh": "destination"}[scheduler] +
			" address: a fresh choice is the bound endpoint again, so expiry cannot be observed by the choice"}
	default:
		p.Expiry = verdictPlan{Kind: kindNotRun, Reason: "ipvs " + scheduler + " chooses by connection counts: the fresh choice is not predictable, so expiry cannot be observed by the choice"}
	}
	return p
}

// affinityVerdicts counts the verdicts an affinity check of a service port
// makes from one client node (run) and those it reports as not run; the
// run's planner calls it before any namespace exists, the check itself
// uses the same plan. eligible is the number of endpoints the oracle
// allows; with none (or without ClientIP affinity) the check is an error
// and makes no verdict.
func affinityVerdicts(mode cluster.Mode, scheduler string, sp *cluster.ServicePort, eligible int) (run, notRun int) {
	if sp == nil || !sp.ClientIPAffinity || eligible < 1 {
		return 0, 0
	}
	p := planAffinity(mode, scheduler, sp, eligible)
	for _, v := range []verdictPlan{p.First, p.Sticky, p.Expiry} {
		if v.run() {
			run++
		} else {
			notRun++
		}
	}
	return run, notRun
}

// expiryWait is how long the affinity check lets its clients idle before
// checking that they choose afresh, and whether it checks at all (see
// suite.expiryIdle).
func expiryWait(mode cluster.Mode, sp *cluster.ServicePort) (idle time.Duration, checked bool) {
	timeout := time.Duration(sp.AffinityTimeout) * time.Second
	if timeout > maxExpiryWait {
		return timeout + time.Second, false
	}
	if mode != cluster.ModeIPVS {
		return timeout + time.Second, true
	}
	life := oracle.IPVSCloseTimeout // the backend resets a probe's connection
	if protoOf(sp) == traffic.UDP {
		life = oracle.IPVSUDPTimeout
	}
	idle = oracle.IPVSTemplateHold(timeout, probeSpan+life)
	return idle, idle <= ipvsMaxExpiryWait
}

// firstChoiceSize is the number of fresh first choices the chi-square
// needs: power at max(mde, affinityFirstChoiceMDE) on the least share.
func firstChoiceSize(p0 []float64, mde, power, alpha float64) (n int, w2 float64) {
	w2 = stats.EffectW2(p0, oneOff(p0, max(mde, affinityFirstChoiceMDE)))
	return stats.ChiSquareSampleSize(w2, len(p0)-1, alpha, power), w2
}

// leakPower is the probability that a stickiness test with c clients and r
// rounds after the first sees the affinity leak: a fraction f of the
// clients choose afresh at every connection, so such a client is caught
// unless its r later choices all equal its first (k^-r).
func leakPower(f float64, k, c, r int) float64 {
	if k < 2 || c <= 0 || r <= 0 {
		return 0
	}
	miss := 1 - f*(1-math.Pow(float64(k), -float64(r)))
	return 1 - math.Pow(miss, float64(c))
}

// stickySize chooses the sticky rounds and the number of clients: the
// fewest rounds (from minStickyRounds) with which the clients available
// reach power, else maxStickyRounds and the clients that needs.
func stickySize(k, available int, power float64) (rounds, clients int) {
	if k < 2 {
		return minStickyRounds, 0 // nothing to leak to: reachability only
	}
	need := func(r int) int {
		miss := 1 - affinityLeakFraction*(1-math.Pow(float64(k), -float64(r)))
		return int(math.Ceil(math.Log(1-power) / math.Log(miss)))
	}
	for r := minStickyRounds; r <= maxStickyRounds; r++ {
		if need(r) <= available {
			return r, need(r)
		}
	}
	return maxStickyRounds, need(maxStickyRounds)
}

// expiryTrials is the number of (client, cycle) trials the expiry binomial
// needs: null P(switch) = (k-1)/k against half the clients keeping their
// endpoint past the timeout, (k-1)/(2k), one-sided.
func expiryTrials(k int, alpha, power float64) (n int, p0, p1 float64) {
	p0 = float64(k-1) / float64(k)
	p1 = p0 / 2
	return stats.BinomialSampleSize(p0, p1, alpha, power, stats.Less), p0, p1
}

// expiryCycles is how many cycles reach trials with c clients each,
// bounded by maxExpiryCycles and the idle budget.
func expiryCycles(trials, c int, idle time.Duration) int {
	if c <= 0 {
		return 0
	}
	n := (trials + c - 1) / c
	limit := maxExpiryCycles
	if idle > 0 {
		limit = min(limit, max(1, int(expiryIdleBudget/idle)))
	}
	return max(1, min(n, limit))
}

// affinityUnits counts the verdicts an affinity check makes over its
// client nodes (run) and those it reports as not run, from the scenario's
// state before any namespace exists: the planner's count of m for this
// check, from the same plan the check follows. A check whose service port
// cannot be resolved, or from whose node the oracle expects no endpoint,
// is an error at run time and makes no verdict.
func affinityUnits(or oracle.Oracle, mode cluster.Mode, scheduler string, st *cluster.State, c *scenario.Check, nodes []string) (run, notRun int) {
	spn, err := cluster.ResolvePort(c.Service, c.Port, maps.Keys(st.Services))
	if err != nil {
		return 0, 0
	}
	sp := st.Services[spn]
	for _, nd := range nodes {
		zone := ""
		if n := st.Nodes[nd]; n != nil {
			zone = n.Zone
		}
		want := or.Expect(mode, sp, st.Endpoints[spn], nd, zone)
		eligible := 0
		if want.Kind == oracle.Endpoints {
			eligible = len(want.Probs)
		}
		r, nr := affinityVerdicts(mode, scheduler, sp, eligible)
		run, notRun = run+r, notRun+nr
	}
	return run, notRun
}
