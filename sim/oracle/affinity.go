package oracle

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
)

// IPVS connection-table facts that decide how long a persistence template
// (sessionAffinity ClientIP) may outlive its timeout (kernel 6.1,
// net/netfilter/ipvs/ip_vs_proto_tcp.c, ip_vs_proto_udp.c, ip_vs_conn.c).
// The harness's IPVS expiry checks were calibrated on them (issue 11).
const (
	// IPVSTCPTimeWait: a TCP connection closed normally stays 120 s in
	// TIME_WAIT.
	IPVSTCPTimeWait = 120 * time.Second
	// IPVSCloseTimeout: a TCP connection the real server resets stays 10 s
	// in CLOSE.
	IPVSCloseTimeout = 10 * time.Second
	// IPVSUDPTimeout: a UDP connection stays 300 s.
	IPVSUDPTimeout = 300 * time.Second
	// IPVSTemplateRearm: a template whose timer fires while it still
	// controls connections is re-armed for 60 s (ip_vs_conn_expire sets
	// cp->timeout = 60*HZ), and keeps that timeout.
	IPVSTemplateRearm = 60 * time.Second
	// IPVSTimerSlack covers the timer wheel: a timer is rounded up to its
	// level's granularity, 512 jiffies for a 60 s timeout at HZ=250
	// (Debian's), so a re-armed template can expire 2.05 s late, the first
	// timer 0.26 s.
	IPVSTimerSlack = 4 * time.Second
)

// IPVSTemplateHold is how long after a client's last new connection an
// IPVS persistence template of timeout may still send the client to the
// same endpoint, when the connection table keeps that client's connections
// until busy after it (the connection's own length plus IPVSTCPTimeWait,
// IPVSCloseTimeout or IPVSUDPTimeout): the template's timer fires timeout
// after its last use and is re-armed by IPVSTemplateRearm for as long as a
// connection it controls is still in the table; IPVSTimerSlack on top.
// With a short timeoutSeconds the template thus outlives it by a whole
// minute or more (kubernetes#89358).
func IPVSTemplateHold(timeout, busy time.Duration) time.Duration {
	h := timeout
	for h <= busy {
		h += IPVSTemplateRearm
	}
	return h + IPVSTimerSlack
}

// Binding is the affinity of one client to one endpoint.
type Binding struct {
	Endpoint string
	// Last is the client's last new connection to the service port.
	Last time.Duration
	// Until: a new connection before Until must reach Endpoint
	// (timeoutSeconds after the last new connection).
	Until time.Duration
	// MayHoldUntil >= Until: the dataplane may keep the affinity until then
	// (ipvs re-arms its template while connections remain:
	// IPVSTemplateHold); after it, the next connection is a fresh choice.
	MayHoldUntil time.Duration
	// AtRisk is set in iptables mode when more clients are bound to the
	// endpoint than its recent list holds and this client is not among the
	// most recent ones: the kernel may have forgotten it (a known deviation).
	AtRisk bool
}

// Check classifies an observed connection against the affinity expected.
type Check int

// The results of Observe.
const (
	// Consistent: the connection went where it had to, or was free to go
	// anywhere eligible.
	Consistent Check = iota
	// Violation: the client was bound and reached another endpoint.
	Violation
	// KnownDeviation: a violation the mode's documented limits explain
	// (iptables recent list capacity).
	KnownDeviation
)

// String names the check result.
func (c Check) String() string {
	switch c {
	case Consistent:
		return "consistent"
	case Violation:
		return "violation"
	case KnownDeviation:
		return "known deviation"
	}
	return fmt.Sprintf("Check(%d)", int(c))
}

// Affinity tracks, for one service port seen from one node, which endpoint
// each client is bound to under sessionAffinity ClientIP. Feed it the
// connections observed (Observe) and the current outcome (Update); ask it
// what a client must get (Expect). Times are virtual, since the start of
// the run. Not safe for concurrent use.
type Affinity struct {
	mode     cluster.Mode
	timeout  time.Duration
	linger   time.Duration
	capacity int
	allowed  map[string]bool
	clients  map[netip.Addr]*binding
}

