package simulate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/report"
)

// extConfidence is the simultaneous confidence of the per-pod intervals.
const extConfidence = 0.999

// externalReport is the report's external traffic section (nil without
// external clients).
func (w *world) externalReport(results [][]*nodeResult, accs []*modeAcc) *report.External {
	if w.ext == nil {
		return nil
	}
	e := &report.External{
		Note: "Connections from outside the cluster enter at a node (the balancer's choice, or the client's node list) and that node's rules decide (engine.RenderExternal). " +
			"Expected shares are the oracle's: per client, the nodes it sends to (a balancer: those whose health check passes) each with an equal part, split as each node's rules must split it (externalTrafficPolicy Local: the node's own pods); " +
			"shares are of the initial state's connections decided by up-to-date rules, with simultaneous intervals. " +
			"A health check's answer is taken to change at the API write; the balancer's probe phases are drawn from the seed. loadBalancerSourceRanges are not modelled: every client is taken to be allowed.",
		Clients: []report.ExternalClient{}, Services: []report.ExternalService{}, Lags: []report.HealthCheckLag{},
	}
	for _, ec := range w.ext.clients {
		rc := report.ExternalClient{Name: ec.name, Via: ec.via, Targets: len(ec.targets)}
		for _, ni := range ec.nodes {
			rc.Nodes = append(rc.Nodes, w.nodes[ni].name)
		}
		if ec.hc != nil {
			rc.HealthCheck = fmt.Sprintf("every %s, out after %d failures, back after %d passes", ec.hc.Interval.Duration, ec.hc.UnhealthyThreshold, ec.hc.HealthyThreshold)
		}
		e.Clients = append(e.Clients, rc)
	}
	for x := w.nBase; x < int32(len(w.svcs)); x++ {
		if s, ok := w.externalService(x, results, accs); ok {
			e.Services = append(e.Services, s)
		}
	}
	slices.SortStableFunc(e.Services, func(a, b report.ExternalService) int {
		switch {
		case a.Expected > b.Expected:
			return -1
		case a.Expected < b.Expected:
			return 1
		}
		return strings.Compare(a.ServicePort, b.ServicePort)
	})
	e.Lags = w.lagReport(results)
	e.Policies = w.policyImbalance(e)
	return e
}

// externalService is one external entry's pods and shares; false when it
// received nothing the oracle sends to endpoints.
func (w *world) externalService(x int32, results [][]*nodeResult, accs []*modeAcc) (report.ExternalService, bool) {
	s, ids, ok := w.externalPods(x)
	if !ok {
		return s, false
	}
	for mi, md := range w.modes {
		s.Modes = append(s.Modes, w.externalShares(md.name, x, ids, &s, results[mi], accs[mi]))
	}
	return s, true
}

// externalPods is an external entry's pods with the oracle's expectations
// (of its initial state), and their local endpoint IDs; false when the
// oracle sends its connections to no endpoint.
func (w *world) externalPods(x int32) (report.ExternalService, []int, bool) {
	sv := &w.svcs[x]
	g0 := sv.gvs[0]
	gi := &w.gvs[g0]
	exp, local, clu := w.expectedShares(x, gi)
	if len(exp.Probs) == 0 {
		return report.ExternalService{}, nil, false
	}
	s := report.ExternalService{ServicePort: w.svcs[sv.base].label, Via: sv.via, Policy: "Cluster", Source: "node"}
	if gi.sp.ExternalLocal {
		s.Policy = "Local"
	}
	if exp.Source == oracle.SourceClient {
		s.Source = "client"
	}
	var ids []int
	for id, name := range sv.names {
		if local.Probs[name] > 0 || clu.Probs[name] > 0 || exp.Probs[name] > 0 {
			ids = append(ids, id)
			s.Pods = append(s.Pods, report.ExternalPod{Endpoint: name, Node: endpointNode(gi, sv.eps[id]), Expected: exp.Probs[name], Local: local.Probs[name], Cluster: clu.Probs[name]})
		}
	}
	s.Expected = ratioOf(s.Pods, func(p report.ExternalPod) float64 { return p.Expected })
	s.ExpectedLocal = ratioOf(s.Pods, func(p report.ExternalPod) float64 { return p.Local })
	s.ExpectedCluster = ratioOf(s.Pods, func(p report.ExternalPod) float64 { return p.Cluster })
	return s, ids, true
}

