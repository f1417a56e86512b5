package conform

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
)

// ordered says whether the rounds must be scheduled in send order (the
// ipvs rr rotation is predicted from it).
func (a *affinityCheck) ordered() bool {
	return a.plan.First.Kind == kindRotation || a.plan.Expiry.Kind == kindRotation
}

// classify holds one observed connection against the affinity: lost and
// forbidden outcomes are violations whatever the binding.
func (a *affinityCheck) classify(ip netip.Addr, ep string, at time.Duration) (oracle.Check, string) {
	if ep == outcomeLost {
		return oracle.Violation, "lost"
	}
	if !a.want.Allows(ep) {
		return oracle.Violation, "forbidden"
	}
	return a.aff.Observe(ip, ep, at, at), ""
}

// firstRound binds every address of bound: one probe each.
func (a *affinityCheck) firstRound(ctx context.Context) error {
	if a.ordered() {
		// A late packet of an earlier phase would move rr's pointer.
		a.s.mc.quiesce()
	}
	got, at, err := a.round(ctx, a.bound, 0, a.ordered())
	if err != nil {
		return err
	}
	a.firstSeq = got
	for j, ep := range got {
		_, _ = a.classify(a.bound[j].ip, ep, at[j])
	}
	a.sched = len(a.bound)
	return nil
}

// stickiness sends the sticky rounds inside the timeout: every connection
// must reach its client's endpoint.
func (a *affinityCheck) stickiness(ctx context.Context) error {
	rc, k := a.sticky, len(a.eps)
	rounds, need := stickySize(k, len(a.bound), a.c.Power)
	viol, known, lost, forbidden := 0, 0, 0, 0
	atRisk := map[netip.Addr]bool{}
	for r := 0; r < rounds; r++ {
		got, at, err := a.round(ctx, a.bound, 0, false)
		if err != nil {
			return err
		}
		for j, ep := range got {
			res, why := a.classify(a.bound[j].ip, ep, at[j])
			switch {
			case why == "lost":
				lost++
			case why == "forbidden":
				forbidden++
			case res == oracle.Violation:
				viol++
			case res == oracle.KnownDeviation:
				known++
				atRisk[a.bound[j].ip] = true
			}
		}
	}
	n := rounds * len(a.bound)
	kept := n - viol - known - lost - forbidden
	lo, hi := stats.ClopperPearson(kept, n, 0.99)
	rc.Test, rc.N, rc.P, rc.MDE = kindDetermin, n, 1, affinityLeakFraction
	rc.Statistic = float64(viol + lost + forbidden)
	rc.AchievedPower = leakPower(affinityLeakFraction, k, len(a.bound), rounds)
	rc.Table = []report.Row{{Outcome: "kept its endpoint", Observed: float64(kept), Expected: float64(n)}, {Outcome: "violation", Observed: float64(viol)},
		{Outcome: "known deviation (recent list capacity)", Observed: float64(known)}, {Outcome: "rejected or another service's endpoint", Observed: float64(forbidden)},
		{Outcome: "lost", Observed: float64(lost)}}
	rc.Message = fmt.Sprintf("stickiness %.4f (99%% CI %.4f-%.4f); %d clients x %d rounds, power %.3g against %.0f %% of the clients losing affinity",
		float64(kept)/float64(n), lo, hi, len(a.bound), rounds, rc.AchievedPower, 100*affinityLeakFraction)
	if k < 2 {
		rc.Message += " (a single eligible endpoint: only reachability is tested)"
	} else if len(a.bound) < need {
		rc.Message += fmt.Sprintf("; underpowered: n = %d clients of the %d needed", len(a.bound), need)
	}
	if bad := viol + lost + forbidden; bad > 0 {
		rc.P = 0
		rc.Message = fmt.Sprintf("%d connections left their client's endpoint inside the timeout, %d were rejected or reached another service's endpoint, %d lost; %s",
			viol, forbidden, lost, rc.Message)
	}
	rc.Verdict = report.Pass
	s := a.s
	if known > 0 {
		ev := fmt.Sprintf("%d of %d clients on %s lost affinity inside the timeout (%d connections): kube-proxy's iptables layout keeps at most %d clients per endpoint in its recent lists",
			len(atRisk), len(a.bound), a.node, known, s.recentCapacity())
		s.out.Deviations = appendDev(s.out.Deviations, report.Deviation{Name: a.c.Name, Evidence: ev})
		rc.SpecVerdict = "does not meet the documented semantics: " + ev
	}
	for _, d := range a.aff.Deviations(s.mc.now() - a.t0) {
		s.out.Deviations = appendDev(s.out.Deviations, report.Deviation{Name: a.c.Name, Evidence: d})
	}
	return nil
}