type binding struct {
	endpoint string
	last     time.Duration
	busy     time.Duration // when the client's last connection leaves the ipvs table
}

// NewAffinity starts tracking a service port whose current outcome is
// current.
// Without ClientIP affinity no client is ever bound.
func (o Oracle) NewAffinity(mode cluster.Mode, sp *cluster.ServicePort, current Outcome) *Affinity {
	a := &Affinity{mode: mode, capacity: o.recentCapacity(), clients: map[netip.Addr]*binding{}, linger: IPVSTCPTimeWait}
	if sp.ClientIPAffinity {
		a.timeout = time.Duration(sp.AffinityTimeout) * time.Second
	}
	if isUDP(sp) {
		a.linger = IPVSUDPTimeout
	}
	a.Update(current)
	return a
}

// NewAffinity is Oracle{}.NewAffinity.
func NewAffinity(mode cluster.Mode, sp *cluster.ServicePort, current Outcome) *Affinity {
	return Oracle{}.NewAffinity(mode, sp, current)
}

// Update sets the current outcome. Bindings to endpoints that are no longer
// eligible are forgotten: kube-proxy removes an endpoint's affinity state
// with its rules, so the client chooses afresh even if the endpoint comes
// back.
func (a *Affinity) Update(o Outcome) {
	a.allowed = make(map[string]bool, len(o.Probs))
	for k := range o.Probs {
		a.allowed[k] = true
	}
	for c, b := range a.clients {
		if !a.allowed[b.endpoint] {
			delete(a.clients, c)
		}
	}
}

func (a *Affinity) binding(client netip.Addr, now time.Duration) (Binding, bool) {
	b := a.clients[client]
	if b == nil || a.timeout <= 0 || !a.allowed[b.endpoint] {
		return Binding{}, false
	}
	out := Binding{Endpoint: b.endpoint, Last: b.last, Until: b.last + a.timeout, MayHoldUntil: b.last + a.timeout}
	if a.mode == cluster.ModeIPVS {
		out.MayHoldUntil = b.last + IPVSTemplateHold(a.timeout, b.busy-b.last)
	}
	if now >= out.MayHoldUntil {
		return Binding{}, false
	}
	if a.mode == cluster.ModeIPTables {
		out.AtRisk = a.atRisk(client, b, now)
	}
	return out, true
}

// atRisk reports whether the endpoint has more live bindings than its
// recent list holds and the client is not among the most recent ones.
func (a *Affinity) atRisk(client netip.Addr, b *binding, now time.Duration) bool {
	newer, n := 0, 0
	for c, x := range a.clients {
		if x.endpoint != b.endpoint || now >= x.last+a.timeout {
			continue
		}
		n++
		if c != client && (x.last > b.last || (x.last == b.last && c.Less(client))) {
			newer++
		}
	}
	return n > a.capacity && newer >= a.capacity
}

// Binding returns the client's affinity at now, if it has one.
func (a *Affinity) Binding(client netip.Addr, now time.Duration) (Binding, bool) {
	return a.binding(client, now)
}

// Expect returns the endpoint a new connection of the client at now must
// reach, and true, when the client is bound; "" and false when the
// connection is free to go to any eligible endpoint. A binding in
// [Until, MayHoldUntil) is reported as not bound: either outcome is correct
// then.
func (a *Affinity) Expect(client netip.Addr, now time.Duration) (endpoint string, bound bool) {
	b, ok := a.binding(client, now)
	if !ok || now >= b.Until {
		return "", false
	}
	return b.Endpoint, true
}

// Observe records a new connection of the client that started at start,
// ended at end and reached endpoint, and says whether it respected the
// affinity. Connections must be observed in start order.
func (a *Affinity) Observe(client netip.Addr, endpoint string, start, end time.Duration) Check {
	if a.timeout <= 0 {
		return Consistent
	}
	res := Consistent
	b, ok := a.binding(client, start)
	switch {
	case ok && start < b.Until && b.Endpoint != endpoint:
		res = Violation
		if b.AtRisk {
			res = KnownDeviation
		}
	case ok && b.Endpoint == endpoint:
		// still bound (or held by an ipvs template): refresh below
	default:
		ok = false
	}
	x := a.clients[client]
	if !ok || x == nil || x.endpoint != endpoint {
		x = &binding{endpoint: endpoint}
		a.clients[client] = x
	}
	x.last = start
	if busy := end + a.linger; busy > x.busy {
		x.busy = busy
	}
	return res
}

