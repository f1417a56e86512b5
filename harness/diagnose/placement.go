package diagnose

// Placement under externalTrafficPolicy Local. Each node sends the
// connections that reach it from outside to its own endpoints only, and a
// node's dump shows only the connections that entered there. A load
// balancer that spreads evenly over the nodes with a local endpoint (the
// ones whose health check node port answers) gives each of those N nodes
// 1/N, which the node's rules split evenly over its k local pods: each
// pod's share is 1/(N·k). Pods alone on their node are hot, pods that
// share one are cold: the cause is placement, not the rules.
//
// With the dumps of several nodes (Options.Peers) the counts say which it
// is: each node's split is tested as any split (the rules' shares, then
// the counts: a skew there is the rules' or the traffic's); the nodes'
// totals are held against an even balancer (and against one that weighs
// nodes by their pods, which evens the pods out); each pod's count is
// compared with what its node's share predicts. With one dump the API's
// placement (--api) gives the other nodes' pods: the prediction, and this
// node's split tested.

import (
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/harness/stats"
)

// Placement findings and causes.
const (
	KindLocalPlacement   = "local-placement"
	KindUnevenBalancer   = "uneven-balancer"
	KindWeightedBalancer = "balancer-weighs-pods"
	// AboutBalancer: what the node's rules cannot explain lies with the
	// balancer in front of the nodes (its split over them).
	AboutBalancer = "balancer"
)

// PlacementReport is one externalTrafficPolicy Local service port over
// the nodes.
type PlacementReport struct {
	Port string `json:"port"`
	Key  string `json:"key"`
	// Nodes with a local endpoint (N of them) and the dumped ones.
	Nodes []*NodeShare `json:"nodes"`
	Pods  []*PodShare  `json:"pods"`
	// Counted: the dumps carry counts; Total is their outside
	// connections over the dumped nodes.
	Counted bool   `json:"counted"`
	Total   uint64 `json:"total"`
	// Balancer is how the nodes' totals compare: "even", "weighted by
	// local pods", "uneven", or "" (fewer than two dumped nodes with
	// counts); EvenP and WeightedP the chi-square p-values.
	Balancer  string `json:"balancer,omitempty"`
	EvenP     Float  `json:"evenP"`
	WeightedP Float  `json:"weightedP"`
	// ExpectedRatio is the busiest pod's share over the idlest's that
	// placement predicts under an even balancer (the most pods on a node
	// over the fewest); ObservedRatio the dumped pods'.
	ExpectedRatio Float `json:"expectedRatio"`
	ObservedRatio Float `json:"observedRatio"`
	// Cause names what makes the pods' shares uneven: "placement",
	// "balancer", "rules" (a node's split is not even), "none".
	Cause   string `json:"cause"`
	Message string `json:"message"`
}

// NodeShare is one node of a placement.
type NodeShare struct {
	Node string `json:"node"`
	Pods int    `json:"pods"`
	// Dumped: the node's rules are in a dump; From names it.
	Dumped bool   `json:"dumped"`
	From   string `json:"from,omitempty"`
	// Connections are the outside connections its rules counted.
	Connections uint64 `json:"connections"`
	// Expected is 1/N (0 without a local endpoint); Share the observed
	// share of the dumped nodes' total, with a simultaneous interval.
	Expected float64 `json:"expected"`
	Share    Float   `json:"share"`
	Lo       Float   `json:"lo"`
	Hi       Float   `json:"hi"`
	// Verdict is the node's own split's verdict.
	Verdict string `json:"verdict,omitempty"`
}

// PodShare is one local endpoint.
type PodShare struct {
	Addr netip.AddrPort `json:"addr"`
	Node string         `json:"node"`
	// Expected is 1/(N·k) of all the Service's outside connections;
	// ExpectedHere the same among the dumped nodes (their total).
	Expected     float64 `json:"expected"`
	ExpectedHere float64 `json:"expectedHere"`
	Observed     uint64  `json:"observed"`
	Share        Float   `json:"share"`
	Lo           Float   `json:"lo"`
	Hi           Float   `json:"hi"`
}

// localNode is one dumped node's Local split of a port.
type localNode struct {
	node, file string
	pods       []netip.AddrPort
	counts     []uint64
	counted    bool
	verdict    string
	fair       bool // the rules' shares are even and the counts fit them
}

