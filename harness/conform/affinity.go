package conform

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// affinity checks sessionAffinity ClientIP from every client address on a
// node, in three verdicts (reference statistics.md), each sized from power
// at the unit's alpha (affinity_plan.go):
//
//   - first choice: the fresh choices of new clients follow the oracle's
//     shares (chi-square; a rotation for ipvs rr; the hash's consistency
//     for sh and dh). Fresh choices are the first round of the scenario's
//     client addresses and, to reach the size, one last round (after the
//     other verdicts, so that its bindings never evict a real client from
//     a recent list) of synthetic source addresses from the node's pod
//     block that nothing else uses;
//   - stickiness: every later connection inside the timeout reaches the
//     client's endpoint (zero tolerance, except where the oracle names a
//     known deviation such as the iptables recent-list capacity), sized for
//     a tenth of the clients losing affinity;
//   - expiry: after idling past the timeout a client chooses afresh
//     ((k-1)/k switch, exact binomial; the rotation's prediction for ipvs
//     rr), over as many idle cycles as its size needs. A lost, rejected or
//     forbidden outcome is a violation.
//
// A verdict that cannot test anything is reported as NotRun with the
// reason.
func (s *suite) affinity(ctx context.Context, c *scenario.Check, nodeName string) {
	a := &affinityCheck{s: s, c: c, node: nodeName, start: s.mc.now()}
	base := fmt.Sprintf("%s @ %s", c.Name, nodeName)
	mk := func(suffix string) *report.Check {
		return &report.Check{Name: base + " / " + suffix, Type: c.Type, Service: c.Service, ClientNode: nodeName, Phase: suffix,
			Seed: s.seed, Alpha: s.alphaUnit, Power: c.Power}
	}
	a.first, a.sticky, a.expiry = mk("first choice"), mk("stickiness"), mk("expiry")
	defer func() {
		for _, rc := range []*report.Check{a.first, a.sticky, a.expiry} {
			rc.Duration = s.mc.now() - a.start
			s.out.Checks = append(s.out.Checks, rc)
		}
	}()
	if err := a.prepare(); err != nil {
		a.fail(err.Error())
		return
	}
	for _, step := range []func(context.Context) error{a.firstRound, a.stickiness, a.expiryCycles, a.freshRound} {
		if err := step(ctx); err != nil {
			a.fail(err.Error())
			return
		}
	}
	a.decideFirst()
}

// affinityAddr is one source address of the check: a client pod's (client
// indexes s.mc.clients()) or a synthetic one sent from that client's
// namespace.
type affinityAddr struct {
	client int
	ip     netip.Addr
}

// affinityCheck is one affinity check in progress.
type affinityCheck struct {
	s                     *suite
	c                     *scenario.Check
	node                  string
	start, t0             time.Duration
	first, sticky, expiry *report.Check
	plan                  affinityPlan
	sp                    *cluster.ServicePort
	want                  oracle.Outcome
	eps                   []string
	aff                   *oracle.Affinity
	vip                   netip.AddrPort
	proto                 traffic.Proto
	clients               []*netns.Client
	// bound are the addresses bound in the first round and followed
	// through stickiness and expiry; spare are free synthetic addresses.
	bound []affinityAddr
	spare []netip.Addr
	// firstSeq are the first round's outcomes in send order; fresh those of
	// the last round of synthetic addresses.
	firstSeq, fresh []string
	// sched counts the fresh choices ipvs rr made since the first round's
	// first (the rotation's position relative to firstSeq[0]).
	sched int
	// reused counts the fresh choices of synthetic addresses used again
	// after the timeout.
	reused int
}

// fail marks every verdict not yet decided as an error.
func (a *affinityCheck) fail(msg string) {
	for _, rc := range []*report.Check{a.first, a.sticky, a.expiry} {
		if rc.Verdict == "" {
			rc.Verdict, rc.Message = report.Error, msg
		}
	}
}

// outcome names what a probe ended in: an endpoint, "REJECT" or "lost".
const (
	outcomeReject = "REJECT"
	outcomeLost   = "lost"
)

