package conform

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Sizes of the TCP established check: the connections it holds, the new
// connections it sends after a change, and how long a held connection may
// take to echo.
const (
	heldEstablished = 8
	newConnProbes   = 20
)

var echoTimeout = timeScaled(2 * time.Second)

// tcpEstablished checks one phase of established TCP connections while
// their Service's endpoints change: heldEstablished real connections from
// the client pod on node, spread over the endpoints it may use, each
// echoing through its endpoint; then an endpoint is added elsewhere
// (unrelated-sync), the first connection's endpoint A terminates while
// serving (terminating), or every endpoint does (fallback). After the
// settle and flowGrace every held connection must still echo (a dataplane
// that flushes conntrack makes their next packet a new connection, NATed
// again: most go elsewhere and die), and newConnProbes new connections
// must avoid A while a ready endpoint is left and reach the terminating
// ones when none is (no reject).
func (s *suite) tcpEstablished(ctx context.Context, c *scenario.Check, node, phase string) *estCheck {
	e, ok := s.newEstablished(ctx, c, node, phase)
	defer s.finishEstablished(e)
	if !ok {
		return e
	}
	want := s.or.Expect(s.o.Mode, e.sp, s.state().Endpoints[e.spn], node, s.zone(node))
	eps := want.Endpoints()
	if want.Kind != oracle.Endpoints || (phase == phaseTerminatingEP && len(eps) < 2) {
		e.rc.Verdict, e.rc.Test = report.NotRun, "none"
		e.rc.Message = fmt.Sprintf("not applicable: the client may use %s (the %s phase needs at least %d endpoints)", want, phase, map[bool]int{true: 2, false: 1}[phase == phaseTerminatingEP])
		e.snap = nil
		return e
	}
	s.mc.quiesce()
	h, err := s.holdConns(ctx, e.client, e.client.Config.Addrs[0], e.vip, eps, heldEstablished, true)
	defer h.close()
	if err == nil {
		if broken := h.echoAll(); len(broken) > 0 {
			err = fmt.Errorf("held connections did not echo before any change: %s", strings.Join(broken, "; "))
		}
	}
	if err != nil {
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return e
	}
	steps, a, err := s.tcpSteps(e, c, phase, h.at[0])
	if err != nil {
		e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
		return e
	}
	r, err := s.change(ctx, e, steps...)
	if err != nil {
		applyErr(e.rc, err)
		return e
	}
	broken := h.echoAll()
	var bad []string
	if len(broken) > 0 {
		bad = append(bad, fmt.Sprintf("%d of %d established connections stopped echoing after the change: %s", len(broken), len(h.at), strings.Join(broken, "; ")))
	}
	if phase != phaseUnrelatedSync {
		msg, err := s.newConnections(ctx, e, r, phase, a)
		if err != nil {
			e.rc.Verdict, e.rc.ErrorKind, e.rc.Message = report.Error, report.KindEnvironment, err.Error()
			return e
		}
		if msg != "" {
			bad = append(bad, msg)
		}
	}
	e.rc.N = len(h.at)
	// A flush re-NATs each connection: it survives only where the new
	// choice is its old endpoint, 1/k at best (no affinity: not run). In
	// IPVS mode a flush does not move a connection (conntrack-flush-all is
	// not built there): no power to state.
	if s.o.Mode != cluster.ModeIPVS {
		e.rc.Power = 1 - math.Pow(1/float64(len(eps)), float64(len(h.at)))
	}
	e.rc.Message = fmt.Sprintf("%s settled in %s; %d held connections on %s", r.what, r.settled.Round(time.Millisecond), len(h.at), spreadOf(h.at))
	if len(bad) > 0 {
		fail(e.rc, len(bad), "%s; %s", strings.Join(bad, "; "), e.rc.Message)
	}
	return e
}

