package simulate

// What the rules cost: each node's objects and sync times, and the rules a
// new connection's first packet walks.

import (
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/report"
)

// syncCosts counts each node's objects in the initial state and turns them
// into full and partial sync times: the caller's SyncTime if set, else the
// calibration if there is one, else zero (instant syncs). The counts come
// from the cluster IP entries (the service ports), each with its external
// destinations (cost.External, from its ServicePort): an external
// frontend's entry is traffic through objects its service port has.
func (w *world) syncCosts(md *modeData, cal cost.Calibration, ok bool, o Options) {
	nn := len(w.nodes)
	md.counts = make([]cost.Counts, nn)
	md.fullSync = make([]int64, nn)
	md.partSync = make([]int64, nn)
	var model cost.Model
	if ok && o.SyncTime == nil {
		var err error
		// Calibrations() has fitted every calibration once already.
		if model, err = cost.NewModel(cal); err != nil {
			ok = false
			md.cal = "none: " + err.Error()
		}
	}
	in := make([]cost.ServicePortInput, w.nBase) // refilled per node
	names, eps := make([]string, nn), make([][]*cluster.Endpoint, w.nBase)
	for ni, n := range w.nodes {
		names[ni] = n.name
	}
	for s := range w.nBase {
		eps[s] = w.gvs[w.svcs[s].gvs[0]].eps
	}
	locals := cost.Locals(names, eps)
	for ni := range w.nodes {
		w.costInputs(md, ni, in)
		c := cost.CountOn(md.name, in, locals[ni], true)
		md.counts[ni] = c
		switch {
		case o.SyncTime != nil:
			md.fullSync[ni] = int64(o.SyncTime(md.name, c.Objects, true))
			md.partSync[ni] = int64(o.SyncTime(md.name, c.Objects, false))
		case ok:
			// IPVS: Full is a sync into an empty kernel, Partial a
			// steady-state run (cost.Model).
			full, part := model.Full(c), model.Partial(c)
			md.fullSync[ni], md.partSync[ni] = seconds(full.Seconds), seconds(part.Seconds)
			if md.fullEst == nil || full.Seconds > md.fullEst.Seconds {
				md.fullEst, md.partEst = &full, &part
			}
		}
	}
}

// costInputs fills in (one per cluster IP entry, in KUBE-SERVICES order:
// service-port name order) with node ni's rules of each service port's
// initial version and its external destinations there (a load-balancer
// source range holding the node's address adds its rules:
// cost.External.FromNode).
func (w *world) costInputs(md *modeData, ni int, in []cost.ServicePortInput) {
	nd := &w.nodes[ni]
	for s := range w.nBase {
		sv := &w.svcs[s]
		g := &w.gvs[sv.gvs[0]]
		in[s] = md.ruleAt(int(sv.gvs[0]), ni).CostInput(sv.name)
		if g.sp != nil {
			engine.AddExternal(&in[s], md.mode, g.sp, g.eps, nd.name, nd.zone, nd.ip, engine.RenderOptions{})
		}
	}
}

// firstPacket is the rules a new connection's first packet walks
// (cost.FirstPackets): per path and over all of them, each figure the
// worst node's, weighted by the node's new connections. In iptables mode
// it is linear in the Service's position in KUBE-SERVICES, and node ports
// come after all of it; nftables and IPVS look the Service up in a hash.
func (w *world) firstPacket(mi int, res []*nodeResult) report.FirstPacket {
	var fp report.FirstPacket
	worst := func(p **cost.PathWalk, n *cost.PathWalk) {
		switch {
		case n == nil:
		case *p == nil:
			c := *n
			*p = &c
		default:
			(*p).RulesP50, (*p).RulesP99 = max((*p).RulesP50, n.RulesP50), max((*p).RulesP99, n.RulesP99)
		}
	}
	for _, nr := range res {
		fp.RulesP50 = max(fp.RulesP50, nr.fp.RulesP50)
		fp.RulesP99 = max(fp.RulesP99, nr.fp.RulesP99)
		worst(&fp.ClusterIP, nr.fp.ClusterIP)
		worst(&fp.NodePort, nr.fp.NodePort)
		worst(&fp.LoadBalancer, nr.fp.LoadBalancer)
		fp.Note = nr.fp.Note
	}
	return fp
}

// firstPacketNode is one node's first-packet figures, weighted by its new
// connections per entry (computed before the node's counts are folded):
// a cluster IP entry's on its service port's cluster IP, an external
// frontend's on its service port's node port, external IPs or
// load-balancer IPs.
func (w *world) firstPacketNode(mi, ni int, nr *nodeResult, wk *worker) report.FirstPacket {
	md := w.modes[mi]
	n := int(w.nBase)
	// The inputs are megabytes at 30,000 service ports: the worker's,
	// reused from node to node.
	in := take(&wk.fpIn, n)
	weights := take(&wk.fpWeights, 4*n)
	defer func() { wk.fpIn, wk.fpWeights = in, weights }()
	w.costInputs(md, ni, in)
	ws := &cost.Weights{ClusterIP: weights[:n]}
	total := 0.0
	for s := range w.svcs {
		sv := &w.svcs[s]
		var c float64
		for _, g := range sv.gvs {
			c += float64(nr.gv[g].Total - nr.gv[g].Established)
		}
		if c == 0 {
			continue
		}
		total += c
		b := int(sv.base)
		switch p := pathOf(sv.via, &in[b]); p {
		case cost.PathClusterIP:
			ws.ClusterIP[b] += c
		default:
			at := pathWeights(ws, p, weights, n)
			at[b] += c
		}
	}
	if total == 0 {
		ws = nil // no traffic: every destination alike
	}
	f := cost.FirstPackets(md.name, in, ws, true)
	return report.FirstPacket{RulesP50: f.RulesP50, RulesP99: f.RulesP99, ClusterIP: f.ClusterIP, NodePort: f.NodePort, LoadBalancer: f.LoadBalancer,
		Note: f.Note + "; the worst node's quantiles over its new connections"}
}

// pathOf is the cost model's path of an entry reached via v: a load
// balancer without a load-balancer IP sends to the node port.
func pathOf(v cluster.Via, in *cost.ServicePortInput) cost.Path {
	switch v {
	case cluster.ViaNodePort:
		return cost.PathNodePort
	case cluster.ViaExternalIP:
		return cost.PathExternalIP
	case cluster.ViaLoadBalancer:
		if in.External.LoadBalancerIPs == 0 {
			return cost.PathNodePort
		}
		return cost.PathLoadBalancer
	}
	return cost.PathClusterIP
}

// pathWeights is path p's part of buf (4n weights), set in ws on first use.
func pathWeights(ws *cost.Weights, p cost.Path, buf []float64, n int) []float64 {
	var at *[]float64
	switch p {
	case cost.PathNodePort:
		at = &ws.NodePort
	case cost.PathExternalIP:
		at = &ws.ExternalIP
	default:
		at = &ws.LoadBalancer
	}
	if *at == nil {
		*at = buf[int(p)*n : (int(p)+1)*n]
	}
	return *at
}