// externalShares is one mode's shares of an entry's initial version.
func (w *world) externalShares(mode cluster.Mode, x int32, ids []int, s *report.ExternalService, res []*nodeResult, acc *modeAcc) report.ExternalModeShares {
	sv := &w.svcs[x]
	g0 := sv.gvs[0]
	m := report.ExternalModeShares{Mode: mode, Confidence: extConfidence, Within: true}
	for _, g := range sv.gvs {
		m.Connections += acc.gv[g].Total
		m.Dropped += acc.gv[g].Dropped
		m.Lost += acc.gv[g].Lost
	}
	counts := make([]float64, len(ids))
	off := w.gvs[g0].cellOff
	for i, id := range ids {
		counts[i] = float64(acc.cells[off+int32(id)])
		m.Sample += int64(counts[i])
	}
	m.Shares = make([]float64, len(ids))
	m.Low, m.High = make([]float64, len(ids)), make([]float64, len(ids))
	if m.Sample == 0 {
		m.Within = false
		return m
	}
	if len(ids) > 1 {
		m.Low, m.High = stats.SimultaneousIntervals(counts, extConfidence)
	} else {
		m.Low[0], m.High[0] = 1, 1
	}
	for i := range ids {
		m.Shares[i] = counts[i] / float64(m.Sample)
		if e := s.Pods[i].Expected; e < m.Low[i]-1e-12 || e > m.High[i]+1e-12 {
			m.Within = false
		}
	}
	pods := make([]report.ExternalPod, len(ids))
	for i := range pods {
		pods[i] = report.ExternalPod{Expected: s.Pods[i].Expected, Local: m.Shares[i]}
	}
	m.BusiestToIdlest = ratioOf(pods, func(p report.ExternalPod) float64 {
		if p.Expected == 0 {
			return 0
		}
		return p.Local
	})
	return m
}

// ratioOf is the busiest-to-idlest ratio of the positive values (0 when
// none, or when the idlest of the pods expected to receive got nothing).
func ratioOf(pods []report.ExternalPod, f func(report.ExternalPod) float64) float64 {
	hi, lo := 0.0, 0.0
	for _, p := range pods {
		v := f(p)
		if v <= 0 {
			continue
		}
		hi = max(hi, v)
		if lo == 0 || v < lo {
			lo = v
		}
	}
	if lo == 0 {
		return 0
	}
	return hi / lo
}

// endpointNode is the node of an endpoint in a version.
func endpointNode(gi *gvInfo, ap netip.AddrPort) string {
	for _, e := range gi.eps {
		if e.IP == ap.Addr() && uint16(e.Port) == ap.Port() {
			return e.NodeName
		}
	}
	return ""
}

// expectedShares is the oracle's expectation for an entry's version: each
// client's own (a balancer's ExpectBalanced over its nodes, following
// their health checks; node-port and external-IP clients the same over
// their nodes without) weighted by its share of the entry's connections;
// and the same under externalTrafficPolicy Local and Cluster.
func (w *world) expectedShares(x int32, gi *gvInfo) (exp, local, clu oracle.Outcome) {
	mode := w.modes[0].name
	or := oracle.Oracle{}
	zones := map[string]string{}
	for _, n := range w.nodes {
		zones[n.name] = n.zone
	}
	mixture := func(sp *cluster.ServicePort) oracle.Outcome {
		out := oracle.Outcome{Probs: map[string]float64{}}
		total := 0.0
		for _, ci := range w.ext.byEntry[x] {
			ec := w.ext.clients[ci]
			wt := ec.entryWeight(x) * w.sc.Traffic.Clients[ec.idx].Weight
			var names []string
			for _, ni := range ec.nodes {
				names = append(names, w.nodes[ni].name)
			}
			o, _ := or.ExpectBalanced(mode, sp, gi.eps, names, zones, netip.Addr{}, ec.via == cluster.ViaLoadBalancer)
			if o.Kind != oracle.Endpoints {
				continue
			}
			out.Source = o.Source
			for k, p := range o.Probs {
				out.Probs[k] += wt * p
			}
			total += wt
		}
		for k := range out.Probs {
			out.Probs[k] /= total
		}
		return out
	}
	exp = mixture(gi.sp)
	l, c := *gi.sp, *gi.sp
	l.ExternalLocal, c.ExternalLocal = true, false
	return exp, mixture(&l), mixture(&c)
}

