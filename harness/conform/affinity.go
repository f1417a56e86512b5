package conform

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// affinity checks sessionAffinity ClientIP from every client address on a
// node, in three verdicts (reference statistics.md): the first choices are
// uniform across clients; every later connection inside the timeout reaches
// the client's endpoint (zero tolerance, except where the oracle names a
// known deviation such as the iptables recent-list capacity); after idling
// past the timeout, a client chooses afresh ((k-1)/k switch).
func (s *suite) affinity(ctx context.Context, c *scenario.Check, nodeName string) {
	base := fmt.Sprintf("%s @ %s", c.Name, nodeName)
	mk := func(suffix string) *report.Check {
		return &report.Check{Name: base + " / " + suffix, Type: c.Type, Service: c.Service, ClientNode: nodeName, Phase: suffix,
			Seed: s.seed, Alpha: s.alphaUnit, MDE: c.MDE, Power: c.Power}
	}
	first, sticky, expiry := mk("first choice"), mk("stickiness"), mk("expiry")
	start := time.Now()
	defer func() {
		for _, rc := range []*report.Check{first, sticky, expiry} {
			rc.Duration = time.Since(start)
			s.out.Checks = append(s.out.Checks, rc)
		}
	}()
	fail := func(msg string) {
		for _, rc := range []*report.Check{first, sticky, expiry} {
			if rc.Verdict == "" {
				rc.Verdict, rc.Message = report.Error, msg
			}
		}
	}
	spn, sp, err := s.spn(c)
	if err != nil {
		fail(err.Error())
		return
	}
	if !sp.ClientIPAffinity {
		fail("the Service has no sessionAffinity ClientIP")
		return
	}
	type addr struct {
		client int
		ip     netip.Addr
	}
	var addrs []addr
	clients := s.mc.clients()
	for i, cl := range clients {
		if cl.Node == nodeName {
			for _, a := range cl.Config.Addrs {
				addrs = append(addrs, addr{i, a})
			}
		}
	}
	if len(addrs) == 0 {
		fail("no client pod on node " + nodeName)
		return
	}
	st := s.state()
	want := s.or.Expect(s.o.Mode, sp, st.Endpoints[spn], nodeName, s.zone(nodeName))
	if want.Kind != oracle.Endpoints {
		fail("the oracle expects " + want.String() + ": affinity cannot be checked")
		return
	}
	aff := s.or.NewAffinity(s.o.Mode, sp, want)
	vip := netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))
	t0 := s.mc.now()
	proto := protoOf(sp)
	// round sends one probe from every address, in order starting at the
	// shift-th, and returns the endpoint each reached ("" when none) with
	// its virtual send time.
	round := func(shift int) (map[netip.Addr]string, map[netip.Addr]time.Duration, error) {
		s.mc.flush()
		s.mc.phase()
		sentAt := map[netip.Addr]time.Duration{}
		for i := range addrs {
			a := addrs[(i+shift)%len(addrs)]
			sentAt[a.ip] = s.mc.now() - t0
			if _, err := s.mc.send(ctx, Probe{Client: clients[a.client], Src: a.ip, VIP: vip, Proto: proto, N: 1}, s.rng); err != nil {
				return nil, nil, err
			}
		}
		counts := s.mc.collect(len(addrs))
		got := map[netip.Addr]string{}
		for k, v := range counts.Arrivals {
			if v > 0 {
				got[k.Client] = k.Endpoint.String()
			}
		}
		return got, sentAt, nil
	}
	observe := func(got map[netip.Addr]string, sentAt map[netip.Addr]time.Duration) (viol, known, lost int, lostClients map[netip.Addr]bool) {
		lostClients = map[netip.Addr]bool{}
		for _, a := range addrs {
			ep, ok := got[a.ip]
			if !ok {
				lost++
				continue
			}
			switch aff.Observe(a.ip, ep, sentAt[a.ip], sentAt[a.ip]) {
			case oracle.Violation:
				viol++
			case oracle.KnownDeviation:
				known++
				lostClients[a.ip] = true
			}
		}
		return
	}

	// 1. First choices.
	got, at, err := round(0)
	if err != nil {
		fail(err.Error())
		return
	}
	endpoints := want.Endpoints()
	obs := make([]float64, len(endpoints))
	p0 := make([]float64, len(endpoints))
	idx := map[string]int{}
	for i, e := range endpoints {
		idx[e] = i
		p0[i] = want.Probs[e]
	}
	outside := 0
	for _, a := range addrs {
		if i, ok := idx[got[a.ip]]; ok {
			obs[i]++
		} else {
			outside++
		}
	}
	first.N = len(addrs)
	first.Test = "chi-square"
	for i, e := range endpoints {
		first.Table = append(first.Table, report.Row{Outcome: e, Observed: obs[i], Expected: p0[i] * float64(len(addrs))})
	}
	first.Table = append(first.Table, report.Row{Outcome: "elsewhere or lost", Observed: float64(outside)})
	if len(endpoints) > 1 {
		res, err := stats.ChiSquareGOF(append(obs, float64(outside)), append(p0, 0))
		if err != nil {
			// Too few clients for a chi-square (cells merge into one).
			first.Test, first.P = "none", 1
			first.Message = "too few clients for a uniformity test: " + err.Error()
		} else {
			first.Statistic, first.DF, first.P, first.EffectSize = res.Statistic, res.DF, res.P, res.EffectSize
			w2 := stats.EffectW2(p0, oneOff(p0, c.MDE))
			first.AchievedPower = stats.ChiSquarePower(len(addrs), w2, len(p0)-1, s.alphaUnit)
		}
	} else {
		first.Test, first.P = "deterministic", 1
		if outside > 0 {
			first.P = 0
		}
	}
	first.Verdict = report.Pass
	observe(got, at)

	// 2. Stickiness inside the timeout.
	viol, known, lost := 0, 0, 0
	lostClients := map[netip.Addr]bool{}
	for r := 0; r < stickyRounds; r++ {
		got, at, err := round(0)
		if err != nil {
			fail(err.Error())
			return
		}
		v, k, l, lc := observe(got, at)
		viol, known, lost = viol+v, known+k, lost+l
		for a := range lc {
			lostClients[a] = true
		}
	}
	n := stickyRounds * len(addrs)
	kept := n - viol - known - lost
	lo, hi := stats.ClopperPearson(kept, n, 0.99)
	sticky.Test, sticky.N, sticky.P = "deterministic", n, 1
	sticky.Statistic = float64(viol + lost)
	sticky.Table = []report.Row{{Outcome: "kept its endpoint", Observed: float64(kept)}, {Outcome: "violation", Observed: float64(viol)},
		{Outcome: "known deviation (recent list capacity)", Observed: float64(known)}, {Outcome: "lost", Observed: float64(lost)}}
	sticky.Message = fmt.Sprintf("stickiness %.4f (99%% CI %.4f-%.4f)", float64(kept)/float64(n), lo, hi)
	if viol+lost > 0 {
		sticky.P = 0
		sticky.Message = fmt.Sprintf("%d connections left their client's endpoint inside the timeout, %d lost; %s", viol, lost, sticky.Message)
	}
	sticky.Verdict = report.Pass
	if known > 0 {
		ev := fmt.Sprintf("%d of %d clients on %s lost affinity inside the timeout (%d connections): kube-proxy's iptables layout keeps at most %d clients per endpoint in its recent lists", len(lostClients), len(addrs), nodeName, known, oracle.DefaultRecentCapacity)
		s.out.Deviations = appendDev(s.out.Deviations, report.Deviation{Name: c.Name, Evidence: ev})
		sticky.SpecVerdict = "does not meet the documented semantics: " + ev
	}
	for _, d := range aff.Deviations(s.mc.now() - t0) {
		s.out.Deviations = appendDev(s.out.Deviations, report.Deviation{Name: c.Name, Evidence: d})
	}

	// 3. Expiry: idle past the timeout, then every client chooses afresh.
	// How long the clients idle depends on the mode (expiryIdle, ipvs.go).
	idle, checked := s.expiryIdle(sp)
	if !checked {
		expiry.Verdict, expiry.Test, expiry.P = report.Pass, "none", 1
		expiry.Message = fmt.Sprintf("not checked: timeoutSeconds %d is longer than the %s this check waits", sp.AffinityTimeout, maxExpiryWait)
		return
	}
	before := map[netip.Addr]string{}
	for _, a := range addrs {
		if b, ok := aff.Binding(a.ip, s.mc.now()-t0); ok {
			before[a.ip] = b.Endpoint
		}
	}
	if err := s.mc.idle(ctx, idle); err != nil {
		fail(err.Error())
		return
	}
	got, _, err = round(s.expiryShift(len(addrs), len(endpoints)))
	if err != nil {
		fail(err.Error())
		return
	}
	switched, trials := 0, 0
	for _, a := range addrs {
		ep, ok := got[a.ip]
		prev, had := before[a.ip]
		if !ok || !had {
			continue
		}
		trials++
		if ep != prev {
			switched++
		}
	}
	k := len(endpoints)
	pSwitch := float64(k-1) / float64(k)
	expiry.N = trials
	expiry.Test = "exact binomial (less)"
	expiry.Table = []report.Row{{Outcome: "chose another endpoint", Observed: float64(switched), Expected: pSwitch * float64(trials)},
		{Outcome: "same endpoint", Observed: float64(trials - switched), Expected: (1 - pSwitch) * float64(trials)}}
	if k < 2 || trials == 0 {
		expiry.Test, expiry.P = "none", 1
		expiry.Message = "a single eligible endpoint: expiry cannot be observed"
	} else {
		res, err := stats.BinomialTest(switched, trials, pSwitch, stats.Less)
		if err != nil {
			expiry.Verdict, expiry.Message = report.Error, err.Error()
			return
		}
		expiry.Statistic, expiry.P = float64(switched), res.P
		expiry.AchievedPower = stats.BinomialPower(trials, pSwitch, pSwitch/2, s.alphaUnit, stats.Less)
		if res.P <= s.alphaUnit {
			expiry.Message = fmt.Sprintf("only %d of %d clients chose afresh after %s idle: affinity outlived its timeout", switched, trials, idle)
		}
	}
	expiry.Verdict = report.Pass
}
