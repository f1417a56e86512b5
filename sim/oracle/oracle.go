// Package oracle states what must happen to a new connection to a Service:
// which endpoints may receive it and with what probability, or that it is
// dropped or rejected, and, with ClientIP affinity, which endpoint a client
// must get and until when.
//
// It is written from the Kubernetes documentation (Virtual IPs and Service
// Proxies: traffic policies, traffic to terminating endpoints, session
// affinity; Topology Aware Routing; Service internal traffic policy) and
// from kube-proxy's documented per-mode differences, which it reports as
// Deviations rather than hiding them. It never imports dataplane/ nor the
// simulator's engines (design principle 1): the decision of which endpoints
// are eligible is made here, independently.
//
// Modes are cluster.Mode values; the empty mode is the documented behaviour
// without any mode's specifics.
package oracle

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// DefaultRecentCapacity is the number of client addresses one iptables
// `recent` list keeps (xt_recent ip_list_tot); kube-proxy's iptables mode
// keeps one list per endpoint.
const DefaultRecentCapacity = 100

// Kind is the kind of outcome.
type Kind int

// The kinds of outcome.
const (
	// Endpoints: the connection reaches one of Probs' endpoints.
	Endpoints Kind = iota
	// Drop: the packet is silently dropped.
	Drop
	// Reject: the client gets an ICMP error.
	Reject
)

