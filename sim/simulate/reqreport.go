package simulate

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/report"
)

// boundRule is how the report's even-spread bound is computed.
const boundRule = "1 + z·sqrt((k−1)·Σc n_c²)/N over the k pods the API allows, N requests and n_c of them on connection c: the busiest pod's share over the fair share that an even random spread of the connections (each on a pod drawn uniformly, its requests with it; a request's own connection carries one) exceeds with probability α at most, z the normal quantile at 1 − α/(k·bins after the event)"

// requestClients describes the client groups with requests for the
// report's traffic section.
func (w *world) requestClients() []report.RequestClient {
	if w.rq == nil {
		return nil
	}
	out := make([]report.RequestClient, len(w.rq.groups))
	for gi, g := range w.rq.groups {
		c := report.RequestClient{Name: g.name, Pool: g.size, MaxAgeSeconds: secs(g.maxAge), RatePerSecond: g.rate, Duration: g.dur.desc}
		if g.size > 0 {
			c.Pick = "round-robin"
			if g.leastBusy {
				c.Pick = "least-busy"
			}
		}
		for _, cs := range w.rq.perNode {
			for _, cl := range cs {
				if int(cl.group) == gi {
					c.Clients++
				}
			}
		}
		out[gi] = c
	}
	return out
}

// longLived is a mode's request figures: its requests, and each followed
// service port's (nil and nil without clients with requests).
func (w *world) longLived(mi int, res []*nodeResult) (*report.Requests, []report.LongLived) {
	if w.rq == nil {
		return nil, nil
	}
	sum := w.newReqCounts()
	for _, nr := range res {
		if nr.req != nil {
			sum.add(nr.req)
		}
	}
	out := make([]report.LongLived, len(w.rq.follow))
	for fi := range w.rq.follow {
		out[fi] = w.followedFigures(w.modes[mi], fi, &sum.ports[fi])
	}
	return &report.Requests{Total: sum.total, Failed: sum.failed}, out
}

// followedFigures is one followed port's figures in one mode, from its
// counts summed over nodes.
func (w *world) followedFigures(md *modeData, fi int, pc *portCounts) report.LongLived {
	rq := w.rq
	f := rq.follow[fi]
	sv := &w.svcs[f.svc]
	ll := report.LongLived{ServicePort: sv.label, Clients: f.groups, Pods: sv.names, BinSeconds: secs(rq.bin), Stale: pc.stale,
		Eligible: make([]int, rq.bins), PerBin: make([][]int64, rq.bins), InFlight: make([][]float64, rq.bins), Connections: make([][]float64, rq.bins)}
	for b := range rq.bins {
		ll.Eligible[b] = len(w.eligibleAt(md, f.svc, int64(b)*rq.bin))
		row := pc.reqs[b*pc.k : (b+1)*pc.k]
		ll.PerBin[b] = slices.Clone(row)
		ll.InFlight[b] = make([]float64, pc.k)
		ll.Connections[b] = make([]float64, pc.k)
		for ep := range pc.k {
			ll.Requests += row[ep]
			ll.ConnectionsOpened += pc.opened[b*pc.k+ep]
			ll.InFlight[b][ep] = float64(pc.busy[b*pc.k+ep]) / float64(rq.bin)
			ll.Connections[b][ep] = float64(pc.conn[b*pc.k+ep]) / float64(rq.bin)
		}
	}
	span := w.tr.span
	cut := span
	if f.at >= 0 {
		cut = min(span, f.at)
	}
	ll.Before = w.balance(md, f.svc, &pc.win[0], 0, cut)
	ll.Before.PerBin = w.binSpread(&ll, ll.Before.Pods, 0, cut)
	if cut < span {
		a := w.balance(md, f.svc, &pc.win[1], cut, span)
		a.PerBin = w.binSpread(&ll, a.Pods, cut, span)
		ll.After = &a
		ll.Scale = w.decay(md, fi, pc)
	}
	ll.Findings = w.findings(fi, &ll)
	return ll
}

