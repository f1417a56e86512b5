package conform

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// The established-flow checks (udp-flow, tcp-established, affinity-moves)
// follow flows that are already established while the Service's endpoints
// change under them: each phase snapshots the Service's endpoints, makes its
// change through the API (every node programs it: the settle), waits
// flowGrace (kube-proxy cleans conntrack after the rules, in the same sync)
// and judges what the flow does next; the snapshot is then written back.
// They are deterministic: zero tolerance after the grace, with the power
// against a partial leak stated as for the other deterministic checks.
var (
	flowGrace  = timeScaled(time.Second)
	flowWindow = timeScaled(500 * time.Millisecond)
	firstWait  = timeScaled(3 * time.Second)
)

// Phases of the established-flow checks.
const (
	phaseDeleted       = "deleted"
	phaseNotReady      = "not-ready"
	phaseReplaced      = "replaced"
	phaseNoEndpoints   = "no-endpoints"
	phaseUnrelatedSync = "unrelated-sync"
	phaseTerminatingEP = "terminating"
	phaseFallback      = "fallback"
)

// Phases of each check type, in the order they run.
var (
	udpFlowPhases = []string{phaseDeleted, phaseNotReady, phaseReplaced, phaseNoEndpoints}
	tcpPhases     = []string{phaseUnrelatedSync, phaseTerminatingEP, phaseFallback}
)

// estCheck is one verdict of an established-flow check.
type estCheck struct {
	c      *scenario.Check
	node   string
	rc     *report.Check
	start  time.Time
	spn    cluster.ServicePortName
	sp     *cluster.ServicePort
	client *netns.Client
	vip    netip.AddrPort
	k      *kernelMachine
	snap   apiserver.Snapshot
	// added are endpoint addresses the phase gave the backends (restore
	// takes them away again).
	added []netip.Addr
}

// newEstablished prepares a verdict: the service port, the client pod on
// node, the kernel, and the snapshot of the Service's endpoints.
func (s *suite) newEstablished(ctx context.Context, c *scenario.Check, node, phase string) (*estCheck, bool) {
	e := &estCheck{c: c, node: node, start: time.Now()}
	e.rc = &report.Check{Name: c.Name + " @ " + node + " / " + phase, Type: c.Type, Service: c.Service, ClientNode: node, Phase: phase,
		Seed: s.seed, Alpha: s.alphaUnit, MDE: leakMDE, Test: "deterministic", P: 1}
	var err error
	if e.spn, e.sp, err = s.spn(c); err != nil {
		e.rc.Verdict, e.rc.Message = report.Error, err.Error()
		return e, false
	}
	if e.k, err = s.kernelOnly("an established flow"); err != nil {
		e.rc.Verdict, e.rc.Message = report.Error, err.Error()
		return e, false
	}
	if e.client = s.clientOn(node); e.client == nil {
		e.rc.Verdict, e.rc.Message = report.Error, "no client pod on node "+node
		return e, false
	}
	e.vip = netip.AddrPortFrom(e.sp.ClusterIP, uint16(e.sp.Port))
	if e.snap, err = s.m.Cluster.Snapshot(ctx, c.Service); err != nil {
		e.rc.Verdict, e.rc.Message = report.Error, err.Error()
		return e, false
	}
	return e, true
}

// finishEstablished files the verdict (deferred by each check, inside its
// dump: the dump's "after" shows the state the verdict judged).
func (s *suite) finishEstablished(e *estCheck) { s.fileVerdict(e.rc, e.start) }

