package conform

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Sizes of the affinity-moves check: new connections before the change
// (the first sets the endpoint, the others must stay) and after it.
const (
	stickBefore = 5
	stickAfter  = 10
)

// affinityMoves checks that a ClientIP-affine client follows its endpoint
// away: from one client address on node, stickBefore new connections stay
// on one endpoint A; for UDP a flow on one 5-tuple runs too. A is deleted;
// after the settle and flowGrace stickAfter new connections and the
// flow's datagrams (UDP; at most leakMDE of them lost) must all reach one
// endpoint B other than A that the oracle lets the client use. Zero
// tolerance; the power is against a client whose affinity was lost with A
// (each new connection a fresh choice among the k endpoints left):
// 1-k^-(stickAfter-1). Not run when the client may use no endpoint once A
// is gone.
func (s *suite) affinityMoves(ctx context.Context, c *scenario.Check, node string) *estCheck {
	e, ok := s.newEstablished(ctx, c, node, phaseDeleted)
	defer s.finishEstablished(e)
	if !ok {
		return e
	}
	proto := protoOf(e.sp)
	src := e.client.Config.Addrs[len(e.client.Config.Addrs)-1]
	before, err := s.singles(ctx, e, src, proto, stickBefore)
	if err != nil {
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return e
	}
	a, err := netip.ParseAddrPort(before[0])
	if err != nil {
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, "the first connection was "+before[0]
		return e
	}
	if n := countNot(before, before[0]); n > 0 {
		fail(e.rc, n, "%d of %d connections before the change left the client's first endpoint %s: %s", n, len(before), a, strings.Join(before, ", "))
		return e
	}
	left := s.allowedFor(e)
	delete(left, a)
	if len(left) == 0 {
		e.rc.Verdict, e.rc.Test = report.NotRun, "none"
		e.rc.Message = fmt.Sprintf("not applicable: once %s goes the client may use no endpoint (the oracle's DROP or REJECT), so there is nothing to move to", a)
		e.snap = nil
		return e
	}
	var f *flow
	if proto == traffic.UDP {
		if f, err = s.affineFlow(ctx, e, src, a); err != nil {
			e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
			return e
		}
	}
	r, err := s.change(ctx, e, apiserver.Step{Action: apiserver.ActRemove, Service: c.Service, Endpoint: a.Addr().String()})
	if err == nil && f != nil {
		r.winFrom = f.seqAt(r.w0)
		err = s.mc.idle(ctx, flowWindow)
		r.w1 = time.Now()
		r.winTo = f.seqAt(r.w1)
	}
	if f != nil {
		f.stop()
	}
	if err != nil {
		applyErr(e.rc, err)
		return e
	}
	after, err := s.singles(ctx, e, src, proto, stickAfter)
	if err != nil {
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return e
	}
	judgeMove(e.rc, f, r, a, after)
	return e
}

// singles sends n new connections from src, one at a time.
func (s *suite) singles(ctx context.Context, e *estCheck, src netip.Addr, proto traffic.Proto, n int) ([]string, error) {
	var out []string
	for i := 0; i < n; i++ {
		o, err := s.probeSingle(ctx, e.client, src, e.vip, proto, s.rng)
		if err != nil {
			return out, err
		}
		out = append(out, o)
	}
	return out, nil
}

// affineFlow starts a UDP flow from src, which must reach a (the client's
// endpoint).
func (s *suite) affineFlow(ctx context.Context, e *estCheck, src netip.Addr, a netip.AddrPort) (*flow, error) {
	f, err := startFlow(ctx, e.k.prober, e.client, netip.AddrPortFrom(src, uint16(20000+s.rng.IntN(40000))), e.vip)
	if err != nil {
		return nil, err
	}
	first, err := f.awaitFirst(firstWait)
	if err == nil && first != a {
		err = fmt.Errorf("the client's flow reached %s, not its endpoint %s", first, a)
	}
	if err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

// judgeMove decides: every new connection after the change (and the
// flow's window) at one serving endpoint B != a.
func judgeMove(rc *report.Check, f *flow, r stageResult, a netip.AddrPort, after []string) {
	b := after[0]
	got := map[string]int{}
	for _, o := range after {
		got[o]++
	}
	var bad []string
	if bp, err := netip.ParseAddrPort(b); err != nil || bp == a || !r.allowed[bp] {
		bad = append(bad, fmt.Sprintf("the first connection after %s was deleted went to %s", a, b))
	}
	if n := countNot(after, b); n > 0 {
		bad = append(bad, fmt.Sprintf("%d of %d connections after the change left the client's new endpoint %s", n, len(after), b))
	}
	rc.N = len(after)
	rc.Table = outcomeRows(got)
	if f != nil {
		w := f.window(r.winFrom, r.winTo, r.w0, r.w1)
		n := int(r.winTo - r.winFrom)
		rc.N += n
		rc.Table = append(rc.Table, endpointRows(w.per, r.allowed, w.nowhere)...)
		elsewhere := n - w.nowhere
		if bp, err := netip.ParseAddrPort(b); err == nil {
			elsewhere -= w.per[bp]
		}
		if elsewhere > 0 {
			bad = append(bad, fmt.Sprintf("%d of %d datagrams of the flow in the window reached another endpoint than %s", elsewhere, n, b))
		}
		if lim := int(leakMDE * float64(n)); w.nowhere > lim {
			bad = append(bad, fmt.Sprintf("%d of %d datagrams of the flow in the window arrived nowhere (at most %d may)", w.nowhere, n, lim))
		}
	}
	k := len(r.allowed)
	if k > 1 {
		rc.Power = 1 - math.Pow(float64(k), -float64(stickAfter-1))
	}
	rc.Message = fmt.Sprintf("the client stuck to %s; %s (settled in %s); after it: %s", a, r.what, r.settled.Round(time.Millisecond), spreadOf(after))
	if len(bad) > 0 {
		fail(rc, len(bad), "%s; %s", strings.Join(bad, "; "), rc.Message)
	}
}

func countNot(l []string, v string) int {
	n := 0
	for _, x := range l {
		if x != v {
			n++
		}
	}
	return n
}
