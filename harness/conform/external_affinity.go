package conform

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// phaseAcross is the external-affinity verdict over every entry node.
const phaseAcross = "across entry nodes"

// acrossProbes is the connections each client address opens through each
// entry node in the across verdict: enough to see the node hold it to one
// endpoint (a node that chose anew for each would show two endpoints among
// four connections with probability 1 - 1/n^3 for n endpoints).
const acrossProbes = 4

// acrossZeroTolerance is how many client addresses the across verdict
// uses where it has no agreement test (IPVS) or where the nodes cannot
// agree (Local: no endpoint in common).
const acrossZeroTolerance = 4

// affinityAcross is the external-affinity check's claim across entry
// nodes (oracle.ExpectAcross): one client whose connections enter through
// several nodes. kube-proxy keeps ClientIP affinity per node, so each
// entry node holds the client to an endpoint of its own choice. For each
// of m addresses of the client outside the cluster, acrossProbes
// connections go through each entry node in turn, then through the first
// again. Zero tolerance: each node holds each address to one endpoint that
// the node may use, and the first node still holds it after the others
// chose. Where the choice is random (iptables, nftables), the number of
// addresses for which all nodes chose the same endpoint is held against
// the oracle's probability of agreement by an exact binomial test, sized
// against one affinity state shared by the nodes (every address agrees);
// IPVS's schedulers choose in turn, and only the zero-tolerance part runs.
func (s *suite) affinityAcross(ctx context.Context, c *scenario.Check, nodes []string) {
	start := s.mc.now()
	rc := &report.Check{Name: c.Name + " / " + phaseAcross, Type: c.Type, Service: c.Service, Phase: phaseAcross, Seed: s.seed, Alpha: s.alphaUnit, MDE: c.MDE, Power: c.Power}
	defer func() { rc.Duration = s.mc.now() - start; s.out.Checks = append(s.out.Checks, rc) }()
	fail := func(err error) { rc.Verdict, rc.Message = report.Error, err.Error() }
	spn, sp, err := s.spn(c)
	if err != nil {
		fail(err)
		return
	}
	st := s.state()
	_, via := scenario.CheckRoute(c)
	outside, _, err := s.outsideClient(c, sp, "")
	if err != nil {
		fail(err)
		return
	}
	addrs := outside.Config.Addrs
	zones := map[string]string{}
	for _, n := range nodes {
		zones[n] = s.zone(n)
	}
	across := s.or.ExpectAcross(s.o.Mode, sp, st.Endpoints[spn], addrs[0], via, nodes, zones)
	// Only the nodes that send the client somewhere take part.
	var entry []string
	for _, n := range nodes {
		if across.PerNode[n].Kind == oracle.Endpoints {
			entry = append(entry, n)
		}
	}
	if len(entry) < 2 {
		rc.Verdict, rc.Message = report.NotRun, fmt.Sprintf("fewer than two of the entry nodes %s reach an endpoint of %s", strings.Join(nodes, ", "), spn)
		return
	}
	if len(entry) < len(nodes) {
		across = s.or.ExpectAcross(s.o.Mode, sp, st.Endpoints[spn], addrs[0], via, entry, zones)
	}
	m := len(addrs)
	if !across.Random || across.Agree == 0 {
		// Zero tolerance only (or an agreement that cannot happen):
		// a few addresses show it; IPVS under TCG spends about two
		// seconds on each address and node.
		m = min(m, acrossZeroTolerance)
	}
	if across.Random && across.Agree > 0 && across.Agree < 1 {
		if need := stats.BinomialSampleSize(across.Agree, 1, s.alphaUnit, c.Power, stats.Greater); need > 0 && need < m {
			m = need
		}
		rc.AchievedPower = stats.BinomialPower(m, across.Agree, 1, s.alphaUnit, stats.Greater)
	}
	addrs = addrs[:m]

	// chosen[node][address]: the endpoint the node held the address to.
	chosen := map[string]map[netip.Addr]netip.AddrPort{}
	var problems []string
	sent, arrived := 0, 0
	round := func(node string, record bool) error {
		t, err := s.target(c, spn, sp, node, "")
		if err != nil {
			return err
		}
		if record {
			chosen[node] = map[netip.Addr]netip.AddrPort{}
		}
		for _, a := range addrs {
			s.mc.phase()
			n, err := s.mc.send(ctx, Probe{Client: t.client, Src: a, VIP: t.dst, Proto: t.proto, N: acrossProbes}, s.rng)
			sent += n
			if err != nil {
				return err
			}
			per := s.mc.collect(n).PerEndpoint()
			eps := slices.SortedFunc(func(yield func(netip.AddrPort) bool) {
				for e := range per {
					if !yield(e) {
						return
					}
				}
			}, func(x, y netip.AddrPort) int { return x.Compare(y) })
			for _, e := range eps {
				arrived += per[e]
			}
			switch {
			case len(eps) == 0:
				return &EnvironmentError{fmt.Errorf("none of %d connections from %s through %s arrived", n, a, node)}
			case len(eps) > 1:
				problems = append(problems, fmt.Sprintf("%s held %s to %d endpoints (%s)", node, a, len(eps), joinAddrPorts(eps)))
			case !across.PerNode[node].Allows(eps[0].String()):
				problems = append(problems, fmt.Sprintf("%s sent %s to %s, which it may not use", node, a, eps[0]))
			}
			if record {
				chosen[node][a] = eps[0]
			} else if first := chosen[node][a]; eps[0] != first {
				problems = append(problems, fmt.Sprintf("%s moved %s from %s to %s after the other nodes chose", node, a, first, eps[0]))
			}
		}
		return nil
	}
	for _, n := range entry {
		if err := round(n, true); err != nil {
			fail(err)
			return
		}
	}
	if err := round(entry[0], false); err != nil {
		fail(err)
		return
	}
	if sent > arrived {
		problems = append(problems, fmt.Sprintf("%d of %d connections did not arrive", sent-arrived, sent))
	}

	agree := 0
	for _, a := range addrs {
		e := chosen[entry[0]][a]
		same := true
		for _, n := range entry[1:] {
			same = same && chosen[n][a] == e
		}
		if same {
			agree++
		}
	}
	rc.N = sent
	rc.Table = []report.Row{
		{Outcome: "addresses all entry nodes held to one endpoint", Observed: float64(agree), Expected: float64(m) * across.Agree},
		{Outcome: "addresses the entry nodes held to different endpoints", Observed: float64(m - agree), Expected: float64(m) * (1 - across.Agree)},
	}
	rc.Message = across.Reason + "; " + acrossSummary(entry, addrs, chosen)
	if len(problems) > 0 {
		rc.Test, rc.P, rc.Statistic = "deterministic", 0, 1
		rc.Message += "; " + strings.Join(problems, "; ")
		return
	}
	if !across.Random {
		rc.Test, rc.P, rc.Statistic = "deterministic", 1, 0
		rc.Message += fmt.Sprintf("; %d of %d addresses agreed across the nodes (not tested: the schedulers do not choose at random)", agree, m)
		return
	}
	res, err := stats.BinomialTest(agree, m, math.Min(1, across.Agree), stats.Greater)
	if err != nil {
		fail(err)
		return
	}
	rc.Test, rc.P, rc.Statistic = res.Test+" (agreement of the entry nodes, greater)", res.P, res.Statistic
	if rc.AchievedPower < c.Power {
		rc.Message += fmt.Sprintf("; power %.2g against one state shared by the nodes with %d client addresses (the outside client's sourceIPs; %d reach %.2g)",
			rc.AchievedPower, m, max(stats.BinomialSampleSize(across.Agree, 1, s.alphaUnit, c.Power, stats.Greater), 0), c.Power)
	}
}

// acrossSummary lists the first addresses' endpoints per node.
func acrossSummary(nodes []string, addrs []netip.Addr, chosen map[string]map[netip.Addr]netip.AddrPort) string {
	var parts []string
	for i, a := range addrs {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("... (%d addresses)", len(addrs)))
			break
		}
		var per []string
		for _, n := range nodes {
			per = append(per, fmt.Sprintf("%s %s", n, chosen[n][a].Addr()))
		}
		parts = append(parts, fmt.Sprintf("%s: %s", a, strings.Join(per, ", ")))
	}
	return strings.Join(parts, "; ")
}

func joinAddrPorts(eps []netip.AddrPort) string {
	s := make([]string, len(eps))
	for i, e := range eps {
		s[i] = e.String()
	}
	return strings.Join(s, ", ")
}