// restoreEstablished writes the snapshot back and takes added addresses
// away, after the verdict and its dump; bounded, and done even when the run
// is being cancelled. A restore that fails is an error of the verdict (the
// checks after it would see a changed Service).
func (s *suite) restoreEstablished(ctx context.Context, e *estCheck) {
	if e == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*settleTimeout)
	defer cancel()
	var errs []string
	if e.snap != nil {
		if _, err := s.mc.apply(ctx, apiserver.Step{Action: apiserver.ActRestore, Service: e.c.Service, Snapshot: e.snap}); err != nil {
			errs = append(errs, "could not restore the Service's endpoints: "+err.Error())
		}
	}
	if len(e.added) > 0 {
		if err := s.syncBackends(nil, e.added); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		e.rc.Verdict, e.rc.ErrorKind = report.Error, report.KindEnvironment
		e.rc.Message = strings.TrimPrefix(e.rc.Message+"; "+strings.Join(errs, "; "), "; ")
	}
}

// syncBackends gives the backend namespaces the addresses add (on node
// add's node, by pod block) and takes del away, keeping every other
// endpoint address where it is.
func (s *suite) syncBackends(add map[string]netip.Addr, del []netip.Addr) error {
	eps := map[string][]netip.Addr{}
	for _, n := range s.topo.Nodes() {
		for _, a := range n.Config.Endpoints {
			if !slices.Contains(del, a) {
				eps[n.Config.Name] = append(eps[n.Config.Name], a)
			}
		}
	}
	for node, a := range add {
		eps[node] = append(eps[node], a)
	}
	if err := s.topo.SyncEndpoints(eps); err != nil {
		return fmt.Errorf("could not give the backends their addresses: %w", err)
	}
	return nil
}

