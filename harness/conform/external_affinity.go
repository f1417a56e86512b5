package conform

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
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
	m, power := acrossAddresses(across, len(addrs), s.alphaUnit, c.Power)
	rc.AchievedPower = power
	r := &acrossRun{s: s, c: c, spn: spn, sp: sp, across: across, addrs: addrs[:m], chosen: map[string]map[netip.Addr]netip.AddrPort{}}
	for _, n := range entry {
		if err := r.round(ctx, n, true); err != nil {
			fail(err)
			return
		}
	}
	if err := r.round(ctx, entry[0], false); err != nil {
		fail(err)
		return
	}
	if err := r.decide(rc, entry); err != nil {
		fail(err)
	}
}

// acrossAddresses is how many of n client addresses the across verdict
// uses, and its power against one state shared by the nodes: a few where
// only the zero-tolerance part runs (IPVS, or nodes that cannot agree),
// else the fewest that reach power at alpha (all n when none do).
func acrossAddresses(across oracle.Across, n int, alpha, power float64) (int, float64) {
	if !across.Random || across.Agree == 0 {
		// IPVS under TCG spends about two seconds on each address and node.
		return min(n, acrossZeroTolerance), 0
	}
	if across.Agree >= 1 {
		return n, 0
	}
	m := n
	if need := stats.BinomialSampleSize(across.Agree, 1, alpha, power, stats.Greater); need > 0 && need < m {
		m = need
	}
	return m, stats.BinomialPower(m, across.Agree, 1, alpha, stats.Greater)
}

// acrossRun is the state of one across verdict's probing.
type acrossRun struct {
	s      *suite
	c      *scenario.Check
	spn    cluster.ServicePortName
	sp     *cluster.ServicePort
	across oracle.Across
	addrs  []netip.Addr
	// chosen[node][address]: the endpoint the node held the address to.
	chosen        map[string]map[netip.Addr]netip.AddrPort
	problems      []string
	sent, arrived int
}

// round sends acrossProbes connections from every address through node;
// record keeps each address's endpoint there, else each must still be the
// one recorded.
func (r *acrossRun) round(ctx context.Context, node string, record bool) error {
	s := r.s
	t, err := s.target(r.c, r.spn, r.sp, node, "")
	if err != nil {
		return err
	}
	if record {
		r.chosen[node] = map[netip.Addr]netip.AddrPort{}
	}
	for _, a := range r.addrs {
		s.mc.phase()
		n, err := s.mc.send(ctx, Probe{Client: t.client, Src: a, VIP: t.dst, Proto: t.proto, N: acrossProbes}, s.rng)
		r.sent += n
		if err != nil {
			return err
		}
		per := s.mc.collect(n).PerEndpoint()
		eps := slices.SortedFunc(maps.Keys(per), netip.AddrPort.Compare)
		for _, e := range eps {
			r.arrived += per[e]
		}
		switch {
		case len(eps) == 0:
			return &EnvironmentError{fmt.Errorf("none of %d connections from %s through %s arrived", n, a, node)}
		case len(eps) > 1:
			r.problems = append(r.problems, fmt.Sprintf("%s held %s to %d endpoints (%s)", node, a, len(eps), joinAddrPorts(eps)))
		case !r.across.PerNode[node].Allows(eps[0].String()):
			r.problems = append(r.problems, fmt.Sprintf("%s sent %s to %s, which it may not use", node, a, eps[0]))
		}
		if record {
			r.chosen[node][a] = eps[0]
		} else if first := r.chosen[node][a]; eps[0] != first {
			r.problems = append(r.problems, fmt.Sprintf("%s moved %s from %s to %s after the other nodes chose", node, a, first, eps[0]))
		}
	}
	return nil
}

// decide fills rc: the agreement table, the zero-tolerance problems, and
// the binomial test where the choice is random.
func (r *acrossRun) decide(rc *report.Check, entry []string) error {
	if r.sent > r.arrived {
		r.problems = append(r.problems, fmt.Sprintf("%d of %d connections did not arrive", r.sent-r.arrived, r.sent))
	}
	m, agree := len(r.addrs), 0
	for _, a := range r.addrs {
		e := r.chosen[entry[0]][a]
		same := true
		for _, n := range entry[1:] {
			same = same && r.chosen[n][a] == e
		}
		if same {
			agree++
		}
	}
	across := r.across
	rc.N = r.sent
	rc.Table = []report.Row{
		{Outcome: "addresses all entry nodes held to one endpoint", Observed: float64(agree), Expected: float64(m) * across.Agree},
		{Outcome: "addresses the entry nodes held to different endpoints", Observed: float64(m - agree), Expected: float64(m) * (1 - across.Agree)},
	}
	rc.Message = across.Reason + "; " + acrossSummary(entry, r.addrs, r.chosen)
	if len(r.problems) > 0 {
		rc.Test, rc.P, rc.Statistic = "deterministic", 0, 1
		rc.Message += "; " + strings.Join(r.problems, "; ")
		return nil
	}
	if !across.Random {
		rc.Test, rc.P, rc.Statistic = "deterministic", 1, 0
		rc.Message += fmt.Sprintf("; %d of %d addresses agreed across the nodes (not tested: the schedulers do not choose at random)", agree, m)
		return nil
	}
	res, err := stats.BinomialTest(agree, m, math.Min(1, across.Agree), stats.Greater)
	if err != nil {
		return err
	}
	rc.Test, rc.P, rc.Statistic = res.Test+" (agreement of the entry nodes, greater)", res.P, res.Statistic
	if rc.AchievedPower < r.c.Power {
		rc.Message += fmt.Sprintf("; power %.2g against one state shared by the nodes with %d client addresses (the outside client's sourceIPs; %d reach %.2g)",
			rc.AchievedPower, m, max(stats.BinomialSampleSize(across.Agree, 1, r.s.alphaUnit, r.c.Power, stats.Greater), 0), r.c.Power)
	}
	return nil
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