// expiryTally is what the expiry cycles observed.
type expiryTally struct {
	trials, switched int
	lost, forbidden  int
	// rr: clients whose choice was not the rotation's prediction, and how
	// many of the predictions moved the client.
	mispredicted, moved int
	samples             []string
}

// expiryCycles idles past the timeout and sends one round, as many times as
// the verdict's size needs (one cycle for the deterministic rotation).
func (a *affinityCheck) expiryCycles(ctx context.Context) error {
	rc, s, k := a.expiry, a.s, len(a.eps)
	if !a.plan.Expiry.run() {
		rc.Verdict, rc.Test, rc.P = report.NotRun, kindNotRun, 1
		rc.Message = a.plan.Expiry.Reason
		return nil
	}
	need, p0, p1 := expiryTrials(k, s.alphaUnit, a.c.Power)
	cycles := 1
	if a.plan.Expiry.Kind == kindBinomial {
		cycles = expiryCycles(need, len(a.bound), a.plan.Idle)
	}
	var t expiryTally
	for cyc := 0; cyc < cycles; cyc++ {
		if err := a.expiryCycle(ctx, &t); err != nil {
			return err
		}
	}
	rc.Test = a.plan.Expiry.Kind
	bad := t.lost + t.forbidden
	rc.N = t.trials + bad
	rc.Table = []report.Row{{Outcome: "chose another endpoint", Observed: float64(t.switched), Expected: p0 * float64(t.trials)},
		{Outcome: "same endpoint", Observed: float64(t.trials - t.switched), Expected: (1 - p0) * float64(t.trials)},
		{Outcome: "rejected or another service's endpoint", Observed: float64(t.forbidden)}, {Outcome: "lost", Observed: float64(t.lost)}}
	rc.Verdict, rc.P = report.Pass, 1
	if a.plan.Expiry.Kind == kindRotation {
		a.decideRotationExpiry(&t)
	} else {
		res, err := stats.BinomialTest(t.switched, max(t.trials, 1), p0, stats.Less)
		if err != nil {
			rc.Verdict, rc.Message = report.Error, err.Error()
			return nil
		}
		rc.Statistic, rc.P, rc.MDE = float64(t.switched), res.P, 0.5
		rc.AchievedPower = stats.BinomialPower(t.trials, p0, p1, s.alphaUnit, stats.Less)
		rc.Message = fmt.Sprintf("%d clients x %d cycles of %s idle; power %.4g against half the clients keeping affinity past the timeout", len(a.bound), cycles, a.plan.Idle, rc.AchievedPower)
		if t.trials < need {
			rc.Message += fmt.Sprintf("; underpowered: n = %d of the %d needed, power %.4g", t.trials, need, rc.AchievedPower)
		}
		if res.P <= s.alphaUnit {
			rc.Message = fmt.Sprintf("only %d of %d clients chose afresh after %s idle: affinity outlived its timeout; %s", t.switched, t.trials, a.plan.Idle, rc.Message)
		}
	}
	if bad > 0 {
		rc.P = 0
		rc.Message = fmt.Sprintf("%d connections after the timeout were lost, %d rejected or reached another service's endpoint; %s", t.lost, t.forbidden, rc.Message)
	}
	return nil
}

// expiryCycle is one expiry cycle: the bindings before, the idle, the
// round, the tally.
func (a *affinityCheck) expiryCycle(ctx context.Context, t *expiryTally) error {
	s, k := a.s, len(a.eps)
	before := map[netip.Addr]string{}
	for _, ad := range a.bound {
		if b, ok := a.aff.Binding(ad.ip, s.mc.now()-a.t0); ok {
			before[ad.ip] = b.Endpoint
		}
	}
	if err := s.mc.idle(ctx, a.plan.Idle); err != nil {
		return err
	}
	shift, rotation := 0, a.plan.Expiry.Kind == kindRotation
	var rot []string
	if rotation {
		rot = a.rotationOrder()
		if rot == nil {
			// The first round was not a rotation (its verdict fails): no
			// prediction; the round still counts losses.
			rotation = false
		} else {
			shift = a.bestShift(rot, before)
		}
	}
	got, at, err := a.round(ctx, a.bound, shift, a.ordered())
	if err != nil {
		return err
	}
	for j, ep := range got {
		ip := a.bound[(j+shift)%len(a.bound)].ip
		prev, had := before[ip]
		_, why := a.classify(ip, ep, at[j])
		switch {
		case why == "lost":
			t.lost++
		case why == "forbidden":
			t.forbidden++
		case had:
			t.trials++
			if ep != prev {
				t.switched++
			}
		}
		if rotation && why == "" {
			pred := rot[(a.sched+j)%k]
			if pred != prev {
				t.moved++
			}
			if ep != pred {
				t.mispredicted++
				if len(t.samples) < 5 {
					t.samples = append(t.samples, fmt.Sprintf("%s reached %s, the rotation predicts %s (bound to %s)", ip, ep, pred, prev))
				}
			}
		}
	}
	a.sched += len(a.bound)
	return nil
}

