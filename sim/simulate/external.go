package simulate

// Traffic from outside the cluster. A client group with where: external
// connects through a node port, an external IP or a load balancer; where it
// enters the cluster is a node, and that node's rules for the destination
// decide (engine.RenderExternal; the oracle's ExpectFrom for a client
// standing outside). Each (service port, destination) pair is an entry of
// its own beside the service port's cluster IP entry (svcInfo.via, base),
// with the same versions, its own engine per node and its own counters, so
// the per-node runs, the checks against the oracle and the engine
// self-check treat it as they treat a cluster IP.
//
// Node ports and external IPs: the connections are spread evenly over the
// client's nodes, like pod clients' (static shares). A load balancer
// spreads them evenly over the nodes whose health check passes as it last
// saw them: it probes each node every interval (from a phase drawn per node
// and Service), takes a node out after unhealthyThreshold failed probes in
// a row and puts it back after healthyThreshold passed ones. A node's
// health check node port answers 503 when it has no ready local endpoint
// of an externalTrafficPolicy Local Service (oracle.ExpectHealthCheck),
// taken at the API write (kube-proxy updates it at the end of the next
// sync, a few milliseconds later, which the report's exposure window
// measures); a Cluster Service's nodes always pass. Between a node losing
// its last local endpoint and the balancer noticing, its share still comes:
// the health-check lag, whose connections the node drops (ipvs: forwards to
// other nodes' endpoints without SNAT, whose replies are lost).

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// extPlan is the external clients resolved against the cluster.
type extPlan struct {
	clients []*extClient
	// byEntry lists the clients of each external entry.
	byEntry map[int32][]int
}

// extClient is one external client group.
type extClient struct {
	name string
	// idx is its index in traffic.clients.
	idx int
	via cluster.Via
	// targets are the entries it sends to and their shares (summing to 1).
	targets []int32
	weights []float64
	nodes   []int
	// base and count are its source addresses (cluster.externalNetwork).
	base, count uint32
	// conns is its number of connections (load balancer clients; the
	// others are in the nodes' static shares).
	conns int64
	hc    *scenario.HealthCheck
	lb    *lbPlan
	// group is its index in trafficPlan.groups.
	group int32
}

// entryVia is the destination an external client's connection to service
// port sp has: a load balancer sends to the Service's load-balancer IP
// when it has one (ipMode VIP), else to its node port; false when sp
// cannot be reached through via.
func entryVia(sp *cluster.ServicePort, via cluster.Via) (cluster.Via, bool) {
	switch via {
	case cluster.ViaNodePort:
		return via, sp.NodePort != 0
	case cluster.ViaExternalIP:
		return via, len(sp.ExternalIPs) > 0
	case cluster.ViaLoadBalancer:
		if len(sp.LoadBalancerIPs) > 0 {
			return via, true
		}
		return cluster.ViaNodePort, sp.NodePort != 0
	}
	return "", false
}

// addExternalEntries resolves every external client's targets to external
// entries, adding each (service port, destination) entry once with the
// service port's initial version. It runs after the cluster IP entries
// exist and before the timeline's versions are added.
func (w *world) addExternalEntries() error {
	t := w.sc.Traffic
	if t == nil {
		return nil
	}
	idx := map[[2]int32]int32{}
	for i, c := range t.Clients {
		if c.Where != cluster.Outside {
			continue
		}
		if w.ext == nil {
			w.ext = &extPlan{byEntry: map[int32][]int{}}
			w.extOf = make([][]int32, w.nBase)
		}
		ec, err := w.externalClient(i, c, idx)
		if err != nil {
			return err
		}
		for _, x := range ec.targets {
			w.ext.byEntry[x] = append(w.ext.byEntry[x], len(w.ext.clients))
		}
		w.ext.clients = append(w.ext.clients, ec)
	}
	return nil
}

// externalClient resolves one external client: its targets (every Service
// reachable through its via when it names none; each Service an equal
// share split over its reachable ports), its nodes and its addresses.
func (w *world) externalClient(i int, c scenario.Client, idx map[[2]int32]int32) (*extClient, error) {
	ec := &extClient{name: c.Name, idx: i, via: c.Via, hc: c.HealthCheck}
	perService := map[string][]int32{}
	var order []string
	for b := range w.nBase {
		sv := &w.svcs[b]
		sp := w.gvs[sv.gvs[0]].sp
		if !matchesTarget(c, sv.name) {
			continue
		}
		via, ok := entryVia(sp, c.Via)
		if !ok {
			continue
		}
		key := sv.name.NamespacedName.String()
		if _, seen := perService[key]; !seen {
			order = append(order, key)
		}
		perService[key] = append(perService[key], w.externalEntry(b, via, idx))
	}
	cp := fmt.Sprintf("traffic.clients[%d]", i)
	for j, target := range c.Services {
		svc, _, _ := strings.Cut(target, ":")
		if len(perService[svc]) == 0 {
			return nil, w.inputError(fmt.Sprintf("%s.services[%d]", cp, j), "%s has no %sservice port reachable through %s (it has no %s)", target, protoWord(c.Protocol), c.Via, viaNeeds[c.Via])
		}
	}
	if len(order) == 0 {
		return nil, w.inputError(cp+".via", "no %sService is reachable through %s: none has a %s", protoWord(c.Protocol), c.Via, viaNeeds[c.Via])
	}
	for _, key := range order {
		for _, x := range perService[key] {
			ec.targets = append(ec.targets, x)
			ec.weights = append(ec.weights, 1/float64(len(order))/float64(len(perService[key])))
		}
	}
	ec.nodes = w.nodeIndexes(c.Nodes)
	return ec, nil
}