// String is "ENDPOINTS", "DROP" or "REJECT".
func (k Kind) String() string {
	switch k {
	case Endpoints:
		return "ENDPOINTS"
	case Drop:
		return "DROP"
	case Reject:
		return "REJECT"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Outcome is the expected fate of a new connection.
type Outcome struct {
	Kind Kind
	// Probs maps each eligible endpoint ("ip:port") to the probability that
	// a new connection reaches it; nil unless Kind is Endpoints.
	Probs map[string]float64
	// Reason says in a sentence why, for reports.
	Reason string
	// Deviations name documented ways in which the mode's kube-proxy
	// departs from the documentation for this service port.
	Deviations []string
	// Source is the address the endpoints see as the connection's source
	// (Kind Endpoints only; SourceOf gives it per endpoint).
	Source Source
	// Client is the client's address when the outcome depends on it: a
	// connection that reaches the endpoint holding that address (a pod
	// reaching itself through its Service) is masqueraded, whatever Source
	// says (hairpin).
	Client netip.Addr
	// RepliesLost reports connections that reach an endpoint whose replies
	// cannot reach the client (the backend sees them; the client's
	// connection fails): IPVS's fallback without SNAT.
	RepliesLost bool
}

// Source is what a backend sees as a connection's source address.
type Source int

// The sources a backend can see.
const (
	// SourceClient is the client's own address.
	SourceClient Source = iota
	// SourceNode is an address of the node that decided the connection
	// (it was masqueraded).
	SourceNode
)

// String is "client" or "node".
func (s Source) String() string {
	if s == SourceNode {
		return "node"
	}
	return "client"
}

// SourceOf is the source the endpoint ("ip:port") sees: the node's address
// when the client reaches itself (hairpin), else Source.
func (o Outcome) SourceOf(endpoint string) Source {
	if o.Client.IsValid() {
		if ap, err := netip.ParseAddrPort(endpoint); err == nil && ap.Addr() == o.Client {
			return SourceNode
		}
	}
	return o.Source
}

// Endpoints lists the eligible endpoints, sorted.
func (o Outcome) Endpoints() []string {
	return slices.Sorted(maps.Keys(o.Probs))
}

// Allows reports whether a connection may reach the endpoint.
func (o Outcome) Allows(endpoint string) bool {
	_, ok := o.Probs[endpoint]
	return ok
}

// String is the outcome as kube-proxy's packet tracers print it: the
// endpoints joined by ", ", or "DROP" or "REJECT".
func (o Outcome) String() string {
	if o.Kind != Endpoints {
		return o.Kind.String()
	}
	return strings.Join(o.Endpoints(), ", ")
}

// Oracle holds the settings that change expectations.
type Oracle struct {
	// PreferSameNode says kube-proxy runs with the
	// PreferSameTrafficDistribution feature gate, so node hints count.
	PreferSameNode bool
	// IPVSScheduler is the ipvs scheduler ("" is rr); it only adds
	// deviations.
	IPVSScheduler string
	// RecentCapacity is ip_list_tot; 0 means DefaultRecentCapacity.
	RecentCapacity int
	// MasqueradeAll is kube-proxy's --masquerade-all: every connection to
	// a cluster IP is masqueraded.
	MasqueradeAll bool
}

// Expect is Oracle{}.Expect.
func Expect(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, clientNode, nodeZone string) Outcome {
	return Oracle{}.Expect(mode, sp, eps, clientNode, nodeZone)
}

// ExpectExternal is Oracle{}.ExpectExternal.
func ExpectExternal(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, node, nodeZone string) Outcome {
	return Oracle{}.ExpectExternal(mode, sp, eps, node, nodeZone)
}

// Expect gives the outcome of a new connection from a pod on clientNode
// (in zone nodeZone) to the service port's ClusterIP.
//
// The documentation's rules, in order:
//   - with internalTrafficPolicy Local only endpoints on the client's node
//     are eligible: the ready ones, or, if none is ready, the ones that are
//     serving and terminating; if there is none the traffic is dropped;
//   - with Cluster, the ready endpoints anywhere (narrowed by topology hints
//     when every ready endpoint carries them and some match this node), or,
//     if none is ready anywhere, every serving and terminating endpoint;
//   - a Service without any usable endpoint rejects the connection;
//   - the choice among eligible endpoints is uniform.
//
// ipvs departs from the Local rule (reported in Deviations): a service port
// reachable from outside (it has a node port) falls back to the cluster's
// endpoints; one that is not has no real server and rejects.
func (o Oracle) Expect(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, clientNode, nodeZone string) Outcome {
	name := sp.Name.String()
	var out Outcome
	switch {
	case !anyUsable(eps):
		out = Outcome{Kind: Reject, Reason: name + " has no usable endpoints"}
	case !sp.InternalLocal:
		out = uniform(o.clusterSet(eps, clientNode, nodeZone), name+": ready endpoints of the cluster")
	default:
		local := localSet(eps, clientNode)
		switch {
		case len(local) > 0:
			out = uniform(local, name+": endpoints on node "+clientNode+" (internalTrafficPolicy Local)")
		case mode == cluster.ModeIPVS && externallyAccessible(sp):
			out = uniform(o.clusterSet(eps, clientNode, nodeZone), name+": no endpoint on node "+clientNode+"; ipvs uses the cluster's")
			out.Deviations = append(out.Deviations, "ipvs: internalTrafficPolicy Local without a local endpoint falls back to the cluster's endpoints (kube-proxy PR #97081); the documentation says the traffic is dropped")
		case mode == cluster.ModeIPVS:
			out = Outcome{Kind: Reject, Reason: name + " has no endpoint on node " + clientNode + "; the ipvs virtual server has no real server"}
			out.Deviations = append(out.Deviations, "ipvs: internalTrafficPolicy Local without a local endpoint leaves the ClusterIP virtual server without real servers (the fallback of PR #97081 is empty for a service port not reachable from outside), so connections are rejected; the documentation says the traffic is dropped")
		default:
			out = Outcome{Kind: Drop, Reason: name + " has no endpoint on node " + clientNode + " (internalTrafficPolicy Local)"}
		}
	}
	out.Deviations = append(out.Deviations, o.modeDeviations(mode, sp, out)...)
	return out
}

// ExpectExternal gives the outcome of a connection from outside the
// cluster to a NodePort or LoadBalancer service port arriving at node:
// externalTrafficPolicy Local uses the node's endpoints (ready, else
// serving and terminating) and drops without one; Cluster uses the
// cluster's. In ipvs mode, Local without a local endpoint forwards to the
// cluster's endpoints without SNAT: they receive the connection, its
// replies do not reach the client (RepliesLost), a deviation.
func (o Oracle) ExpectExternal(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, node, nodeZone string) Outcome {
	name := sp.Name.String()
	if !anyUsable(eps) {
		return Outcome{Kind: Reject, Reason: name + " has no usable endpoints"}
	}
	if !sp.ExternalLocal {
		out := uniform(o.clusterSet(eps, node, nodeZone), name+": ready endpoints of the cluster")
		out.Deviations = o.modeDeviations(mode, sp, out)
		return out
	}
	local := localSet(eps, node)
	if len(local) > 0 {
		out := uniform(local, name+": endpoints on node "+node+" (externalTrafficPolicy Local)")
		out.Deviations = o.modeDeviations(mode, sp, out)
		return out
	}
	if mode == cluster.ModeIPVS {
		out := uniform(o.clusterSet(eps, node, nodeZone), name+": no endpoint on node "+node+"; ipvs forwards to the cluster's endpoints without SNAT")
		out.RepliesLost = out.Kind == Endpoints
		out.Deviations = append(out.Deviations, "ipvs: externalTrafficPolicy Local without a local endpoint forwards to the cluster's endpoints without SNAT, so replies do not reach the client; the documentation says the traffic is dropped")
		return out
	}
	return Outcome{Kind: Drop, Reason: name + " has no endpoint on node " + node + " (externalTrafficPolicy Local)"}
}

// ExpectShortCircuit gives the outcome of a connection from a pod or from
// the node itself to one of the service port's external addresses (its
// NodePort on this node, a load-balancer or external IP): kube-proxy
// short-circuits such traffic to the cluster's endpoints whatever the
// traffic policies, so it behaves as if the client were outside only in
// being masqueraded. In ipvs mode the external virtual servers keep their
// externalTrafficPolicy Local endpoints (falling back to the cluster's
// when the node has none), which departs from that when the node has some.
func (o Oracle) ExpectShortCircuit(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, node, nodeZone string) Outcome {
	name := sp.Name.String()
	if !anyUsable(eps) {
		return Outcome{Kind: Reject, Reason: name + " has no usable endpoints"}
	}
	if mode == cluster.ModeIPVS && sp.ExternalLocal {
		if local := localSet(eps, node); len(local) > 0 {
			out := uniform(local, name+": ipvs keeps the local endpoints of node "+node+" for its external addresses")
			out.Deviations = append(out.Deviations, "ipvs: traffic from pods or the node to an externalTrafficPolicy Local address is not short-circuited to the cluster's endpoints; it only reaches this node's")
			out.Deviations = append(out.Deviations, o.modeDeviations(mode, sp, out)...)
			return out
		}
	}
	out := uniform(o.clusterSet(eps, node, nodeZone), name+": short-circuited to the cluster's endpoints")
	out.Deviations = o.modeDeviations(mode, sp, out)
	return out
}

// ExpectShortCircuit is Oracle{}.ExpectShortCircuit.
func ExpectShortCircuit(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, node, nodeZone string) Outcome {
	return Oracle{}.ExpectShortCircuit(mode, sp, eps, node, nodeZone)
}

func (o Oracle) modeDeviations(mode cluster.Mode, sp *cluster.ServicePort, out Outcome) []string {
	if out.Kind != Endpoints {
		return nil
	}
	var d []string
	if sp.ClientIPAffinity {
		switch mode {
		case cluster.ModeIPTables:
			d = append(d, fmt.Sprintf("iptables: each endpoint's recent list keeps at most %d client addresses (xt_recent ip_list_tot); past that, affinity is lost for the least recently seen clients", o.recentCapacity()))
		case cluster.ModeIPVS:
			d = append(d, "ipvs: a persistence template is re-armed while the client's connections (TIME_WAIT included) remain, so affinity can outlast timeoutSeconds (kubernetes#89358)")
		}
	}
	if mode == cluster.ModeIPVS {
		switch o.IPVSScheduler {
		case "sh":
			d = append(d, "ipvs sh: the endpoint is a hash of the client address, so shares are uniform only over many clients")
		case "mh":
			d = append(d, "ipvs mh: the endpoint is a hash of the client address and port (Maglev), so shares are uniform only over many connections")
		case "dh":
			d = append(d, "ipvs dh: the endpoint is a hash of the ClusterIP, so every connection goes to one endpoint")
		}
	}
	return d
}

func (o Oracle) recentCapacity() int {
	if o.RecentCapacity > 0 {
		return o.RecentCapacity
	}
	return DefaultRecentCapacity
}

func uniform(eps []*cluster.Endpoint, reason string) Outcome {
	if len(eps) == 0 {
		return Outcome{Kind: Reject, Reason: reason + ": none"}
	}
	keys := map[string]bool{}
	for _, e := range eps {
		keys[e.String()] = true
	}
	p := make(map[string]float64, len(keys))
	for k := range keys {
		p[k] = 1 / float64(len(keys))
	}
	return Outcome{Kind: Endpoints, Probs: p, Reason: reason}
}

// usable: ready, or still serving while terminating (the documentation's
// "traffic to terminating endpoints").
func usable(e *cluster.Endpoint) bool { return e.Ready || (e.Serving && e.Terminating) }

func anyUsable(eps []*cluster.Endpoint) bool { return slices.ContainsFunc(eps, usable) }

func servingTerminating(e *cluster.Endpoint) bool { return !e.Ready && e.Serving && e.Terminating }

// localSet is the node's ready endpoints, or its serving-and-terminating
// ones when none of them is ready.
func localSet(eps []*cluster.Endpoint, node string) []*cluster.Endpoint {
	var ready, term []*cluster.Endpoint
	for _, e := range eps {
		if node == "" || e.NodeName != node {
			continue
		}
		if e.Ready {
			ready = append(ready, e)
		} else if servingTerminating(e) {
			term = append(term, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return term
}

// clusterSet is the cluster's ready endpoints, narrowed by topology, or,
// when none is ready, every serving-and-terminating endpoint.
func (o Oracle) clusterSet(eps []*cluster.Endpoint, node, zone string) []*cluster.Endpoint {
	var ready, term []*cluster.Endpoint
	for _, e := range eps {
		if e.Ready {
			ready = append(ready, e)
		} else if servingTerminating(e) {
			term = append(term, e)
		}
	}
	if len(ready) == 0 {
		return term
	}
	return o.topology(ready, node, zone)
}

// topology applies Topology Aware Routing: hints are used only when every
// ready endpoint has one; an endpoint set for this node (PreferSameNode,
// with its feature gate) comes first, then one for this node's zone; if
// the hints name neither, every ready endpoint is used.
func (o Oracle) topology(ready []*cluster.Endpoint, node, zone string) []*cluster.Endpoint {
	all := func(has func(*cluster.Endpoint) bool) bool {
		return !slices.ContainsFunc(ready, func(e *cluster.Endpoint) bool { return !has(e) })
	}
	pick := func(match func(*cluster.Endpoint) bool) []*cluster.Endpoint {
		var out []*cluster.Endpoint
		for _, e := range ready {
			if match(e) {
				out = append(out, e)
			}
		}
		return out
	}
	if o.PreferSameNode && all(func(e *cluster.Endpoint) bool { return len(e.NodeHints) > 0 }) {
		if s := pick(func(e *cluster.Endpoint) bool { return slices.Contains(e.NodeHints, node) }); len(s) > 0 {
			return s
		}
	}
	if zone != "" && all(func(e *cluster.Endpoint) bool { return len(e.ZoneHints) > 0 }) {
		if s := pick(func(e *cluster.Endpoint) bool { return slices.Contains(e.ZoneHints, zone) }); len(s) > 0 {
			return s
		}
	}
	return ready
}

func isUDP(sp *cluster.ServicePort) bool { return sp.Name.Protocol == corev1.ProtocolUDP }

// externallyAccessible says whether a service port has destinations other
// than its ClusterIP, as kube-proxy documents ServicePort.
// ExternallyAccessible: "a node port, load-balancer IPs or external IPs".
// The Service's type alone does not make a port reachable from outside: the
// API server gives NodePort and LoadBalancer ports their node ports (a
// LoadBalancer with allocateLoadBalancerNodePorts false has none), and a
// load balancer's address counts only once its controller wrote it into the
// status, in ipMode VIP (an ipMode Proxy balancer sends to the node ports).
func externallyAccessible(sp *cluster.ServicePort) bool {
	return sp.NodePort != 0 || len(sp.LoadBalancerIPs) > 0 || len(sp.ExternalIPs) > 0
}

// ExpectFrom gives the outcome of a new connection from a client standing at
// from to the service port through via, the source its endpoint sees
// included. It is the one entry point for every kind of client:
//
//   - to the cluster IP: Expect's outcome for the deciding node; a pod's
//     address is kept (unless masqueradeAll), the node's own traffic and
//     traffic from outside the pod range leave with a node address;
//   - from outside to a node port, external IP or load-balancer IP entering
//     at from.Node: ExpectExternal's outcome (externalTrafficPolicy Local
//     keeps the client's address and uses that node's endpoints, Cluster
//     masquerades and uses the cluster's);
//   - from a pod or the host to an external destination: short-circuited
//     to the cluster's endpoints (ExpectShortCircuit), masqueraded under
//     Cluster, a pod's address kept under Local, the host's always the
//     node's;
//   - to a load-balancer IP of a Service with loadBalancerSourceRanges,
//     from an address in none of them: dropped (node ports are not
//     subject to the ranges; the node itself may reach its load-balancer IPs
//     when a range holds its address); a standpoint without an address is
//     a client the ranges let in;
//   - a pod reaching itself through the Service is masqueraded (hairpin:
//     Outcome.SourceOf).
func (o Oracle) ExpectFrom(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, from cluster.Standpoint, via cluster.Via, zone string) Outcome {
	name := sp.Name.String()
	if via == cluster.ViaLoadBalancer && len(sp.SourceRanges) > 0 && from.Addr.IsValid() && anyUsable(eps) && !inRanges(sp.SourceRanges, from.Addr) {
		return Outcome{Kind: Drop, Reason: fmt.Sprintf("%s: %s is outside every loadBalancerSourceRanges entry", name, from.Addr)}
	}
	var out Outcome
	switch {
	case via == cluster.ViaClusterIP:
		out = o.Expect(mode, sp, eps, from.Node, zone)
		if from.Where != cluster.InPod || o.MasqueradeAll {
			out.Source = SourceNode
		}
	case from.Where == cluster.Outside:
		out = o.ExpectExternal(mode, sp, eps, from.Node, zone)
		if !sp.ExternalLocal {
			out.Source = SourceNode
		}
	default:
		out = o.ExpectShortCircuit(mode, sp, eps, from.Node, zone)
		if from.Where == cluster.OnHost || !sp.ExternalLocal {
			out.Source = SourceNode
		}
	}
	if from.Where == cluster.InPod {
		out.Client = from.Addr
	}
	return out
}

// inRanges reports whether a lies in one of the ranges.
func inRanges(ranges []netip.Prefix, a netip.Addr) bool {
	for _, r := range ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// HealthCheck is what a node's health check node port answers for a
// Service: the number of the node's ready endpoints (distinct addresses
// over the Service's ports), and 200 when there is one, 503 when there is
// none. A load balancer following it sends only to nodes that answer 200.
type HealthCheck struct {
	LocalEndpoints int
	Status         int
}

// ExpectHealthCheck gives the answer of node's health check node port for
// the Service of the given service ports' endpoints (all ports of one
// Service), as the documentation of externalTrafficPolicy Local and the
// health check describes it: ready endpoints only (a terminating one fails
// the check, so that the balancer drains the node).
func ExpectHealthCheck(epsByPort [][]*cluster.Endpoint, node string) HealthCheck {
	ips := map[netip.Addr]bool{}
	for _, eps := range epsByPort {
		for _, e := range eps {
			if e.Ready && e.NodeName == node {
				ips[e.IP] = true
			}
		}
	}
	hc := HealthCheck{LocalEndpoints: len(ips), Status: 503}
	if hc.LocalEndpoints > 0 {
		hc.Status = 200
	}
	return hc
}

// ExpectBalanced gives the outcome of a connection from outside to a
// load-balancer IP when the balancer spreads connections evenly over
// nodes: over every node when it does not follow health checks, else over
// the nodes whose check passes (those with a local ready endpoint, under
// externalTrafficPolicy Local). Each node's share is then split as
// ExpectFrom splits it there; a node that drops (Local without a local
// endpoint) gives its share to DROP, whose probability is in DropShare.
func (o Oracle) ExpectBalanced(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, nodes []string, zones map[string]string, client netip.Addr, followsHealth bool) (Outcome, float64) {
	name := sp.Name.String()
	use := nodes
	if followsHealth && sp.ExternalLocal {
		var healthy []string
		for _, n := range nodes {
			if ExpectHealthCheck([][]*cluster.Endpoint{eps}, n).Status == 200 {
				healthy = append(healthy, n)
			}
		}
		if len(healthy) > 0 {
			use = healthy // none healthy: cloud balancers send to every node
		}
	}
	probs := map[string]float64{}
	drop := 0.0
	out := Outcome{Kind: Endpoints, Reason: name + ": spread evenly over nodes " + strings.Join(use, ", ")}
	for _, n := range use {
		per := o.ExpectFrom(mode, sp, eps, cluster.Standpoint{Where: cluster.Outside, Node: n, Addr: client}, cluster.ViaLoadBalancer, zones[n])
		switch per.Kind {
		case Endpoints:
			for e, p := range per.Probs {
				probs[e] += p / float64(len(use))
			}
			out.Source = per.Source
			out.RepliesLost = out.RepliesLost || per.RepliesLost
		case Reject:
			return per, 0
		default:
			drop += 1 / float64(len(use))
		}
		out.Deviations = append(out.Deviations, per.Deviations...)
	}
	if len(probs) == 0 {
		return Outcome{Kind: Drop, Reason: name + ": every node the balancer uses drops"}, 1
	}
	out.Probs = probs
	return out, drop
}
