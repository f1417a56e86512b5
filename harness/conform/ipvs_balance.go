package conform

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// ipvsBalance is the distribution check for ipvs rr and wrr: rr hands new
// connections to the real servers in turn (under the service's scheduler
// lock), so after n new connections without loss the eligible endpoints'
// counts differ by at most one, plus one for every packet of an earlier
// phase that the kernel scheduled in the middle of this one (counted, not
// guessed: the prober's foreign packets). Zero tolerance beyond that. When
// the oracle expects no choice (a single endpoint, DROP, REJECT) it is the
// ordinary outcome check.
func (s *suite) ipvsBalance(ctx context.Context, c *scenario.Check, node string) {
	spn, sp, err := s.spn(c)
	client := s.clientOn(node)
	if err != nil || client == nil {
		s.outcomeCheck(ctx, c, node, "") // reports the error
		return
	}
	want := s.or.Expect(s.o.Mode, sp, s.state().Endpoints[spn], node, s.zone(node))
	eps := want.Endpoints()
	if want.Kind != oracle.Endpoints || len(eps) < 2 {
		s.outcomeCheck(ctx, c, node, "")
		return
	}
	start := s.mc.now()
	rc := &report.Check{Name: c.Name + " @ " + node, Type: c.Type, Service: c.Service, ClientNode: node, Seed: s.seed, Alpha: s.alphaUnit,
		Test: "deterministic (rr balance)", P: 1}
	defer func() { rc.Duration = s.mc.now() - start; s.out.Checks = append(s.out.Checks, rc) }()
	k := len(eps)
	n := k * max(10, (deterministicProbes+k-1)/k)
	s.mc.quiesce()
	before := s.mc.counters(node)
	s.mc.flush()
	s.mc.phase()
	foreign0 := s.mc.collect(0).Foreign
	sent, err := s.mc.send(ctx, Probe{Client: client, Src: client.Config.Addrs[0], VIP: netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)), Proto: protoOf(sp), N: n}, s.rng)
	if err != nil {
		rc.Verdict, rc.Message = report.Error, err.Error()
		return
	}
	cn := s.mc.collect(sent)
	after := s.mc.counters(node)
	per := cn.PerEndpoint()
	var seq []string
	lo, hi, arrived := sent, 0, 0
	for _, e := range eps {
		v := per[netip.MustParseAddrPort(e)]
		lo, hi, arrived = min(lo, v), max(hi, v), arrived+v
	}
	for e, v := range per {
		for range v {
			seq = append(seq, e.String())
		}
	}
	rc.N = sent
	rc.Table = tableOf(seq, eps, 1/float64(k))
	other := 0
	for e, v := range per {
		if !want.Allows(e.String()) {
			other += v
		}
	}
	rejected, lost := cn.Rejected(), max(0, sent-arrived-other-cn.Rejected())
	if rejected+lost > 0 {
		rc.Table = append(rc.Table, report.Row{Outcome: "REJECT or lost", Observed: float64(rejected + lost)})
	}
	interleaved := max(0, cn.Foreign-foreign0)
	rc.Statistic = float64(hi - lo)
	rc.Message = fmt.Sprintf("rr: %d new connections, per-endpoint counts %d to %d (allowed spread %d: 1 + %d packets of earlier phases)", sent, lo, hi, 1+interleaved, interleaved)
	switch {
	case other+rejected+lost > 0:
		fail(rc, other+rejected+lost, "rr: of %d connections %d reached another service's endpoint, %d were rejected, %d lost", sent, other, rejected, lost)
	case hi-lo > 1+interleaved:
		fail(rc, hi-lo, "rr: per-endpoint counts %d to %d after %d new connections: not a rotation (allowed spread %d)", lo, hi, sent, 1+interleaved)
	}
	rc.Verdict = report.Pass // Holm decides at the end of the run
	rc.Witness = witness(spn, before, after, per, rc)
}