// rotationOrder is the rr rotation as the first round saw it: its first k
// outcomes, which must be k distinct eligible endpoints (nil otherwise).
func (a *affinityCheck) rotationOrder() []string {
	k := len(a.eps)
	if len(a.firstSeq) < k {
		return nil
	}
	seen := map[string]bool{}
	for _, e := range a.firstSeq[:k] {
		if !a.want.Allows(e) || seen[e] {
			return nil
		}
		seen[e] = true
	}
	return a.firstSeq[:k]
}

// bestShift is where an rr expiry round starts in the list of addresses:
// the shift under which the rotation's prediction moves the most clients
// away from their bound endpoint (for any position of the rotation).
func (a *affinityCheck) bestShift(rot []string, before map[netip.Addr]string) int {
	best, bestMoved := 0, -1
	n, k := len(a.bound), len(rot)
	for sh := 0; sh < n; sh++ {
		moved := 0
		for j := 0; j < n; j++ {
			if rot[(a.sched+j)%k] != before[a.bound[(j+sh)%n].ip] {
				moved++
			}
		}
		if moved > bestMoved {
			best, bestMoved = sh, moved
		}
	}
	return best
}

// decideRotationExpiry: every client the rotation moves must move, and
// every fresh choice is the rotation's next endpoint (zero tolerance).
func (a *affinityCheck) decideRotationExpiry(t *expiryTally) {
	rc := a.expiry
	rc.Statistic = float64(t.mispredicted)
	if a.rotationOrder() == nil {
		rc.P, rc.Message = 0, "the first round was not a rotation: the expiry round's choices cannot be predicted"
		return
	}
	rc.Table[0].Expected, rc.Table[1].Expected = float64(t.moved), float64(t.trials-t.moved)
	// Sized, like stickiness, for a tenth of the templates outliving the
	// timeout: one of them is seen unless none sits on a moved client.
	rc.MDE = affinityLeakFraction
	rc.AchievedPower = 1 - math.Pow(1-affinityLeakFraction, float64(t.moved))
	rc.Message = fmt.Sprintf("after %s idle the rotation moved %d of %d clients; power %.4g against %.0f %% of the templates outliving the timeout",
		a.plan.Idle, t.moved, t.trials, rc.AchievedPower, 100*affinityLeakFraction)
	if t.mispredicted > 0 {
		rc.P = 0
		rc.Message = fmt.Sprintf("%d of %d fresh choices after %s idle were not the rotation's next endpoint (a template outlived its timeout, or the rotation skipped): %s",
			t.mispredicted, t.trials, a.plan.Idle, strings.Join(t.samples, "; "))
	}
}

// freshRound sends the last rounds, from synthetic addresses never bound
// before, for the first-choice chi-square's size. When the free addresses
// are too few and the timeout is short (iptables and nftables mode), they
// are used again after idling past the timeout, once: a correct dataplane
// has forgotten them, so their choices are fresh again (a dataplane that
// has not is caught by the expiry verdict, and its repeated choices are
// still uniform).
func (a *affinityCheck) freshRound(ctx context.Context) error {
	if a.plan.First.Kind != kindChiSquare || len(a.spare) == 0 {
		return nil
	}
	need, _ := firstChoiceSize(probsOf(a.want), a.c.MDE, a.c.Power, a.s.alphaUnit)
	rounds := 1
	if a.plan.Expiry.Kind == kindBinomial && a.s.o.Mode != cluster.ModeIPVS {
		rounds = maxFreshRounds
	}
	for r := 0; r < rounds; r++ {
		extra := min(max(0, need-len(a.firstSeq)-len(a.fresh)), len(a.spare))
		if extra == 0 {
			return nil
		}
		if r > 0 {
			if err := a.s.mc.idle(ctx, a.plan.Idle); err != nil {
				return err
			}
			a.reused += extra
		}
		list := make([]affinityAddr, extra)
		for i, ip := range a.spare[:extra] {
			list[i] = affinityAddr{a.bound[0].client, ip}
		}
		got, _, err := a.round(ctx, list, 0, false)
		if err != nil {
			return err
		}
		a.fresh = append(a.fresh, got...)
	}
	return nil
}