// prepare resolves the service port, the oracle's outcome, the plan and the
// addresses.
func (a *affinityCheck) prepare() error {
	s := a.s
	spn, sp, err := s.spn(a.c)
	if err != nil {
		return err
	}
	a.sp = sp
	if !sp.ClientIPAffinity {
		return fmt.Errorf("the Service has no sessionAffinity ClientIP")
	}
	a.clients = s.mc.clients()
	for i, cl := range a.clients {
		if cl.Node == a.node {
			for _, ip := range cl.Config.Addrs {
				a.bound = append(a.bound, affinityAddr{i, ip})
			}
		}
	}
	if len(a.bound) == 0 {
		return fmt.Errorf("no client pod on node %s", a.node)
	}
	st := s.state()
	a.want = s.or.Expect(s.o.Mode, sp, st.Endpoints[spn], a.node, s.zone(a.node))
	if a.want.Kind != oracle.Endpoints {
		return fmt.Errorf("the oracle expects %s: affinity cannot be checked", a.want)
	}
	a.eps = a.want.Endpoints()
	a.plan = planAffinity(s.o.Mode, s.scheduler(), sp, len(a.eps))
	a.aff = s.or.NewAffinity(s.o.Mode, sp, a.want)
	a.vip = netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))
	a.proto = protoOf(sp)
	a.spare = freeAddrs(st, a.clients, a.node)
	a.t0 = s.mc.now()
	// More clients for stickiness when the pods have too few: synthetic
	// ones, outside ipvs mode (a synthetic address gets no reset back, so
	// its ipvs connection would outlive the probe and hold its template),
	// and never more than one recent list holds in iptables mode.
	_, need := stickySize(len(a.eps), len(a.bound), a.c.Power)
	if extra := need - len(a.bound); extra > 0 && s.o.Mode != cluster.ModeIPVS && len(a.eps) > 1 {
		if s.o.Mode == cluster.ModeIPTables {
			extra = min(extra, s.recentCapacity()-len(a.bound))
		}
		extra = max(0, min(extra, len(a.spare)))
		for _, ip := range a.spare[:extra] {
			a.bound = append(a.bound, affinityAddr{a.bound[0].client, ip})
		}
		a.spare = a.spare[extra:]
	}
	return nil
}

// recentCapacity is the oracle's iptables recent-list capacity.
func (s *suite) recentCapacity() int {
	if s.or.RecentCapacity > 0 {
		return s.or.RecentCapacity
	}
	return oracle.DefaultRecentCapacity
}

// round sends one probe from every address of list, in order starting at
// the shift-th, after a conntrack flush, and returns each address's outcome
// and virtual send time (since t0), in send order. An ordered round (ipvs
// rr) sends one probe at a time and waits for it, so that the kernel
// schedules them in send order.
func (a *affinityCheck) round(ctx context.Context, list []affinityAddr, shift int, ordered bool) ([]string, []time.Duration, error) {
	s := a.s
	s.mc.flush()
	s.mc.phase()
	out := make([]string, len(list))
	at := make([]time.Duration, len(list))
	send := func(j int) error {
		ad := list[(j+shift)%len(list)]
		at[j] = s.mc.now() - a.t0
		_, err := s.mc.send(ctx, Probe{Client: a.clients[ad.client], Src: ad.ip, VIP: a.vip, Proto: a.proto, N: 1}, s.rng)
		return err
	}
	read := func(cn Counts, j int) {
		ip := list[(j+shift)%len(list)].ip
		out[j] = outcomeLost
		for k, v := range cn.Arrivals {
			if v > 0 && k.Client == ip {
				out[j] = k.Endpoint.String()
			}
		}
		if out[j] == outcomeLost && cn.Rejects[ip] > 0 {
			out[j] = outcomeReject
		}
	}
	if ordered {
		for j := range list {
			s.mc.phase()
			if err := send(j); err != nil {
				return nil, nil, err
			}
			read(s.mc.collect(1), j)
		}
		return out, at, nil
	}
	for j := range list {
		if err := send(j); err != nil {
			return nil, nil, err
		}
	}
	cn := s.mc.collect(len(list))
	for j := range list {
		read(cn, j)
	}
	return out, at, nil
}

// freeAddrs lists the addresses of node's pod block that no node, gateway,
// endpoint or client pod uses, from the top of the block down (below the
// client pods, which take the top): synthetic sources for fresh choices.
func freeAddrs(st *cluster.State, clients []*netns.Client, node string) []netip.Addr {
	n := st.Nodes[node]
	if n == nil || !n.PodCIDR.IsValid() || !n.PodCIDR.Addr().Is4() {
		return nil
	}
	pc := n.PodCIDR.Masked()
	used := map[netip.Addr]bool{pc.Addr(): true, pc.Addr().Next(): true}
	for _, x := range st.Nodes {
		used[x.IP] = true
	}
	for _, eps := range st.Endpoints {
		for _, e := range eps {
			used[e.IP] = true
		}
	}
	for _, cl := range clients {
		for _, ip := range cl.Config.Addrs {
			used[ip] = true
		}
	}
	var out []netip.Addr
	for ip := topology.LastHost(pc); pc.Contains(ip); ip = ip.Prev() {
		if !used[ip] {
			out = append(out, ip)
		}
	}
	return out
}
