package conform

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/scenario"
)

// udpFlow checks one phase of a UDP flow whose endpoint changes: a flow on
// one 5-tuple from the client pod on node reaches endpoint A; A is deleted,
// made not ready, or replaced by a new endpoint on its node (deleted, and
// the new one added); or every endpoint stops serving and, once the
// Service has none, comes back (no-endpoints). After each change has
// settled and flowGrace has passed, every datagram of a window of
// flowWindow must reach an endpoint the oracle lets the client use (with
// none, none at all), and at most leakMDE of them may arrive nowhere.
// kube-proxy gets there by deleting the flow's stale conntrack entry after
// the sync; a dataplane that does not keeps the flow on A (the pod stays up
// here, so the black hole shows as arrivals at A). The recovery is
// measured: the time from the API write to the first datagram sent that
// reached an allowed endpoint, and the datagrams before it that did not
// (at A, or nowhere: lost to the client, whose server is gone).
func (s *suite) udpFlow(ctx context.Context, c *scenario.Check, node, phase string) *estCheck {
	e, ok := s.newEstablished(ctx, c, node, phase)
	defer s.finishEstablished(e)
	if !ok {
		return e
	}
	if err := e.k.prober.Flush(); err != nil {
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return e
	}
	src := netip.AddrPortFrom(e.client.Config.Addrs[0], uint16(20000+s.rng.IntN(40000)))
	f, err := startFlow(ctx, e.k.prober, e.client, src, e.vip)
	if err != nil {
		e.rc.Verdict, e.rc.Message = report.Error, err.Error()
		return e
	}
	first, err := f.awaitFirst(firstWait)
	if err != nil {
		f.stop()
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return e
	}
	stages, err := s.udpStages(ctx, e, f, c, phase, first)
	f.stop()
	if err != nil {
		applyErr(e.rc, err)
		return e
	}
	judgeFlow(e.rc, f, first, stages)
	return e
}

// udpStages makes the phase's changes one after the other while the flow
// runs, each followed by its judged window.
func (s *suite) udpStages(ctx context.Context, e *estCheck, f *flow, c *scenario.Check, phase string, first netip.AddrPort) ([]stageResult, error) {
	var plan [][]apiserver.Step
	at := first.Addr().String()
	switch phase {
	case phaseDeleted:
		plan = [][]apiserver.Step{{{Action: apiserver.ActRemove, Service: c.Service, Endpoint: at}}}
	case phaseNotReady:
		plan = [][]apiserver.Step{{{Action: apiserver.ActSetReady, Service: c.Service, Endpoint: at, Ready: false}}}
	case phaseReplaced:
		node := s.endpointNode(e, first.Addr())
		b, err := s.newBackend(e, node)
		if err != nil {
			return nil, err
		}
		plan = [][]apiserver.Step{{{Action: apiserver.ActRemove, Service: c.Service, Endpoint: at},
			{Action: apiserver.ActAdd, Service: c.Service, Endpoint: b.String(), Node: node}}}
	case phaseNoEndpoints:
		plan = [][]apiserver.Step{{{Action: apiserver.ActSetReady, Service: c.Service, Count: apiserver.AllEndpoints, Ready: false}},
			{{Action: apiserver.ActRestore, Service: c.Service, Snapshot: e.snap}}}
	default:
		return nil, fmt.Errorf("unknown phase %q", phase)
	}
	var out []stageResult
	for _, steps := range plan {
		r, err := s.change(ctx, e, steps...)
		if err != nil {
			return out, err
		}
		r.winFrom = f.seqAt(r.w0)
		if err := s.mc.idle(ctx, flowWindow); err != nil {
			return out, err
		}
		r.w1 = time.Now()
		r.winTo = f.seqAt(r.w1)
		out = append(out, r)
	}
	return out, nil
}