// tcpSteps is the phase's change, and the endpoint it terminates (the
// first held connection's, first) when it terminates one.
func (s *suite) tcpSteps(e *estCheck, c *scenario.Check, phase, first string) ([]apiserver.Step, netip.AddrPort, error) {
	a := netip.MustParseAddrPort(first)
	switch phase {
	case phaseUnrelatedSync:
		b, err := s.newBackend(e, e.client.Node)
		if err != nil {
			return nil, a, err
		}
		return []apiserver.Step{{Action: apiserver.ActAdd, Service: c.Service, Endpoint: b.String(), Node: e.client.Node}}, netip.AddrPort{}, nil
	case phaseTerminatingEP:
		return []apiserver.Step{{Action: apiserver.ActTerminate, Service: c.Service, Endpoint: a.Addr().String()}}, a, nil
	case phaseFallback:
		return []apiserver.Step{{Action: apiserver.ActTerminate, Service: c.Service, Count: apiserver.AllEndpoints}}, netip.AddrPort{}, nil
	}
	return nil, a, fmt.Errorf("unknown phase %q", phase)
}

// newConnections sends newConnProbes new connections after the change and
// says what went wrong ("" when nothing): one reached the terminating
// endpoint a, or an endpoint the oracle does not allow, or was rejected;
// all dropped is a failure, some lost an error (an incomplete
// observation). Their source ports (16384-65535) never meet the held
// connections' (below 16384: holdConns).
func (s *suite) newConnections(ctx context.Context, e *estCheck, r stageResult, phase string, a netip.AddrPort) (string, error) {
	got := map[string]int{}
	for i := 0; i < newConnProbes; i++ {
		out, err := s.probeSingle(ctx, e.client, e.client.Config.Addrs[0], e.vip, traffic.TCP, s.rng)
		if err != nil {
			return "", err
		}
		got[out]++
	}
	wrong := 0
	for out, n := range got {
		ap, err := netip.ParseAddrPort(out)
		if out != "lost" && (err != nil || !r.allowed[ap] || (phase == phaseTerminatingEP && ap == a)) {
			wrong += n
		}
	}
	e.rc.Table = append(e.rc.Table, outcomeRows(got)...)
	switch lost := got["lost"]; {
	case lost == newConnProbes:
		wrong += lost // every one dropped: an outcome, not a miss
	case lost > 0:
		return "", fmt.Errorf("%d of %d new connections were lost (neither arrived nor rejected): the observation is incomplete", lost, newConnProbes)
	}
	if wrong == 0 {
		return "", nil
	}
	if phase == phaseTerminatingEP {
		return fmt.Sprintf("%d of %d new connections went to the terminating endpoint %s, were rejected or dropped, while ready endpoints were left", wrong, newConnProbes, a), nil
	}
	return fmt.Sprintf("%d of %d new connections were rejected, dropped or reached an endpoint the client may not use, while every endpoint was terminating and serving (the fallback)", wrong, newConnProbes), nil
}

// outcomeRows is a table of outcomes in name order.
func outcomeRows(got map[string]int) []report.Row {
	var out []report.Row
	for _, k := range slices.Sorted(maps.Keys(got)) {
		out = append(out, report.Row{Outcome: k, Observed: float64(got[k])})
	}
	return out
}

// spreadOf says how many held connections each endpoint has.
func spreadOf(at []string) string {
	n := map[string]int{}
	for _, e := range at {
		n[e]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

// echoAll writes a numbered message on every held connection at once and
// reads it back (echoTimeout each); it returns the ones that failed.
func (h *held) echoAll() []string {
	h.mu.Lock()
	conns := append([]net.Conn(nil), h.clients...)
	at := append([]string(nil), h.at...)
	h.mu.Unlock()
	var mu sync.Mutex
	var broken []string
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := echo(c, i); err != nil {
				mu.Lock()
				broken = append(broken, fmt.Sprintf("#%d to %s: %v", i+1, at[i], err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(broken)
	return broken
}

func echo(c net.Conn, i int) error {
	msg := []byte(fmt.Sprintf("kpsim-%04d", i))
	if err := c.SetDeadline(time.Now().Add(echoTimeout)); err != nil {
		return err
	}
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	n := 0
	for n < len(got) {
		k, err := c.Read(got[n:])
		if err != nil {
			return err
		}
		n += k
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echoed %q, sent %q", got, msg)
	}
	return nil
}
