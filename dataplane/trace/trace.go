// Package trace is the vocabulary of the packet tracers that the iptables
// and nftables backends run over their fakes: a packet, a client's affinity
// history, and the outcomes a trace reaches with their probabilities. Each
// backend keeps its own walker (the rule languages differ); what a walk
// returns is the same, so tests and goldens read both the same way.
//
// The package imports nothing from the module: the dataplane root sorts its
// counters with CompareTarget, since a counter's endpoint is a trace target.
package trace

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Outcomes of a trace besides an endpoint "ip:port".
const (
	OutcomeDrop   = "DROP"
	OutcomeReject = "REJECT"
	// OutcomeAccept is a packet accepted without DNAT: it goes on to its
	// original destination (for a cluster IP, nowhere).
	OutcomeAccept = "ACCEPT"
)

// History is a client's affinity state: for each affinity list or set that
// holds the client's address (iptables.AffinityList, nftables.AffinitySet),
// how long ago it was last recorded or refreshed there. Names absent from
// the map do not hold the client.
type History map[string]time.Duration

// Packet is the first packet of a new connection.
type Packet struct {
	Src      netip.Addr
	Protocol string // "tcp", "udp" or "sctp"
	Dst      netip.Addr
	DPort    int
}

// Outcome is one possible fate of the connection.
type Outcome struct {
	// Target is the endpoint "ip:port" the connection was DNATed to, or
	// OutcomeDrop, OutcomeReject or OutcomeAccept.
	Target string
	// Masquerade reports that the source was masqueraded (SNAT to the
	// node) on the way out.
	Masquerade bool
	// P is the probability of this outcome.
	P float64
}

// Result lists a trace's outcomes, sorted by target then masquerade; the
// probabilities sum to 1 (up to rounding).
type Result []Outcome

// P is the total probability of a target.
func (r Result) P(target string) float64 {
	p := 0.0
	for _, o := range r {
		if o.Target == target {
			p += o.P
		}
	}
	return p
}

// Targets lists the targets reached with a positive probability, in order.
func (r Result) Targets() []string {
	var out []string
	for _, o := range r {
		if o.P > 0 && !slices.Contains(out, o.Target) {
			out = append(out, o.Target)
		}
	}
	return out
}

// String is "target[ masq] p, ..." with six decimals: the format of the
// trace goldens.
func (r Result) String() string {
	parts := make([]string, len(r))
	for i, o := range r {
		m := ""
		if o.Masquerade {
			m = " masq"
		}
		parts[i] = fmt.Sprintf("%s%s %.6f", o.Target, m, o.P)
	}
	return strings.Join(parts, ", ")
}

// Lines prints one outcome per line, "target masq=bool p=" with ten
// decimals: the long form the iptables tests print on a failure.
func (r Result) Lines() string {
	var b strings.Builder
	for _, o := range r {
		fmt.Fprintf(&b, "%s masq=%t p=%.10f\n", o.Target, o.Masquerade, o.P)
	}
	return b.String()
}

// Sort puts r in a Result's order: by target (CompareTarget), then the
// unmasqueraded outcome of a target before the masqueraded one.
func (r Result) Sort() {
	slices.SortFunc(r, func(a, b Outcome) int {
		if c := CompareTarget(a.Target, b.Target); c != 0 {
			return c
		}
		switch {
		case a.Masquerade == b.Masquerade:
			return 0
		case !a.Masquerade:
			return -1
		}
		return 1
	})
}

// CompareTarget orders endpoints "ip:port" by address then port, and the
// verdicts (anything else) after them, as strings.
func CompareTarget(a, b string) int {
	x, errx := netip.ParseAddrPort(a)
	y, erry := netip.ParseAddrPort(b)
	switch {
	case errx == nil && erry == nil:
		return x.Compare(y)
	case errx == nil:
		return -1
	case erry == nil:
		return 1
	}
	return strings.Compare(a, b)
}

// Uniform reports the largest deviation of a result's endpoint probabilities
// from 1/n over the given endpoints (math.Inf(1) if the outcomes include
// anything else).
func Uniform(r Result, endpoints []string) float64 {
	worst := 0.0
	for _, o := range r {
		if !slices.Contains(endpoints, o.Target) && o.P > 0 {
			return math.Inf(1)
		}
	}
	for _, e := range endpoints {
		worst = max(worst, math.Abs(r.P(e)-1/float64(len(endpoints))))
	}
	return worst
}
