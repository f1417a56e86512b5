package conform

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/scenario"
)

// udpFlow checks one phase of a UDP flow whose endpoint changes: a flow on
// one 5-tuple from the client pod on node reaches endpoint A; A is deleted,
// made not ready, or replaced by a new endpoint on its node (deleted, and
// the new one added); or every endpoint stops serving and, once the
// Service has none, comes back (no-endpoints). After each change has
// settled and flowGrace has passed, every datagram of a window of
// flowWindow must reach a serving endpoint (or, with none left, none at
// all), and at most leakMDE of them may arrive nowhere. kube-proxy gets
// there by deleting the flow's stale conntrack entry after the sync; a
// dataplane that does not keeps the flow on A (the pod stays up here, so
// the black hole shows as arrivals at A). The recovery is measured: the
// time from the API write to the first datagram sent that reached a
// serving endpoint, and the datagrams lost before it.
func (s *suite) udpFlow(ctx context.Context, c *scenario.Check, node, phase string) {
	e, ok := s.newEstablished(ctx, c, node, phase)
	defer s.finishEstablished(ctx, e, c)
	if !ok {
		return
	}
	if err := e.k.prober.Flush(); err != nil {
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return
	}
	src := netip.AddrPortFrom(e.client.Config.Addrs[0], uint16(20000+s.rng.IntN(40000)))
	f, err := startFlow(ctx, e.k.prober, e.client, src, e.vip)
	if err != nil {
		e.rc.Verdict, e.rc.Message = report.Error, err.Error()
		return
	}
	first, err := f.awaitFirst(firstWait)
	if err != nil {
		f.stop()
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return
	}
	stages, err := s.udpStages(ctx, e, f, c, phase, first)
	f.stop()
	if err != nil {
		applyErr(e.rc, err)
		return
	}
	judgeFlow(e.rc, f, first, stages)
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
		all := len(s.state().Endpoints[e.spn])
		plan = [][]apiserver.Step{{{Action: apiserver.ActSetReady, Service: c.Service, Count: all, Ready: false}},
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
// a datagram at an endpoint that does not serve (any, when none does), and
// at most leakMDE of the window lost.
func judgeFlow(rc *report.Check, f *flow, first netip.AddrPort, stages []stageResult) {
	var notes, bad []string
	loss := &report.Loss{}
	for i, r := range stages {
		w := f.window(r.winFrom, r.winTo, r.w0, r.w1)
		n := int(r.winTo - r.winFrom)
		wrong := 0
		for ep, v := range w.per {
			if !r.serving[ep] {
				wrong += v
			}
		}
		rc.N += n
		loss.Sent += n
		loss.Arrived += n - w.nowhere
		loss.Lost += w.nowhere
		loss.Rejected += w.rejects
		rc.Table = append(rc.Table, endpointRows(w.per, r.serving, w.nowhere)...)
		desc := fmt.Sprintf("stage %d (%s; settled in %s)", i+1, r.what, r.settled.Round(time.Millisecond))
		if len(r.serving) == 0 {
			desc += fmt.Sprintf(": no serving endpoint; %d of %d datagrams in the window arrived, %d ICMP errors", n-w.nowhere, n, w.rejects)
		} else {
			after, lost, ok := f.recovery(r.t0, func(e netip.AddrPort) bool { return r.serving[e] })
			if ok {
				desc += fmt.Sprintf(": the flow reached a serving endpoint %s after the change (%d datagrams lost before)", after.Round(time.Millisecond), lost)
			} else {
				desc += ": the flow never reached a serving endpoint"
			}
			if lim := int(leakMDE * float64(n)); w.nowhere > lim {
				bad = append(bad, fmt.Sprintf("stage %d: %d of %d datagrams in the window arrived nowhere (at most %d may)", i+1, w.nowhere, n, lim))
			}
		}
		if wrong > 0 {
			bad = append(bad, fmt.Sprintf("stage %d: %d of %d datagrams sent %s after the settle reached an endpoint that does not serve (the flow began at %s)",
				i+1, wrong, n, flowGrace, first))
		}
		notes = append(notes, desc)
	}
	rc.Loss = loss
	rc.Power = stats.LeakPower(rc.N, leakMDE)
	rc.Message = strings.Join(notes, "; ")
	if len(bad) > 0 {
		fail(rc, len(bad), "%s; %s", strings.Join(bad, "; "), rc.Message)
	}
}
