package oracle

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Connection-table timeouts that decide how long an ipvs persistence
// template may outlive its timeout (kernel ip_vs_proto_tcp.c / _udp.c).
const (
	ipvsTCPTimeWait = 120 * time.Second
	ipvsUDPTimeout  = 300 * time.Second
)

// Binding is the affinity of one client to one endpoint.
type Binding struct {
	Endpoint string
	// Last is the client's last new connection to the service port.
	Last time.Duration
	// Until: a new connection before Until must reach Endpoint
	// (timeoutSeconds after the last new connection).
	Until time.Duration
	// MayHoldUntil >= Until: the dataplane may keep the affinity until then
	// (ipvs re-arms its template while connections remain); after it, the
	// next connection is a fresh choice.
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
	a := &Affinity{mode: mode, capacity: o.recentCapacity(), clients: map[netip.Addr]*binding{}, linger: ipvsTCPTimeWait}
	if sp.ClientIPAffinity {
		a.timeout = time.Duration(sp.AffinityTimeout) * time.Second
	}
	if isUDP(sp) {
		a.linger = ipvsUDPTimeout
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
	if a.mode == cluster.ModeIPVS && b.busy > out.MayHoldUntil {
		k := (b.busy - b.last + a.timeout - 1) / a.timeout
		out.MayHoldUntil = b.last + k*a.timeout
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