// peers reads the other nodes' dumps: their Local external splits join
// this report (tests, findings named by node) for the placement.
func (r *Report) peers(opt Options) {
	for _, pe := range opt.Peers {
		node := pe.Node
		if node == "" && r.api != nil {
			node, _ = inferNode(pe.Dump, r.api)
		}
		if node == "" {
			node = filepath.Base(pe.Dump.File)
		}
		r.Peers = append(r.Peers, node+"="+pe.Dump.File)
		sub := &Report{File: pe.Dump.File, Counters: pe.Dump.Counters, Alpha: r.Alpha, MDE: r.MDE, Node: node, api: r.api, apiCache: r.apiPorts(), Findings: []*Finding{}}
		for _, p := range pe.Dump.Ports {
			sub.Ports = append(sub.Ports, newPortReport(p))
		}
		sub.externals(pe.Dump, nil)
		for _, xr := range sub.External {
			if xr.Policy != "Local" {
				continue
			}
			splits := xr.own
			if xr.Split != nil {
				splits = []*PortReport{xr.Split}
			}
			r.peerExternal = append(r.peerExternal, xr)
			for _, pr := range splits {
				if xr.Split == nil {
					pr.onNode = node
				}
				r.peerSplits = append(r.peerSplits, pr)
				if r.api != nil {
					if ap := r.apiPorts()[xr.Key]; ap != nil {
						compareEndpoints(r, pr, ap, node, "", pe.Dump.Mode, true)
					}
				}
			}
		}
	}
}

// placement makes a PlacementReport per Local service port seen on this
// node or a peer.
func (r *Report) placement() {
	groups := map[string][]*localNode{}
	names := map[string]string{}
	var keys []string
	for _, xr := range append(slices.Clone(r.External), r.peerExternal...) {
		if xr.Policy != "Local" {
			continue
		}
		ln := r.localNodeOf(xr)
		if ln == nil {
			continue
		}
		if groups[xr.Key] == nil {
			keys = append(keys, xr.Key)
		}
		groups[xr.Key] = append(groups[xr.Key], ln)
		names[xr.Key] = xr.Port
	}
	if r.Before != "" && len(r.peerExternal) > 0 {
		r.add(LevelNote, KindCountersReset, nil, "this node's counts run from --before, the other nodes' from their rules' writing: the placement compares unlike intervals (give the nodes' dumps without --before, or all taken at the same times)")
	}
	for _, k := range keys {
		// One node known (one dump, no API, no peers): nothing to compare.
		if pl := r.placeOne(k, names[k], groups[k]); len(pl.Nodes) > 1 {
			r.Placement = append(r.Placement, pl)
		}
	}
}

// localNodeOf reads one node's Local split: the split of its own, else
// (IPVS) the virtual servers' ports of its entries.
func (r *Report) localNodeOf(xr *ExternalReport) *localNode {
	node := xr.Node
	if node == "" {
		node = "this node (" + filepath.Base(r.File) + ")"
	}
	ln := &localNode{node: node, file: xr.file, fair: true}
	var most uint64
	add := func(pr *PortReport) {
		for _, e := range pr.Endpoints {
			i := slices.Index(ln.pods, e.Addr)
			if i < 0 {
				ln.pods, ln.counts = append(ln.pods, e.Addr), append(ln.counts, 0)
				i = len(ln.pods) - 1
			}
			ln.counts[i] += e.Observed
		}
		ln.counted = pr.counted(r)
		ok := pr.RulesFair && pr.Verdict != "skewed"
		if ln.verdict == "" || pr.N > most || (!ok && ln.fair) {
			ln.verdict, most = pr.Verdict, pr.N // the busiest entry's, or the first that is not even
		}
		ln.fair = ln.fair && ok
	}
	switch {
	case xr.Split != nil:
		add(xr.Split)
	default:
		for _, pr := range xr.own {
			add(pr)
		}
	}
	if len(ln.pods) == 0 && xr.path != nil && len(xr.path.Endpoints) > 0 {
		return nil
	}
	return ln
}

// placeOne is the placement of one port over the dumped nodes and the
// API's.
func (r *Report) placeOne(key, name string, dumped []*localNode) *PlacementReport {
	pl := &PlacementReport{Port: name, Key: key, EvenP: nan, WeightedP: nan, ExpectedRatio: nan, ObservedRatio: nan}
	r.placementNodes(pl, dumped)
	if len(pl.Nodes) < 2 {
		return pl
	}
	r.placementCounts(pl, dumped)
	r.placementCause(pl, dumped)
	return pl
}

