package proxy

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Fault names a deliberate bug a backend can be built with, so that the
// harness can prove it notices each one. Faults are off by default and are
// chosen by name (sim ... --fault NAME).
type Fault string

const (
	// FaultUniformProbability gives every rule of a load-balancing cascade
	// the probability 1/n instead of 1/(n-i): the first endpoint gets 1/n of
	// the connections and the last one the rest, (1-1/n)^(n-1).
	FaultUniformProbability Fault = "uniform-probability"
	// FaultKeepNotReady keeps not-ready endpoints (terminating or not) in the
	// cluster set, as if readiness were ignored: traffic reaches pods that
	// fail their readiness probe.
	FaultKeepNotReady Fault = "keep-not-ready"
	// FaultIgnoreLocalPolicy makes the Local traffic policies use the
	// endpoints of every node, as if each endpoint were local.
	FaultIgnoreLocalPolicy Fault = "ignore-local-policy"
	// FaultAffinityNoTimeout programs ClientIP affinity without its timeout:
	// a client stays with its endpoint for as long as the kernel remembers
	// it, however old the entry.
	FaultAffinityNoTimeout Fault = "affinity-no-timeout"
	// FaultKeepDeletedEndpoint keeps programming an endpoint after it was
	// removed from the Service's EndpointSlices: the backend remembers every
	// endpoint it has seen per service port and never forgets one.
	FaultKeepDeletedEndpoint Fault = "keep-deleted-endpoint"
	// FaultDropLastEndpoint leaves the last endpoint out of each
	// load-balancing cascade: it never gets new connections (and a service
	// port with a single endpoint gets none at all).
	FaultDropLastEndpoint Fault = "drop-last-endpoint"
	// FaultSkewAtMDE raises the share of each cascade's first endpoint by
	// exactly SkewMDE, relative, the harness's default minimum detectable
	// effect: with k endpoints the first gets (1+SkewMDE)/k and each other
	// (1-(1+SkewMDE)/k)/(k-1) (MDESkewWeights). The fault sits at the
	// detection limit, so how often the harness catches it is its power. A
	// single endpoint is unchanged.
	FaultSkewAtMDE Fault = "skew-at-mde"
	// FaultAffinityLeak makes a tenth of the clients lose ClientIP affinity
	// inside the timeout: for a client whose source address falls in bucket
	// 0 of LeakBuckets (ClientBucket, a kernel hash of the address, so the
	// same clients always leak), the affinity check is skipped and every
	// new connection is a fresh random choice. The others keep affinity.
	FaultAffinityLeak Fault = "affinity-leak"
	// FaultAffinityOverstay makes half the clients keep ClientIP affinity
	// for twice the timeout: a client in bucket 0 of OverstayBuckets
	// (ClientBucket) is remembered for 2 x timeoutSeconds, the others for
	// timeoutSeconds.
	FaultAffinityOverstay Fault = "affinity-overstay"
	// FaultLocalMasquerade masquerades external traffic under
	// externalTrafficPolicy Local as under Cluster: the backends see the
	// node's address instead of the client's, the one thing Local promises.
	FaultLocalMasquerade Fault = "local-masquerade"
	// FaultLocalIgnored sends external traffic under externalTrafficPolicy
	// Local to the Cluster endpoints (every node's), without masquerade, and
	// never drops it on a node without a local endpoint. Internal traffic
	// keeps its policy (unlike FaultIgnoreLocalPolicy, which makes every
	// endpoint local to both policies).
	FaultLocalIgnored Fault = "local-ignored"
	// FaultHealthCheckStale makes each node's health check server answer
	// from the state before the last sync: a node that just lost its last
	// local endpoint still answers 200, one that just got its first 503.
	FaultHealthCheckStale Fault = "healthcheck-stale"
	// FaultSourceRangesOpen leaves out the firewall drop of
	// loadBalancerSourceRanges: connections from outside the ranges reach
	// the Service through its load-balancer IPs.
	FaultSourceRangesOpen Fault = "source-ranges-open"
	// FaultHairpinNoMasquerade leaves out hairpin masquerade: a pod that
	// reaches itself through its Service gets the packet with its own
	// address as the source, which its kernel drops as martian.
	FaultHairpinNoMasquerade Fault = "hairpin-no-masquerade"
	// FaultNoConntrackCleanup leaves conntrack alone after a sync: a UDP
	// flow whose endpoint went away keeps its DNAT to the old address (a
	// black hole for as long as packets keep the entry alive), as kube-proxy
	// was before it deleted stale UDP entries.
	FaultNoConntrackCleanup Fault = "no-conntrack-cleanup"
	// FaultConntrackFlushAll empties the node's whole conntrack table after
	// every sync that changed something: established TCP connections lose
	// their entry, and their next packet is NATed again as a new
	// connection, most likely to another endpoint, which resets it.
	FaultConntrackFlushAll Fault = "conntrack-flush-all"
)