// entryWeight is the client's share of its connections that go to entry x.
func (ec *extClient) entryWeight(x int32) float64 {
	for i, t := range ec.targets {
		if t == x {
			return ec.weights[i]
		}
	}
	return 0
}

// lagReport is every load balancer's health-check lags with what each
// mode did with the connections the node received meanwhile: those of the
// entry's versions that began inside the lag, on that node.
func (w *world) lagReport(results [][]*nodeResult) []report.HealthCheckLag {
	out := []report.HealthCheckLag{}
	for _, ec := range w.ext.clients {
		if ec.lb == nil {
			continue
		}
		for _, l := range ec.lb.lags {
			hl := report.HealthCheckLag{Step: int(l.step) + 1, AtSeconds: secs(l.from), ServicePort: w.svcs[l.target].label, Client: ec.name,
				Node: w.nodes[l.node].name, LagSeconds: secs(l.end - l.from), Noticed: l.noticed, Expected: l.expected}
			for mi, md := range w.modes {
				lm := report.LagMode{Mode: md.name}
				for _, g := range w.svcs[l.target].gvs {
					gi := &w.gvs[g]
					if gi.step < 0 || w.steps[gi.step].at < l.from || w.steps[gi.step].at >= l.end {
						continue
					}
					kg := results[mi][l.node].perNode[g]
					if kg == nil {
						continue
					}
					lm.Connections += kg.c.Total
					lm.Dropped += kg.c.Dropped
					lm.Lost += kg.c.Lost
					lm.Misrouted += kg.c.Misrouted
				}
				hl.Modes = append(hl.Modes, lm)
			}
			out = append(out, hl)
		}
	}
	slices.SortStableFunc(out, func(a, b report.HealthCheckLag) int { return cmp.Compare(a.AtSeconds, b.AtSeconds) })
	return out
}

// policyImbalance sums, per mode, the busiest-to-idlest ratios of the
// Local and of the Cluster destinations, and the health-check lags.
func (w *world) policyImbalance(e *report.External) []report.PolicyImbalance {
	var out []report.PolicyImbalance
	for mi, md := range w.modes {
		pi := report.PolicyImbalance{Mode: md.name}
		var loc, clu []float64
		worst := 0.0
		for _, s := range e.Services {
			r := s.Modes[mi].BusiestToIdlest
			if r <= 0 {
				continue
			}
			if s.Policy == "Local" {
				loc = append(loc, r)
				if r > worst {
					worst, pi.WorstLocal = r, s.ServicePort+" via "+string(s.Via)
				}
			} else {
				clu = append(clu, r)
			}
		}
		pi.LocalCount, pi.LocalMedian, pi.LocalMax = summarizeRatios(loc)
		pi.ClusterCount, pi.ClusterMedian, pi.ClusterMax = summarizeRatios(clu)
		for _, l := range e.Lags {
			m := l.Modes[mi]
			pi.LagConnections += m.Connections
			pi.LagFailed += m.Dropped + m.Lost + m.Misrouted
		}
		out = append(out, pi)
	}
	return out
}

func summarizeRatios(v []float64) (n int, median, maximum float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	return len(v), v[len(v)/2], v[len(v)-1]
}