// placementNodes lists the nodes (the API's, then dumped ones it lacks)
// with their local pods and the shares an even balancer gives them.
func (r *Report) placementNodes(pl *PlacementReport, dumped []*localNode) {
	byNode := map[string]*localNode{}
	for _, ln := range dumped {
		byNode[ln.node] = ln
	}
	var apiEps []apiEndpoint
	var order []string
	if r.api != nil {
		if ap := r.apiPorts()[pl.Key]; ap != nil {
			apiEps = ap.eps
		}
		for _, n := range r.api.Nodes {
			order = append(order, n.Name)
		}
		slices.Sort(order)
	}
	for _, ln := range dumped {
		if !slices.Contains(order, ln.node) {
			order = append(order, ln.node)
		}
	}
	for _, n := range order {
		ns := &NodeShare{Node: n, Share: nan, Lo: nan, Hi: nan}
		if ln := byNode[n]; ln != nil {
			ns.Dumped, ns.From, ns.Pods, ns.Verdict = true, ln.file, len(ln.pods), ln.verdict
			for i, ap := range ln.pods {
				ns.Connections += ln.counts[i]
				pl.Pods = append(pl.Pods, &PodShare{Addr: ap, Node: n, Observed: ln.counts[i], Share: nan, Lo: nan, Hi: nan})
			}
		} else {
			local := localSet(apiEps, n)
			if len(local) == 0 {
				continue
			}
			ns.Pods = len(local)
			for _, e := range local {
				pl.Pods = append(pl.Pods, &PodShare{Addr: e.addr, Node: n, Share: nan, Lo: nan, Hi: nan})
			}
		}
		pl.Nodes = append(pl.Nodes, ns)
	}
	withPods, kmin, kmax := 0, math.MaxInt, 0
	for _, ns := range pl.Nodes {
		if ns.Pods > 0 {
			withPods++
			kmin, kmax = min(kmin, ns.Pods), max(kmax, ns.Pods)
		}
	}
	for _, ns := range pl.Nodes {
		if ns.Pods > 0 {
			ns.Expected = 1 / float64(withPods)
		}
	}
	for _, ps := range pl.Pods {
		if k := podsOn(pl, ps.Node); k > 0 {
			ps.Expected = 1 / float64(withPods*k)
		}
	}
	if withPods > 0 {
		pl.ExpectedRatio = Float(float64(kmax) / float64(kmin))
	}
}

func podsOn(pl *PlacementReport, node string) int {
	for _, ns := range pl.Nodes {
		if ns.Node == node {
			return ns.Pods
		}
	}
	return 0
}

// placementCounts fills the observed shares of the dumped nodes and pods
// (of the dumped nodes' total), their intervals, the observed ratio and
// the balancer's tests (even; weighted by local pods).
func (r *Report) placementCounts(pl *PlacementReport, dumped []*localNode) {
	var nodes []*NodeShare
	for _, ns := range pl.Nodes {
		if ns.Dumped && ns.Pods > 0 {
			nodes = append(nodes, ns)
		}
	}
	for _, ln := range dumped {
		if !ln.counted {
			return
		}
	}
	var totals, weights []float64
	for _, ns := range nodes {
		pl.Total += ns.Connections
		totals, weights = append(totals, float64(ns.Connections)), append(weights, float64(ns.Pods))
	}
	if pl.Total == 0 {
		return
	}
	pl.Counted = true
	t := float64(pl.Total)
	lo, hi := stats.SimultaneousIntervals(totals, 1-r.Alpha)
	for i, ns := range nodes {
		ns.Share, ns.Lo, ns.Hi = Float(totals[i]/t), Float(lo[i]), Float(hi[i])
	}
	var pods []*PodShare
	var counts []float64
	for _, ps := range pl.Pods {
		if k := podsOn(pl, ps.Node); k > 0 && slices.Contains(nodes, nodeShare(pl, ps.Node)) {
			ps.ExpectedHere = 1 / float64(len(nodes)*k)
			pods, counts = append(pods, ps), append(counts, float64(ps.Observed))
		}
	}
	plo, phi := stats.SimultaneousIntervals(counts, 1-r.Alpha)
	smin, smax := math.Inf(1), 0.0
	for i, ps := range pods {
		s := counts[i] / t
		ps.Share, ps.Lo, ps.Hi = Float(s), Float(plo[i]), Float(phi[i])
		smin, smax = min(smin, s), max(smax, s)
	}
	if len(pods) > 1 && smin > 0 {
		pl.ObservedRatio = Float(smax / smin)
	}
	if len(nodes) < 2 {
		return
	}
	if c, err := stats.ChiSquareGOF(totals, normalise(slices.Repeat([]float64{1}, len(nodes)))); err == nil {
		pl.EvenP = Float(c.P)
	}
	if c, err := stats.ChiSquareGOF(totals, normalise(weights)); err == nil {
		pl.WeightedP = Float(c.P)
	}
	switch {
	case pl.EvenP.Valid() && float64(pl.EvenP) > r.Alpha:
		pl.Balancer = "even"
	case pl.WeightedP.Valid() && float64(pl.WeightedP) > r.Alpha:
		pl.Balancer = "weighted by local pods"
	default:
		pl.Balancer = "uneven"
	}
}

