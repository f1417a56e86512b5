package conform

import (
	"fmt"
	"net/netip"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/sim/cluster"
)

// LossReport accounts for the probes of a phase that nobody saw end: neither
// an arrival at a backend nor an ICMP error at the client.
type LossReport struct {
	Sent, Arrived, Rejected, OtherICMP int
	// Decided is the NAT decisions the kernel made for the phase (the rule
	// counters' delta), or -1 when unknown.
	Decided int64
	// ObserverDrops is the packets the observers' sockets dropped.
	ObserverDrops uint64
	// Lost is Sent - Arrived - Rejected - OtherICMP (never negative).
	Lost int
	// Missed is the lost probes the kernel decided and delivered but the
	// observer did not count: max(Decided - Arrived, ObserverDrops). Any
	// of them makes the phase's observation unreliable: an environment
	// error, never a failed check and never a pass.
	Missed int
	// Dropped is the lost probes with no decision: the dataplane dropped
	// them, a real outcome (the DROP cell).
	Dropped int
	// Text says it in one line.
	Text string
}

// Environment reports whether the observation itself lost probes.
func (l LossReport) Environment() bool { return l.Missed > 0 }

// ClassifyLoss splits a phase's lost probes (sent - arrived - rejected -
// otherICMP) into those the observer missed after the kernel decided them
// (decided - arrived when positive, or the observers' socket drops,
// whichever is larger) and those with no decision, which the dataplane
// dropped. decided < 0 means the rule counters are unavailable: only the
// socket drops show misses then.
func ClassifyLoss(sent, arrived, rejected, otherICMP int, decided int64, observerDrops uint64) LossReport {
	l := LossReport{Sent: sent, Arrived: arrived, Rejected: rejected, OtherICMP: otherICMP, Decided: decided, ObserverDrops: observerDrops}
	l.Lost = max(0, sent-arrived-rejected-otherICMP)
	missed := int64(observerDrops)
	if decided >= 0 {
		missed = max(missed, decided-int64(arrived))
	}
	l.Missed = int(max(0, missed))
	l.Dropped = max(0, l.Lost-l.Missed)
	switch {
	case l.Missed > 0:
		why := fmt.Sprintf("%s socket drops", group(int64(observerDrops)))
		if decided >= 0 {
			why = fmt.Sprintf("the kernel decided %s, %s arrived, %s", group(decided), group(int64(arrived)), why)
		}
		l.Text = fmt.Sprintf("the observer missed %s probes the kernel delivered (%s): the observation is unreliable", group(int64(l.Missed)), why)
		if l.Dropped > 0 {
			l.Text += fmt.Sprintf("; %s more lost without a decision", group(int64(l.Dropped)))
		}
	case l.Lost > 0:
		l.Text = fmt.Sprintf("%s of %s probes lost with no NAT decision and no socket drop: the dataplane dropped them", group(int64(l.Lost)), group(int64(sent)))
	default:
		l.Text = fmt.Sprintf("no loss: %s sent, every one seen", group(int64(sent)))
	}
	return l
}

// Report is the loss section of a report check.
func (l LossReport) Report(sendErrors int) *report.Loss {
	return &report.Loss{Sent: l.Sent, Arrived: l.Arrived, Rejected: l.Rejected, OtherICMP: l.OtherICMP, Lost: l.Lost,
		Decided: l.Decided, ObserverDrops: l.ObserverDrops, SendErrors: sendErrors, Missed: l.Missed, Text: l.Text}
}

// Decided is the NAT decisions the client node's rule counters record for
// one Service port over a phase: the delta of its endpoint rules (DNAT
// counts a connection's first packet only), REJECT and DROP rules left out.
// -1 when the counters are unavailable (after is nil), for ClassifyLoss.
func Decided(spn cluster.ServicePortName, before, after []dataplane.Counter) int64 {
	if after == nil {
		return -1
	}
	var d int64
	for _, c := range after {
		if c.ServicePort == spn && isEndpointRule(c.Endpoint) {
			d += int64(c.Packets)
		}
	}
	for _, c := range before {
		if c.ServicePort == spn && isEndpointRule(c.Endpoint) {
			d -= int64(c.Packets)
		}
	}
	return d
}

// isEndpointRule reports whether a counter's Endpoint is an endpoint
// (ip:port), not "REJECT" or "DROP".
func isEndpointRule(e string) bool {
	_, err := netip.ParseAddrPort(e)
	return err == nil
}