// newBackend adds a backend address on node for a replacement endpoint:
// the highest address of the node's pod block that no endpoint, client or
// gateway uses.
func (s *suite) newBackend(e *estCheck, node string) (netip.Addr, error) {
	n, ok := s.topo.Node(node)
	if !ok {
		return netip.Addr{}, fmt.Errorf("no node namespace %s", node)
	}
	used := map[netip.Addr]bool{}
	for _, eps := range s.state().Endpoints {
		for _, ep := range eps {
			used[ep.IP] = true
		}
	}
	for _, a := range n.Config.Endpoints {
		used[a] = true
	}
	for _, c := range s.topo.Clients() {
		for _, a := range c.Config.Addrs {
			used[a] = true
		}
	}
	a := topology.LastHost(n.Config.PodCIDR)
	for tries := 0; tries < 16 && n.Config.PodCIDR.Contains(a); tries, a = tries+1, a.Prev() {
		if used[a] {
			continue
		}
		if err := s.syncBackends(map[string]netip.Addr{node: a}, nil); err != nil {
			continue // a gateway or another clash: the next one down
		}
		e.added = append(e.added, a)
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("no free address for a new endpoint in node %s's pod block %s", node, n.Config.PodCIDR)
}

// stageResult is what one API change did: when it started, when every
// node had it, and the endpoints the client may use after it (the
// oracle's, for its node: none where the oracle says DROP or REJECT).
type stageResult struct {
	what           string
	t0, w0, w1     time.Time
	settled        time.Duration
	allowed        map[netip.AddrPort]bool
	winFrom, winTo uint32
}

// change applies steps, waits for the settle and the grace, and returns
// the result with the endpoints the client may use after it (w0: the
// grace's end). Once its entry is gone a flow is a new connection, so the
// oracle's endpoints for new connections are where it may go.
func (s *suite) change(ctx context.Context, e *estCheck, steps ...apiserver.Step) (stageResult, error) {
	r := stageResult{t0: time.Now()}
	var what []string
	for _, st := range steps {
		if _, err := s.mc.apply(ctx, st); err != nil {
			return r, err
		}
		what = append(what, st.String())
	}
	r.what = strings.Join(what, ", ")
	r.settled = time.Since(r.t0)
	if err := s.mc.idle(ctx, flowGrace); err != nil {
		return r, err
	}
	r.w0 = time.Now()
	// Read after the grace: the model's own informers have the writes by
	// then, as the nodes' had at the settle.
	r.allowed = s.allowedFor(e)
	return r, nil
}

// allowedFor is the endpoints the oracle lets the check's client use now
// (empty: DROP or REJECT).
func (s *suite) allowedFor(e *estCheck) map[netip.AddrPort]bool {
	out := map[netip.AddrPort]bool{}
	want := s.or.Expect(s.o.Mode, e.sp, s.state().Endpoints[e.spn], e.node, s.zone(e.node))
	if want.Kind != oracle.Endpoints {
		return out
	}
	for _, ep := range want.Endpoints() {
		if a, err := netip.ParseAddrPort(ep); err == nil {
			out[a] = true
		}
	}
	return out
}

// applyErr files an error of a change: an API write that failed is the
// run's error, a settle that timed out the environment's.
func applyErr(rc *report.Check, err error) {
	rc.Verdict, rc.Message = report.Error, err.Error()
	if ae := (*applyError)(nil); !errors.As(err, &ae) {
		rc.ErrorKind = report.KindEnvironment
	}
}

// endpointRows is a table of arrivals per endpoint, in address order, with
// the ones the client may not use named.
func endpointRows(per map[netip.AddrPort]int, allowed map[netip.AddrPort]bool, nowhere int) []report.Row {
	var out []report.Row
	for _, e := range slices.SortedFunc(func(yield func(netip.AddrPort) bool) {
		for k := range per {
			if !yield(k) {
				return
			}
		}
	}, netip.AddrPort.Compare) {
		name := e.String()
		if !allowed[e] {
			name += " (not allowed)"
		}
		out = append(out, report.Row{Outcome: name, Observed: float64(per[e])})
	}
	if nowhere > 0 {
		out = append(out, report.Row{Outcome: "lost", Observed: float64(nowhere)})
	}
	return out
}

// establishedPhases are the verdicts an established-flow check gives per
// client node.
func establishedPhases(typ string) []string {
	switch typ {
	case scenario.CheckUDPFlow:
		return udpFlowPhases
	case scenario.CheckTCPEstablished:
		return tcpPhases
	}
	return []string{phaseDeleted}
}

// establishedNotRunnable says why an established-flow check cannot run on
// its port ("" when it can): udp-flow needs UDP, tcp-established TCP (a
// generated Service's protocol is the seed's, so validation cannot always
// tell), affinity-moves ClientIP affinity.
func establishedNotRunnable(c *scenario.Check, sp *cluster.ServicePort) string {
	proto := sp.Name.Protocol
	switch {
	case c.Type == scenario.CheckUDPFlow && proto != corev1.ProtocolUDP:
		return fmt.Sprintf("udp-flow needs a UDP port; %s is %s", sp.Name, proto)
	case c.Type == scenario.CheckTCPEstablished && proto != corev1.ProtocolTCP:
		return fmt.Sprintf("tcp-established needs a TCP port; %s is %s", sp.Name, proto)
	case c.Type == scenario.CheckAffinityMoves && !sp.ClientIPAffinity:
		return fmt.Sprintf("%s has no ClientIP affinity", sp.Name)
	case c.Type == scenario.CheckTCPEstablished && sp.ClientIPAffinity:
		return fmt.Sprintf("%s has ClientIP affinity: a connection whose entry was flushed would be sent back to its endpoint, so the check could not see a flush", sp.Name)
	}
	return ""
}

// established runs an established-flow check's phases from each client
// node.
func (s *suite) established(ctx context.Context, c *scenario.Check, nodes []string) {
	for _, nd := range nodes {
		for _, ph := range establishedPhases(c.Type) {
			if ctx.Err() != nil {
				return
			}
			var e *estCheck
			s.dumped(ctx, c, nd, ph, func() {
				switch c.Type {
				case scenario.CheckUDPFlow:
					e = s.udpFlow(ctx, c, nd, ph)
				case scenario.CheckTCPEstablished:
					e = s.tcpEstablished(ctx, c, nd, ph)
				default:
					e = s.affinityMoves(ctx, c, nd)
				}
			})
			s.restoreEstablished(ctx, e)
		}
	}
}