func nodeShare(pl *PlacementReport, node string) *NodeShare {
	for _, ns := range pl.Nodes {
		if ns.Node == node {
			return ns
		}
	}
	return nil
}

// placementCause names the cause of the pods' uneven shares and adds
// the explanation or finding that says it.
func (r *Report) placementCause(pl *PlacementReport, dumped []*localNode) {
	label := pl.Port + " (external, Local)"
	var bad []string
	for _, ln := range dumped {
		if !ln.fair {
			bad = append(bad, fmt.Sprintf("%s (%s)", ln.node, ln.verdict))
		}
	}
	placed := placementWords(pl)
	switch {
	case len(bad) > 0:
		pl.Cause = "rules"
		pl.Message = fmt.Sprintf("the split inside %s is not even (see its findings): the rules or the traffic they get skew the pods, whatever the placement (%s)", strings.Join(bad, ", "), placed)
	case pl.Balancer == "uneven":
		pl.Cause = "balancer"
		pl.Message = fmt.Sprintf("the nodes' rules split their own connections evenly, but the balancer in front of them does not spread evenly over the nodes with a local endpoint, nor by their pods: %s (even: chi-square p = %.3g; weighted by pods: p = %.3g); %s",
			nodeShareWords(pl), float64(pl.EvenP), float64(pl.WeightedP), placed)
		f := r.add(LevelFinding, KindUnevenBalancer, nil, pl.Message)
		f.Port, f.About = label, AboutBalancer
		return
	case pl.Balancer == "weighted by local pods":
		pl.Cause = "none"
		pl.Message = fmt.Sprintf("the balancer sends each node connections in proportion to its local pods (%s; even: p = %.3g, weighted: p = %.3g), so every pod gets about the same share whatever the placement (%s)",
			nodeShareWords(pl), float64(pl.EvenP), float64(pl.WeightedP), placed)
		r.add(LevelExplanation, KindWeightedBalancer, nil, pl.Message).Port = label
		return
	case float64(pl.ExpectedRatio) > 1:
		pl.Cause = "placement"
		pl.Message = placementMessage(pl, placed)
		r.add(LevelExplanation, KindLocalPlacement, nil, pl.Message).Port = label
		return
	default:
		pl.Cause = "none"
		pl.Message = "every node with a local endpoint has as many pods: an even balancer gives every pod the same share (" + placed + ")"
	}
}

// placementWords lists the nodes' local pods: "node-a 1 pod, node-b 2, node-c 3".
func placementWords(pl *PlacementReport) string {
	var parts []string
	for _, ns := range pl.Nodes {
		w := fmt.Sprintf("%s %d", ns.Node, ns.Pods)
		if len(parts) == 0 {
			w += " pod"
			if ns.Pods != 1 {
				w += "s"
			}
		}
		parts = append(parts, w)
	}
	return strings.Join(capList(parts), ", ")
}

func nodeShareWords(pl *PlacementReport) string {
	var parts []string
	for _, ns := range pl.Nodes {
		if ns.Share.Valid() {
			parts = append(parts, fmt.Sprintf("%s %.3f", ns.Node, float64(ns.Share)))
		}
	}
	return strings.Join(capList(parts), ", ")
}

// placementMessage says why the pods' shares differ under an even
// balancer: placement, with the numbers that show it.
func placementMessage(pl *PlacementReport, placed string) string {
	n := 0
	var per []string
	for _, ns := range pl.Nodes {
		if ns.Pods > 0 {
			n++
			per = append(per, fmt.Sprintf("%s %.3f", ns.Node, ns.Expected/float64(ns.Pods)))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "externalTrafficPolicy Local: each node sends the connections that reach it to its own pods only, so a pod's share is its node's share over its node's pods (%s). An even balancer over the %d nodes with a local endpoint gives each 1/%d", placed, n, n)
	if pl.Balancer == "even" {
		fmt.Fprintf(&b, " (observed %s; chi-square p = %.3g)", nodeShareWords(pl), float64(pl.EvenP))
	}
	fmt.Fprintf(&b, ", so each pod should get: %s; busiest/idlest pod %.2f from placement", strings.Join(capList(per), ", "), float64(pl.ExpectedRatio))
	if pl.ObservedRatio.Valid() {
		fmt.Fprintf(&b, ", %.2f observed over the dumped nodes", float64(pl.ObservedRatio))
	}
	if pl.Counted {
		b.WriteString(". Each dumped node's rules split its connections evenly (its test passes)")
	} else {
		b.WriteString(". Each dumped node's rules give its pods equal shares (no counts to test)")
	}
	b.WriteString(". Cause: placement (pods per node), not the rules; spreading the pods evenly over the nodes, or externalTrafficPolicy Cluster (which hides the client's address), evens the load")
	return b.String()
}