// endpointNode is the node of the service port's endpoint at a.
func (s *suite) endpointNode(e *estCheck, a netip.Addr) string {
	for _, ep := range s.state().Endpoints[e.spn] {
		if ep.IP == a {
			return ep.NodeName
		}
	}
	return e.client.Node
}

// judgeFlow decides the phase from its stages' windows: zero tolerance for
// a datagram at an endpoint the client may not use (any, when it may use
// none), and at most leakMDE of the window lost. A window with fewer than
// half its datagrams (the flow ended early), or a datagram the observers
// dropped, leaves the phase undecided: an environment error.
func judgeFlow(rc *report.Check, f *flow, first netip.AddrPort, stages []stageResult) {
	var notes, bad []string
	loss := &report.Loss{SendErrors: f.errCount(), ObserverDrops: f.drops}
	full := int(flowWindow / flowInterval)
	for i, r := range stages {
		w := f.window(r.winFrom, r.winTo, r.w0, r.w1)
		if w.n < full/2 {
			rc.Verdict, rc.ErrorKind = report.Error, report.KindEnvironment
			rc.Message = fmt.Sprintf("stage %d: only %d datagrams in a window of %s (%d expected): the flow ended early or could not send", i+1, w.n, flowWindow, full)
			return
		}
		wrong := 0
		for ep, v := range w.per {
			if !r.allowed[ep] {
				wrong += v
			}
		}
		rc.N += w.n
		loss.Sent += w.n
		loss.Arrived += w.n - w.nowhere
		loss.Lost += w.nowhere
		loss.Rejected += w.rejects
		rc.Table = append(rc.Table, endpointRows(w.per, r.allowed, w.nowhere)...)
		notes = append(notes, stageNote(i, r, w, f))
		if lim := int(leakMDE * float64(w.n)); len(r.allowed) > 0 && w.nowhere > lim {
			bad = append(bad, fmt.Sprintf("stage %d: %d of %d datagrams in the window arrived nowhere (at most %d may)", i+1, w.nowhere, w.n, lim))
		}
		if wrong > 0 {
			bad = append(bad, fmt.Sprintf("stage %d: %d of %d datagrams sent %s after the settle reached an endpoint the client may not use (the flow began at %s)",
				i+1, wrong, w.n, flowGrace, first))
		}
	}
	rc.Loss = loss
	// A kept entry sends every datagram of the window to the old endpoint:
	// a phase sees it for certain (one flow, one entry: against a cleanup
	// that misses a fraction of the flows, a phase is one trial).
	rc.Power = 1
	rc.Message = strings.Join(notes, "; ")
	if f.drops > 0 {
		rc.Verdict, rc.ErrorKind = report.Error, report.KindEnvironment
		rc.Message = fmt.Sprintf("the observers dropped %d packets during the flow: where some datagrams went is unknown; %s", f.drops, rc.Message)
		return
	}
	if len(bad) > 0 {
		fail(rc, len(bad), "%s; %s", strings.Join(bad, "; "), rc.Message)
	}
}

// stageNote describes a stage: the change, its settle, and the recovery
// (or, with no endpoint allowed, what arrived and the ICMP errors).
func stageNote(i int, r stageResult, w window, f *flow) string {
	desc := fmt.Sprintf("stage %d (%s; settled in %s)", i+1, r.what, r.settled.Round(time.Millisecond))
	if len(r.allowed) == 0 {
		return desc + fmt.Sprintf(": no endpoint allowed; %d of %d datagrams in the window arrived, %d ICMP errors", w.n-w.nowhere, w.n, w.rejects)
	}
	after, lost, ok := f.recovery(r.t0, func(e netip.AddrPort) bool { return r.allowed[e] })
	if !ok {
		return desc + ": the flow never reached an allowed endpoint"
	}
	return desc + fmt.Sprintf(": the flow reached an allowed endpoint %s after the change (%d datagrams before it reached the old endpoint or nowhere)", after.Round(time.Millisecond), lost)
}