// Overflow lists the endpoints holding more live bindings at now than an
// iptables recent list keeps, with their counts; nil outside iptables mode.
func (a *Affinity) Overflow(now time.Duration) map[string]int {
	if a.mode != cluster.ModeIPTables || a.timeout <= 0 {
		return nil
	}
	counts := map[string]int{}
	for _, b := range a.clients {
		if now < b.last+a.timeout && a.allowed[b.endpoint] {
			counts[b.endpoint]++
		}
	}
	var out map[string]int
	for ep, n := range counts {
		if n > a.capacity {
			if out == nil {
				out = map[string]int{}
			}
			out[ep] = n
		}
	}
	return out
}

// Deviations describes, in sorted lines, the capacity overflows at now.
func (a *Affinity) Deviations(now time.Duration) []string {
	ov := a.Overflow(now)
	eps := make([]string, 0, len(ov))
	for ep := range ov {
		eps = append(eps, ep)
	}
	slices.SortFunc(eps, cmp.Compare)
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		out = append(out, fmt.Sprintf("iptables: endpoint %s has %d clients bound, more than its recent list keeps (%d): affinity is not kept for the %d least recent", ep, ov[ep], a.capacity, ov[ep]-a.capacity))
	}
	return out
}

// Across is what ClientIP affinity does for one client whose connections
// enter the cluster through several nodes (node ports, or a load balancer
// that spreads them). kube-proxy keeps affinity state per node: the
// iptables recent lists, the nftables affinity sets and the IPVS
// persistence templates live in each node's kernel. So each entry node
// sends the client to an endpoint of its own choice (PerNode: the outcome
// of a first connection there) and keeps it there; the nodes agree only by
// chance.
type Across struct {
	PerNode map[string]Outcome
	// Agree is the probability that every entry node chooses the same
	// endpoint for one client: the sum over endpoints of the product of
	// the nodes' probabilities, each node choosing at random and alone.
	// Random is false when the choice is not random (IPVS schedulers go
	// by turn or by load): Agree is then undefined.
	Agree  float64
	Random bool
	// Reason says it in a sentence, for reports.
	Reason string
}

// ExpectAcross gives Across for a client at addr outside the cluster whose
// connections reach sp via via through each of nodes (zones: the nodes'
// zones).
func (o Oracle) ExpectAcross(mode cluster.Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, addr netip.Addr, via cluster.Via, nodes []string, zones map[string]string) Across {
	a := Across{PerNode: map[string]Outcome{}, Random: mode != cluster.ModeIPVS}
	agree := map[string]float64{}
	for i, n := range nodes {
		out := o.ExpectFrom(mode, sp, eps, cluster.Standpoint{Where: cluster.Outside, Node: n, Addr: addr}, via, zones[n])
		a.PerNode[n] = out
		next := map[string]float64{}
		for e, p := range out.Probs {
			if i == 0 {
				next[e] = p
			} else {
				next[e] = agree[e] * p
			}
		}
		agree = next
	}
	for _, p := range agree {
		a.Agree += p
	}
	per := "its recent lists"
	switch mode {
	case cluster.ModeNFTables:
		per = "its affinity sets"
	case cluster.ModeIPVS:
		per = "its persistence templates"
	}
	a.Reason = fmt.Sprintf("%s: each of %d entry nodes keeps ClientIP affinity in %s: a client entering through each is held to one endpoint per node", sp.Name, len(nodes), per)
	if a.Random {
		a.Reason += fmt.Sprintf(", chosen at random and alone; all nodes choose the same with probability %.3g", a.Agree)
	} else {
		a.Reason += ", chosen by each node's scheduler in turn (not at random)"
	}
	return a
}