// eligibleAt is the endpoints of service port s that the API's version
// in force at t allows from at least one node, in ID order.
func (w *world) eligibleAt(md *modeData, s int32, t int64) []int32 {
	sv := &w.svcs[s]
	g := sv.gvs[0]
	for _, v := range sv.gvs[1:] {
		if w.steps[w.gvs[v].step].at <= t {
			g = v
		}
	}
	var out []int32
	for ep := range sv.eps {
		for ni := range w.nodes {
			o := &md.outs[md.outAt(int(g), ni)]
			if o.kind == oracle.Endpoints && o.allows(int32(ep)) {
				out = append(out, int32(ep))
				break
			}
		}
	}
	return out
}

// binSpread is the spread of requests and requests in flight over the
// pods, bin by bin, over the whole bins of [from, to).
func (w *world) binSpread(ll *report.LongLived, pods []report.PodShare, from, to int64) report.BinSpread {
	rq := w.rq
	idx := make([]int, len(pods))
	for i, p := range pods {
		idx[i] = slices.Index(ll.Pods, p.Pod)
	}
	var reqs, busy []float64
	for b := int((from + rq.bin - 1) / rq.bin); int64(b+1)*rq.bin <= to && b < rq.bins; b++ {
		var n, top, fl, ftop float64
		for _, ep := range idx {
			x, y := float64(ll.PerBin[b][ep]), ll.InFlight[b][ep]
			n, top, fl, ftop = n+x, max(top, x), fl+y, max(ftop, y)
		}
		k := float64(len(idx))
		if n > 0 {
			reqs = append(reqs, top/n*k)
		}
		if fl > 0 {
			busy = append(busy, ftop/fl*k)
		}
	}
	bs := report.BinSpread{Bins: len(reqs)}
	bs.RequestsMean, bs.RequestsP95 = meanP95(reqs)
	bs.InFlightMean, bs.InFlightP95 = meanP95(busy)
	return bs
}

