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
// calibration if there is one, else zero (instant syncs).
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
	in := make([]cost.ServicePortInput, len(w.svcs)) // refilled per node
	names, eps := make([]string, nn), make([][]*cluster.Endpoint, len(w.svcs))
	for ni, n := range w.nodes {
		names[ni] = n.name
	}
	for s := range w.svcs {
		eps[s] = w.gvs[w.svcs[s].gvs[0]].eps
	}
	locals := cost.Locals(names, eps)
	for ni := range w.nodes {
		for s := range w.svcs {
			r := md.ruleAt(int(w.svcs[s].gvs[0]), ni)
			in[s] = r.CostInput(w.svcs[s].name)
		}
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

// firstPacket is the rules a new connection's first packet walks. In
// iptables mode it is linear in the Service's position in KUBE-SERVICES
// (sim/cost); the figure is the worst node's, weighted by the node's
// connections. nftables and IPVS look the Service up in a hash.
func (w *world) firstPacket(mi int, res []*nodeResult) report.FirstPacket {
	md := w.modes[mi]
	switch md.mode {
	case engine.NFTables:
		return report.FirstPacket{RulesP50: 5, RulesP99: 5, Note: "constant: one service-ips verdict-map lookup, the service chain (masquerade check, numgen vmap) and the endpoint chain (masquerade check, dnat); affinity adds one set lookup per endpoint"}
	case engine.IPVS:
		return report.FirstPacket{RulesP50: 2, RulesP99: 2, Note: "constant: KUBE-SERVICES matches the KUBE-CLUSTER-IP ipset (a hash), then IPVS finds the virtual server in its hash table"}
	}
	var fp report.FirstPacket
	for _, nr := range res {
		fp.RulesP50 = max(fp.RulesP50, nr.fp.RulesP50)
		fp.RulesP99 = max(fp.RulesP99, nr.fp.RulesP99)
		fp.Note = nr.fp.Note
	}
	return fp
}

// firstPacketNode is one node's iptables first-packet figures, weighted by
// its new connections per service port (computed before the node's
// counts are folded).
func (w *world) firstPacketNode(mi, ni int, nr *nodeResult, wk *worker) report.FirstPacket {
	md := w.modes[mi]
	if md.mode != engine.IPTables {
		return report.FirstPacket{}
	}
	// The inputs are megabytes at 30,000 service ports: the worker's,
	// reused from node to node.
	in := take(&wk.fpIn, len(w.svcs))
	weights := take(&wk.fpWeights, len(w.svcs))
	defer func() { wk.fpIn, wk.fpWeights = in, weights }()
	total := 0.0
	for s := range w.svcs {
		sv := &w.svcs[s]
		in[s] = md.ruleAt(int(sv.gvs[0]), ni).CostInput(sv.name)
		for _, g := range sv.gvs {
			weights[s] += float64(nr.gv[g].Total - nr.gv[g].Established)
		}
		total += weights[s]
	}
	ws := weights
	if total == 0 {
		ws = nil
	}
	f := cost.IPTablesFirstPacket(in, ws)
	return report.FirstPacket{RulesP50: f.RulesP50, RulesP99: f.RulesP99,
		Note: f.Note + "; KUBE-SERVICES in service-port name order; the worst node's quantiles over its new connections"}
}