// viaNeeds is what a service port needs to be reached through a via.
var viaNeeds = map[cluster.Via]string{cluster.ViaNodePort: "node port", cluster.ViaExternalIP: "external IP", cluster.ViaLoadBalancer: "load-balancer IP or node port"}

// inputError is a problem of the scenario found once it was expanded (a
// generated Service's node port depends on the draws), located at its
// field: bad input (exit 2), like validation's.
func (w *world) inputError(path, format string, a ...any) error {
	e := &scenario.FieldError{Field: path, Message: fmt.Sprintf(format, a...)}
	if w.loaded != nil {
		e.File, e.Pos = w.loaded.File, w.loaded.PosOf(path)
	}
	return scenario.ErrorList{e}
}

func protoWord(p string) string {
	if p == "" {
		return ""
	}
	return p + " "
}

// matchesTarget says whether a client's services and protocol select the
// service port.
func matchesTarget(c scenario.Client, n cluster.ServicePortName) bool {
	if c.Protocol != "" && string(n.Protocol) != c.Protocol {
		return false
	}
	if len(c.Services) == 0 {
		return true
	}
	for _, target := range c.Services {
		svc, port, hasPort := strings.Cut(target, ":")
		if n.NamespacedName.String() == svc && (!hasPort || n.Port == port) {
			return true
		}
	}
	return false
}

// externalEntry returns the entry of base's destination via, adding it
// with base's initial version the first time.
func (w *world) externalEntry(b int32, via cluster.Via, idx map[[2]int32]int32) int32 {
	key := [2]int32{b, int32(slices.Index(cluster.Vias(), via))}
	if x, ok := idx[key]; ok {
		return x
	}
	sv := &w.svcs[b]
	x := int32(len(w.svcs))
	w.svcs = append(w.svcs, svcInfo{name: sv.name, label: sv.label + " via " + string(via), proto: sv.proto, via: via, base: b})
	g := w.gvs[sv.gvs[0]]
	w.addVersion(x, -1, g.sp, g.eps)
	w.extOf[b] = append(w.extOf[b], x)
	idx[key] = x
	return x
}

// nodeIndexes are the named nodes' indexes, every node when none is named.
func (w *world) nodeIndexes(names []string) []int {
	var out []int
	for ni, n := range w.nodes {
		if len(names) == 0 || slices.Contains(names, n.name) {
			out = append(out, ni)
		}
	}
	return out
}

// externalSources gives each external client its block of addresses from
// cluster.externalNetwork, one after the other (wrapping around).
func (w *world) externalSources() error {
	if w.ext == nil {
		return nil
	}
	pfx, err := netip.ParsePrefix(w.sc.Cluster.ExternalNetwork)
	if err != nil || !pfx.Addr().Is4() {
		return fmt.Errorf("cluster.externalNetwork %q is not an IPv4 prefix", w.sc.Cluster.ExternalNetwork)
	}
	size := uint32(1) << (32 - pfx.Bits())
	first := ipv4Num(pfx.Masked().Addr()) + 1
	usable := max(1, size-2)
	next := uint32(0)
	for _, ec := range w.ext.clients {
		c := w.sc.Traffic.Clients[ec.idx]
		ec.count = uint32(min(int(usable), max(1, c.SourceIPs)))
		if next+ec.count > usable {
			next = 0
		}
		ec.base = first + next
		next += ec.count
	}
	return nil
}

func ipv4Num(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// healthAnswer is a node's health check node port for an entry's Service
// at one time: 200 or 503 (an externalTrafficPolicy Cluster Service's
// nodes always pass: the balancer checks kube-proxy's own health then).
type healthAnswer struct {
	at int64
	ok []bool // per node
}

// healthAnswers are the answers of every node for entry x's Service from
// the start, one per API write that changed one of the Service's ports.
func (w *world) healthAnswers(x int32) []healthAnswer {
	name := w.svcs[x].name.NamespacedName
	var ports []int32
	for b := range w.nBase {
		if w.svcs[b].name.NamespacedName == name {
			ports = append(ports, b)
		}
	}
	times := []int64{0}
	for _, b := range ports {
		for _, g := range w.svcs[b].gvs {
			if st := w.gvs[g].step; st >= 0 {
				times = append(times, w.steps[st].at)
			}
		}
	}
	slices.Sort(times)
	times = slices.Compact(times)
	var out []healthAnswer
	for _, t := range times {
		local := w.versionAt(x, t).sp.ExternalLocal
		epsByPort := make([][]*cluster.Endpoint, len(ports))
		for i, b := range ports {
			epsByPort[i] = w.versionAt(b, t).eps
		}
		a := healthAnswer{at: t, ok: make([]bool, len(w.nodes))}
		for ni, n := range w.nodes {
			a.ok[ni] = !local || oracle.ExpectHealthCheck(epsByPort, n.name).Status == 200
		}
		out = append(out, a)
	}
	return out
}

// versionAt is entry s's version in the API at time t.
func (w *world) versionAt(s int32, t int64) *gvInfo {
	gs := w.svcs[s].gvs
	cur := &w.gvs[gs[0]]
	for _, g := range gs[1:] {
		if gi := &w.gvs[g]; w.steps[gi.step].at <= t {
			cur = gi
		}
	}
	return cur
}

// mixExt separates the external plan's random streams from the traffic's.
const mixExt = 0x65787465726e616c // "external"

// probePhase is a uniform draw in [0, 1) from a stream of its own per key.
func probePhase(seed uint64, key uint64) float64 {
	return rand.New(rand.NewPCG(seed, mix(mixExt^key))).Float64()
}

// lbDuration is a health check's interval in virtual nanoseconds.
func lbDuration(h *scenario.HealthCheck) int64 {
	if h == nil || h.Interval == nil {
		return int64(scenario.DefaultHealthCheckInterval)
	}
	return int64(h.Interval.Duration)
}