// meanP95 is the mean and 95th percentile of v (0, 0 when empty).
func meanP95(v []float64) (mean, p95 float64) {
	if len(v) == 0 {
		return 0, 0
	}
	for _, x := range v {
		mean += x
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return mean / float64(len(v)), s[min(len(s)-1, int(0.95*float64(len(s))))]
}

// zFor is the normal quantile an even spread's busiest of k pods
// exceeds with probability alpha at most (Bonferroni over the pods and
// the tests).
func zFor(k, tests int) float64 {
	return distuv.UnitNormal.Quantile(1 - balanceAlpha/float64(max(1, k*tests)))
}

// balance is a window's spread over the pods the API allows at its end.
func (w *world) balance(md *modeData, s int32, wc *winCounts, from, to int64) report.Balance {
	sv := &w.svcs[s]
	b := report.Balance{FromSeconds: secs(from), ToSeconds: secs(to), Pods: []report.PodShare{}}
	if to <= from {
		return b // a scale event at 0: nothing before it
	}
	elig := w.eligibleAt(md, s, to-1)
	length := float64(to - from)
	var conn, reqs, busy float64
	for _, ep := range elig {
		conn += float64(wc.conn[ep])
		reqs += float64(wc.reqs[ep])
		busy += float64(wc.busy[ep])
	}
	share := func(x, sum float64) float64 {
		if sum == 0 {
			return 0
		}
		return x / sum
	}
	for _, ep := range elig {
		b.Pods = append(b.Pods, report.PodShare{Pod: sv.names[ep],
			Connections: float64(wc.conn[ep]) / length, Requests: wc.reqs[ep], InFlight: float64(wc.busy[ep]) / length,
			ConnectionShare: share(float64(wc.conn[ep]), conn), RequestShare: share(float64(wc.reqs[ep]), reqs), InFlightShare: share(float64(wc.busy[ep]), busy)})
	}
	k := len(elig)
	z := zFor(k, 1)
	b.Connections = spreadOf(b.Pods, func(p report.PodShare) float64 { return p.ConnectionShare }, boundOf(z, k, wc.ct2, conn/1e9))
	b.Requests = spreadOf(b.Pods, func(p report.PodShare) float64 { return p.RequestShare }, boundOf(z, k, reqs, reqs))
	if cb := boundOf(z, k, wc.n2, reqs); cb > 0 {
		b.Requests.ConnectionBound, b.Requests.ByConnections = cb, b.Requests.MaxOverFair <= cb
	}
	b.InFlight = spreadOf(b.Pods, func(p report.PodShare) float64 { return p.InFlightShare }, 0)
	return b
}

// boundOf is the even-spread bound of max ÷ fair for k pods, a total n
// and the sum of the squares of what each connection carried (0 when
// there is nothing).
func boundOf(z float64, k int, sq, n float64) float64 {
	if n <= 0 || k < 1 {
		return 0
	}
	return 1 + z*math.Sqrt(float64(k-1)*sq)/n
}

// spreadOf is the busiest and idlest pod's share over the fair share.
func spreadOf(pods []report.PodShare, share func(report.PodShare) float64, bound float64) report.Spread {
	k := float64(len(pods))
	sp := report.Spread{Bound: bound}
	for i, p := range pods {
		x := share(p) * k
		if i == 0 || x > sp.MaxOverFair {
			sp.MaxOverFair = x
		}
		if i == 0 || x < sp.MinOverFair {
			sp.MinOverFair = x
		}
	}
	if bound > 0 {
		sp.Alpha = balanceAlpha
		sp.Even = sp.MaxOverFair <= bound
	}
	return sp
}

// decay is the request imbalance bin by bin from the scale event of
// followed port fi, against the even-spread bound.
func (w *world) decay(md *modeData, fi int, pc *portCounts) *report.Decay {
	rq := w.rq
	f := rq.follow[fi]
	sv := &w.svcs[f.svc]
	before := w.eligibleAt(md, f.svc, f.at-1)
	after := w.eligibleAt(md, f.svc, f.at)
	d := &report.Decay{AtSeconds: secs(f.at), Replicas: f.replicas, PodsBefore: len(before), PodsAfter: len(after),
		Alpha: balanceAlpha, BoundRule: boundRule, FromBin: int((f.at + rq.bin - 1) / rq.bin)}
	for _, ep := range after {
		if !slices.Contains(before, ep) {
			d.NewPods = append(d.NewPods, sv.names[ep])
		}
	}
	tests := max(1, rq.bins-d.FromBin)
	lastData := -1
	for b := d.FromBin; b < rq.bins; b++ {
		elig := w.eligibleAt(md, f.svc, int64(b)*rq.bin)
		row := pc.reqs[b*pc.k : (b+1)*pc.k]
		var n, top, added int64
		for _, ep := range elig {
			n += row[ep]
			top = max(top, row[ep])
			if !slices.Contains(before, ep) {
				added += row[ep]
			}
		}
		imb, bound, newShare := 0.0, 0.0, 0.0
		if n > 0 {
			k := len(elig)
			imb = float64(top) / float64(n) * float64(k)
			bound = boundOf(zFor(k, tests), k, pc.n2[b], float64(n))
			newShare = float64(added) / float64(n)
			lastData = len(d.Imbalance)
			d.Peak = max(d.Peak, imb)
		}
		d.Imbalance = append(d.Imbalance, imb)
		d.Bound = append(d.Bound, bound)
		d.NewPodsShare = append(d.NewPodsShare, newShare)
	}
	if lastData < 0 {
		return d
	}
	d.Last = d.Imbalance[lastData]
	from := lastData + 1 // the first bin of the stretch within the bound up to the end
	for i := lastData; i >= 0; i-- {
		if d.Bound[i] > 0 && d.Imbalance[i] > d.Bound[i] {
			break
		}
		from = i
	}
	if from <= lastData {
		d.Decayed = true
		d.DecaySeconds = max(0, secs(int64(d.FromBin+from)*rq.bin-f.at))
	}
	return d
}

// findings says what a followed port's figures show, in sentences.
func (w *world) findings(fi int, ll *report.LongLived) []string {
	f := w.rq.follow[fi]
	b := ll.Before
	when := "over the run"
	if ll.Scale != nil {
		when = fmt.Sprintf("before the scale event (%s-%s)", time.Duration(b.FromSeconds*1e9), time.Duration(b.ToSeconds*1e9))
	}
	verdict := func(s report.Spread) string {
		if s.Even {
			return "are even"
		}
		return "are not"
	}
	rs := b.Requests
	first := fmt.Sprintf("%s over %d pods, connections %s (busiest pod %.2f × its fair share; spreading these connections at random stays within %.2f) and requests %s (%.2f ×; balancing each request on its own stays within %.2f",
		when, len(b.Pods), verdict(b.Connections), b.Connections.MaxOverFair, b.Connections.Bound, verdict(rs), rs.MaxOverFair, rs.Bound)
	if rs.ConnectionBound > 0 {
		first += fmt.Sprintf(", spreading their connections at random within %.2f", rs.ConnectionBound)
	}
	first += fmt.Sprintf("); requests in flight %.2f × over the window, bin by bin %.3f × on average (p95 %.3f)", b.InFlight.MaxOverFair, b.PerBin.InFlightMean, b.PerBin.InFlightP95)
	if b.Connections.Even && !rs.Even {
		first = "connections are even, requests are not: " + first
	}
	out := []string{first}
	if len(b.Pods) == 0 {
		out = nil // an empty window (a scale event at 0)
	}
	d := ll.Scale
	if d == nil {
		return out
	}
	s := fmt.Sprintf("after the scale to %d replicas at %s (%d → %d pods), the busiest pod took %.2f × its fair share of requests", d.Replicas, time.Duration(d.AtSeconds*1e9), d.PodsBefore, d.PodsAfter, d.Peak)
	if len(d.NewPods) > 0 && len(d.NewPodsShare) > 0 {
		s += fmt.Sprintf(" (the %d new pods %.1f %% of them in the first bin, against %.1f %% fair)", len(d.NewPods), 100*d.NewPodsShare[0], 100*float64(len(d.NewPods))/float64(max(1, d.PodsAfter)))
	}
	ages := w.followedAges(f)
	if d.Decayed {
		s += fmt.Sprintf("; it came within the even-spread bound after %s and stayed there (%s)", time.Duration(d.DecaySeconds*1e9).Round(time.Millisecond), ages)
	} else {
		s += fmt.Sprintf("; it never came back within the even-spread bound: %.2f × in the last bin, %s after the event (%s)", d.Last, time.Duration(w.tr.span-f.at).Round(time.Millisecond), ages)
	}
	return append(out, s)
}

// followedAges names the connection lifetimes of the groups sending to a
// followed port.
func (w *world) followedAges(f followed) string {
	var out []string
	for _, g := range w.rq.groups {
		if !slices.Contains(f.groups, g.name) {
			continue
		}
		switch {
		case g.size == 0:
			out = append(out, g.name+": a connection per request")
		case g.maxAge == 0:
			out = append(out, g.name+": pooled, no maximum connection age")
		default:
			out = append(out, fmt.Sprintf("%s: pooled, maxAge %s", g.name, time.Duration(g.maxAge)))
		}
	}
	return strings.Join(out, "; ")
}

// requestNotes states how the clients with requests are modelled (none
// without any).
func (w *world) requestNotes() []string {
	if w.rq == nil {
		return nil
	}
	return []string{
		"clients with requests: a pool's connections open at the start of the run (each first lifetime a uniform fraction of one, as in a pool that has run for a while; each later one maxAge × a uniform factor in [0.9, 1.1], replaced at once), or one connection per request lasting the request; every one is a new connection through conntrack and the mode's engine, like any other",
		"requests never reach the dataplane: Poisson arrivals per client, each rides a connection of its pool (round-robin, or least-busy: the fewest requests in flight) to the pod that connection reached; they are replayed from their own random stream, the same in every mode",
		"IPVS lc, wlc, sed and nq count connections (activeconns × 256 + inactconns in lc), never requests: a pooled connection is one active connection whatever it carries, so these schedulers balance connections; they see request durations only when each request is a connection of its own. A pod added by a scale-up starts with no inactive (TIME_WAIT, 120 s) connections: with a connection per request, lc sends it every new connection until its count catches up with its peers', about half of TIME_WAIT, then the older pods, whose TIME_WAITs have expired, get them",
		"a pooled connection whose pod leaves the API (scale-down, deletion, not ready) is not reset, as the pod's end would reset it in a cluster: it keeps its endpoint until its age ends, and its requests are counted as stale, out of the shares",
		"even-spread bound: " + boundRule + fmt.Sprintf(", α = %g; time bins of %s", balanceAlpha, time.Duration(w.rq.bin)),
	}
}