// faultDocs documents each fault in one line, in the order they are listed.
var faultDocs = []struct {
	f   Fault
	doc string
}{
	{FaultUniformProbability, "every cascade rule gets probability 1/n instead of 1/(n-i)"},
	{FaultKeepNotReady, "not-ready endpoints stay in the cluster set"},
	{FaultIgnoreLocalPolicy, "Local traffic policies use the endpoints of every node"},
	{FaultAffinityNoTimeout, "ClientIP affinity is programmed without its timeout"},
	{FaultKeepDeletedEndpoint, "endpoints removed from the slices stay programmed"},
	{FaultDropLastEndpoint, "the last endpoint of each cascade is left out"},
	{FaultSkewAtMDE, "the first endpoint's share is raised by the default MDE, 10 % relative"},
	{FaultAffinityLeak, "a tenth of the clients (by source hash) lose affinity inside the timeout"},
	{FaultAffinityOverstay, "half the clients (by source hash) keep affinity for twice the timeout"},
	{FaultLocalMasquerade, "external traffic under externalTrafficPolicy Local is masqueraded as under Cluster"},
	{FaultLocalIgnored, "external traffic under externalTrafficPolicy Local goes to every node's endpoints"},
	{FaultHealthCheckStale, "the health check node ports answer from the state before the last sync"},
	{FaultSourceRangesOpen, "loadBalancerSourceRanges are not enforced: every source reaches the load-balancer IPs"},
	{FaultHairpinNoMasquerade, "a pod reaching itself through its Service is not masqueraded"},
	{FaultNoConntrackCleanup, "stale UDP conntrack entries are not deleted after a sync"},
	{FaultConntrackFlushAll, "the whole conntrack table is flushed after every sync that changed something"},
}

// ErrUnknownFault is wrapped by ParseFaults for a name that is not a fault.
var ErrUnknownFault = errors.New("unknown fault")

// AllFaults lists every fault, in documentation order.
func AllFaults() []Fault {
	out := make([]Fault, len(faultDocs))
	for i, d := range faultDocs {
		out[i] = d.f
	}
	return out
}

// FaultNames lists every fault's name, in documentation order.
func FaultNames() []string {
	out := make([]string, len(faultDocs))
	for i, d := range faultDocs {
		out[i] = string(d.f)
	}
	return out
}

// Doc is the fault's one-line description ("" for an unknown fault).
func (f Fault) Doc() string {
	for _, d := range faultDocs {
		if d.f == f {
			return d.doc
		}
	}
	return ""
}

// Faults is a set of faults. The zero value (nil) is the correct dataplane.
type Faults map[Fault]bool

// ParseFaults builds a fault set from names. Empty names are ignored, so that
// a flag's default works; an unknown name is an error that lists the valid
// ones.
func ParseFaults(names []string) (Faults, error) {
	var out Faults
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		f := Fault(n)
		if f.Doc() == "" {
			return nil, fmt.Errorf("%w %q (valid faults: %s)", ErrUnknownFault, n, strings.Join(FaultNames(), ", "))
		}
		if out == nil {
			out = Faults{}
		}
		out[f] = true
	}
	return out, nil
}

// Has reports whether the fault is in the set.
func (fs Faults) Has(f Fault) bool { return fs[f] }

// Names lists the set's faults, sorted.
func (fs Faults) Names() []string {
	out := make([]string, 0, len(fs))
	for f, on := range fs {
		if on {
			out = append(out, string(f))
		}
	}
	sort.Strings(out)
	return out
}

// Categorizer is the endpoint eligibility of node with the faults that act
// on it (FaultKeepNotReady, FaultIgnoreLocalPolicy, FaultLocalIgnored) in
// force.
func (fs Faults) Categorizer(node string, preferSameNode bool) Categorizer {
	return Categorizer{
		Node:              node,
		PreferSameNode:    preferSameNode,
		KeepNotReady:      fs.Has(FaultKeepNotReady),
		IgnoreLocalPolicy: fs.Has(FaultIgnoreLocalPolicy),
		LocalIgnored:      fs.Has(FaultLocalIgnored),
	}
}

// String is the comma-separated sorted list, or "none".
func (fs Faults) String() string {
	if len(fs.Names()) == 0 {
		return "none"
	}
	return strings.Join(fs.Names(), ",")
}

// EndpointMemory implements FaultKeepDeletedEndpoint: it remembers every
// endpoint seen per service port, with the conditions it last had, and adds
// the forgotten ones back. It is not safe for concurrent use.
type EndpointMemory struct {
	seen map[cluster.ServicePortName]map[string]*cluster.Endpoint
}

// NewEndpointMemory returns an empty memory.
func NewEndpointMemory() *EndpointMemory {
	return &EndpointMemory{seen: map[cluster.ServicePortName]map[string]*cluster.Endpoint{}}
}

// Merge records eps as the current endpoints of the service port and returns
// them together with every endpoint seen before and now missing, sorted by
// CompareEndpoints. eps is not modified.
func (m *EndpointMemory) Merge(spn cluster.ServicePortName, eps []*cluster.Endpoint) []*cluster.Endpoint {
	known := m.seen[spn]
	if known == nil {
		known = map[string]*cluster.Endpoint{}
		m.seen[spn] = known
	}
	cur := make(map[string]bool, len(eps))
	for _, ep := range eps {
		k := ep.String()
		cur[k] = true
		known[k] = ep
	}
	if len(known) == len(cur) {
		return eps
	}
	out := slices.Clone(eps)
	for k, ep := range known {
		if !cur[k] {
			out = append(out, ep)
		}
	}
	SortEndpoints(out)
	return out
}