// decideFirst decides the first-choice verdict over the first round and
// the fresh round.
func (a *affinityCheck) decideFirst() {
	rc, k := a.first, len(a.eps)
	all := append(append([]string(nil), a.firstSeq...), a.fresh...)
	rc.N = len(all)
	rc.Table = tableOf(all, a.eps, 0)
	for i := range rc.Table {
		if p, ok := a.want.Probs[rc.Table[i].Outcome]; ok {
			rc.Table[i].Expected = p * float64(len(all))
		}
	}
	rc.Verdict, rc.P, rc.Test = report.Pass, 1, a.plan.First.Kind
	bad := 0
	for _, e := range all {
		if !a.want.Allows(e) {
			bad++
		}
	}
	switch a.plan.First.Kind {
	case kindChiSquare:
		a.firstChiSquare(all)
	case kindRotation:
		a.firstRotation()
	default:
		rc.Message = "deterministic: every first choice reaches an eligible endpoint"
		if k < 2 {
			rc.Message = "a single eligible endpoint: every first choice must reach it"
		}
		if a.s.o.Mode == cluster.ModeIPVS && a.s.scheduler() == "dh" {
			// dh hashes the destination: one endpoint for every client.
			seen := map[string]bool{}
			for _, e := range all {
				if a.want.Allows(e) {
					seen[e] = true
				}
			}
			rc.Message = "dh: every client's first choice is one endpoint (the destination's hash)"
			if len(seen) > 1 {
				fail(rc, len(seen)-1, "dh: the clients' first choices reached %d endpoints, the destination hash gives one", len(seen))
			}
		}
	}
	if bad > 0 {
		rc.P, rc.Statistic = 0, float64(bad)
		rc.Message = fmt.Sprintf("%d of %d first choices were lost, rejected or reached another service's endpoint; %s", bad, len(all), rc.Message)
	}
}

// firstChiSquare: the fresh choices against the oracle's shares, sized at
// the first-choice MDE.
func (a *affinityCheck) firstChiSquare(all []string) {
	rc, s := a.first, a.s
	p0 := probsOf(a.want)
	need, w2 := firstChoiceSize(p0, a.c.MDE, a.c.Power, s.alphaUnit)
	obs := make([]float64, len(a.eps)+1)
	idx := map[string]int{}
	for i, e := range a.eps {
		idx[e] = i
	}
	for _, e := range all {
		if i, ok := idx[e]; ok {
			obs[i]++
		} else {
			obs[len(a.eps)]++
		}
	}
	rc.MDE = max(a.c.MDE, affinityFirstChoiceMDE)
	res, err := stats.ChiSquareGOF(obs, append(p0, 0))
	if err != nil {
		rc.Verdict, rc.Message = report.Error, "too few first choices for a chi-square: "+err.Error()
		return
	}
	rc.Statistic, rc.DF, rc.P, rc.EffectSize = res.Statistic, res.DF, res.P, res.EffectSize
	rc.AchievedPower = stats.ChiSquarePower(len(all), w2, len(p0)-1, s.alphaUnit)
	rc.Message = fmt.Sprintf("%d fresh choices (%d client addresses, %d synthetic, %d of them again after the timeout), sized for one endpoint's share off by %.0f %%, power %.4g",
		len(all), len(a.firstSeq), len(a.fresh), a.reused, 100*rc.MDE, rc.AchievedPower)
	if len(all) < need {
		rc.Message += fmt.Sprintf("; underpowered: n = %d of the %d needed, power %.3g (the node's pod block has no more free addresses)", len(all), need, rc.AchievedPower)
	}
	if res.P <= s.alphaUnit {
		rc.Message = fmt.Sprintf("first choices are not distributed as the oracle's shares (p %.3g); %s", res.P, rc.Message)
	}
}

// firstRotation: ipvs rr makes the first choices of the clients, in send
// order, a rotation: every k consecutive ones reach the k endpoints.
func (a *affinityCheck) firstRotation() {
	rc, k := a.first, len(a.eps)
	seq := a.firstSeq
	bad := 0
	for i := 0; i+k <= len(seq); i++ {
		win := map[string]bool{}
		for _, e := range seq[i : i+k] {
			if a.want.Allows(e) {
				win[e] = true
			}
		}
		if len(win) != k {
			bad++
		}
	}
	rc.N = len(seq)
	rc.Message = fmt.Sprintf("rr: %d first choices in send order follow the rotation", len(seq))
	if bad > 0 {
		fail(rc, bad, "rr: %d of %d windows of %d consecutive first choices missed an endpoint: not a rotation (first: %s)",
			bad, len(seq)-k+1, k, strings.Join(seq[:min(len(seq), 3*k)], " "))
	}
}
