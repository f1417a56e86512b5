package conform

// Checks and timing that are IPVS's own. The oracle says which endpoints are
// eligible and that the choice is uniform; IPVS makes the choice with a
// scheduler, so in ipvs mode a distribution check also asks what that
// scheduler promises:
//
//   - rr, wrr: a strict rotation per virtual server (kube-proxy programs
//     every real server with weight 1, so wrr's shares "in proportion to
//     the weights" are equal shares in the same rotation): every k
//     consecutive new connections reach the k eligible endpoints once each,
//     and n new connections are balanced to within one (a chi-square
//     against uniform would be vacuous: X^2 is about 0 by construction);
//   - lc, wlc, sed, nq: spread by held connections: with connections held
//     open on every endpoint but one, every new connection goes to the one
//     without (rr would spread them). These replace the chi-square test: a
//     SYN not yet answered counts as an active connection, so a burst
//     favours the endpoints that answer fastest;
//   - sh: every connection of a source address reaches the same endpoint
//     (the uniform split holds only over many addresses, so it replaces
//     the chi-square test);
//   - dh: every connection to the virtual server reaches one endpoint;
//   - mh (with kube-proxy's FlagSourceHash, the source port hashed too):
//     the chi-square test over many connections, and the same source
//     address and port reach the same endpoint again after the
//     connection's entry was replaced.
//
// Persistence (sessionAffinity ClientIP) is IPVS's template: see
// expiryIdle for how long it outlives timeoutSeconds.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// IPVS timing the checks depend on. The kernel's connection-table facts
// (how long a connection and a persistence template live) are the
// oracle's: oracle.IPVSCloseTimeout, oracle.IPVSTemplateHold.
const (
	// ipvsMaxExpiryWait bounds the idle an IPVS expiry check waits.
	ipvsMaxExpiryWait = 75 * time.Second
	// probeSpan bounds a probe's connection from its first packet to the
	// backend's reset.
	probeSpan = time.Second
)

// scheduler is the scenario's IPVS scheduler ("" is rr).
func (s *suite) scheduler() string {
	if p := s.l.Scenario.Proxy.IPVSScheduler; p != "" {
		return p
	}
	return scenario.DefaultIPVSScheduler
}

// ipvsExtraUnits counts the verdicts the IPVS scheduler checks add to a
// scenario's plan (the hash and least-connection schedulers' checks replace
// the chi-square verdict, the others add one per client node: nodes).
func ipvsExtraUnits(mode cluster.Mode, sc *scenario.Scenario, nodes func(*scenario.Check) []string) int {
	if mode != cluster.ModeIPVS {
		return 0
	}
	switch sc.Proxy.IPVSScheduler {
	case "sh", "dh", "lc", "wlc", "sed", "nq":
		return 0
	}
	n := 0
	for i := range sc.Checks {
		if c := &sc.Checks[i]; c.Type == scenario.CheckDistribution {
			n += max(1, len(nodes(c)))
		}
	}
	return n
}

// keepResets lets the backends' TCP resets through in ipvs mode (NewProber
// drops them to save the path back). A probe's IPVS connection then goes to
// CLOSE (10 s) instead of staying in SYN_RECV for 60 s, and a later probe
// that happens to reuse its source port is scheduled afresh, as
// conn_reuse_mode=1 does for a closed connection, instead of following the
// old entry (to a real server that may be gone: a drop).
func (s *suite) keepResets() error {
	for _, n := range s.topo.Nodes() {
		args := append([]string{"-w", "-D"}, replyDrops[0]...)
		if out, err := n.Backends.Exec("iptables-nft", args...); err != nil {
			return fmt.Errorf("backends of %s: could not let resets through: %w: %s", n.Config.Name, err, out)
		}
	}
	return nil
}

// expiryIdle is how long the affinity check lets its clients idle before
// checking that they choose afresh, and whether it checks at all: in every
// mode only a timeoutSeconds of at most maxExpiryWait is checked, so the
// same checks run in every mode.
//
// iptables and nftables forget a client timeoutSeconds after its last new
// connection. An IPVS persistence template may outlive it for as long as
// the oracle says (oracle.IPVSTemplateHold): a probe's connection lives
// 10 s in CLOSE after the backend's reset (300 s for UDP), so with
// timeoutSeconds up to about 10 s the template outlives the timeout by a
// whole minute. With real clients the connection stays 120 s in TIME_WAIT
// after a normal close, so affinity lasts up to about two minutes after the
// last connection closed, whatever timeoutSeconds says (kubernetes#89358);
// the oracle lists that deviation.
func (s *suite) expiryIdle(sp *cluster.ServicePort) (idle time.Duration, checked bool) {
	return expiryWait(s.o.Mode, sp)
}

// ipvsDistribution runs a distribution check the scheduler's way.
func (s *suite) ipvsDistribution(ctx context.Context, c *scenario.Check, node string) {
	switch s.scheduler() {
	case "rr", "wrr":
		s.ipvsBalance(ctx, c, node)
		s.ipvsRotation(ctx, c, node)
	case "lc", "wlc", "sed", "nq":
		// No uniformity test: a SYN not yet answered counts as an active
		// connection (IP_VS_TCP_S_SYN_RECV is active), so a burst favours
		// the endpoints that answer fastest, as it would in a cluster.
		s.ipvsHeld(ctx, c, node)
	case "mh":
		s.outcomeCheck(ctx, c, node, "")
		s.ipvsConsistency(ctx, c, node, "mh")
	case "sh", "dh":
		s.ipvsConsistency(ctx, c, node, s.scheduler())
	default:
		s.outcomeCheck(ctx, c, node, "")
	}
}

// ipvsCheck is the common part of the scheduler checks: the expected
// outcome, the client and the report entry.
type ipvsCheck struct {
	rc     *report.Check
	sp     *cluster.ServicePort
	want   oracle.Outcome
	eps    []string
	client *netns.Client
	vip    netip.AddrPort
	start  time.Time
}

func (s *suite) newIPVSCheck(c *scenario.Check, node, phase string) (*ipvsCheck, bool) {
	k := &ipvsCheck{start: time.Now()}
	k.rc = &report.Check{Name: c.Name + " @ " + node + " / " + phase, Type: c.Type, Service: c.Service, ClientNode: node, Phase: phase,
		Seed: s.seed, Alpha: s.alphaUnit, Test: "deterministic", P: 1}
	spn, sp, err := s.spn(c)
	if err != nil {
		k.rc.Verdict, k.rc.Message = report.Error, err.Error()
		return k, false
	}
	k.sp = sp
	k.client = s.clientOn(node)
	if k.client == nil {
		k.rc.Verdict, k.rc.Message = report.Error, "no client pod on node "+node
		return k, false
	}
	st := s.state()
	k.want = s.or.Expect(s.o.Mode, sp, st.Endpoints[spn], node, s.zone(node))
	k.eps = k.want.Endpoints()
	k.vip = netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))
	if k.want.Kind != oracle.Endpoints || len(k.eps) < 2 {
		k.rc.Test = "none"
		k.rc.Message = "not applicable: the oracle expects " + k.want.String()
		return k, false
	}
	return k, true
}

func (s *suite) finish(k *ipvsCheck) { s.fileVerdict(k.rc, k.start) }

// fileVerdict files a deterministic verdict that began at start: its
// duration, and pass unless it says otherwise (Holm decides at the end of
// the run).
func (s *suite) fileVerdict(rc *report.Check, start time.Time) {
	rc.Duration = time.Since(start)
	if rc.Verdict == "" {
		rc.Verdict = report.Pass
	}
	s.out.Checks = append(s.out.Checks, rc)
}

// fail marks a deterministic check as failed with a message.
func fail(rc *report.Check, bad int, format string, args ...any) {
	rc.P, rc.Statistic = 0, float64(bad)
	rc.Message = fmt.Sprintf(format, args...)
}

// probeOne sends one probe from src with the source port r draws and
// returns where it went: an endpoint, "REJECT" or "lost".
func (s *suite) probeOne(ctx context.Context, k *ipvsCheck, src netip.Addr, r *rand.Rand) (string, error) {
	return s.probeSingle(ctx, k.client, src, k.vip, protoOf(k.sp), r)
}

// probeSingle sends one new connection from client at src (a source port
// r draws) to vip, neither flushed nor counted, and returns where it went:
// an endpoint, "REJECT" or "lost".
func (s *suite) probeSingle(ctx context.Context, client *netns.Client, src netip.Addr, vip netip.AddrPort, proto traffic.Proto, r *rand.Rand) (string, error) {
	s.mc.phase()
	if _, err := s.mc.send(ctx, Probe{Client: client, Src: src, VIP: vip, Proto: proto, N: 1}, r); err != nil {
		return "", err
	}
	counts := s.mc.collect(1)
	for e, v := range counts.PerEndpoint() {
		if v > 0 {
			return e.String(), nil
		}
	}
	if counts.Rejected() > 0 {
		return "REJECT", nil
	}
	return "lost", nil
}

// ipvsRotation checks rr's strict rotation: probes sent one at a time,
// every k consecutive ones reach the k eligible endpoints once each.
func (s *suite) ipvsRotation(ctx context.Context, c *scenario.Check, node string) {
	k, ok := s.newIPVSCheck(c, node, s.scheduler()+" rotation")
	defer s.finish(k)
	if !ok {
		return
	}
	n := len(k.eps)
	total := n * max(10, 60/n)
	s.mc.quiesce()
	s.mc.flush()
	seq := make([]string, 0, total)
	for i := 0; i < total; i++ {
		e, err := s.probeOne(ctx, k, k.client.Config.Addrs[0], s.rng)
		if err != nil {
			k.rc.Verdict, k.rc.Message = report.Error, err.Error()
			return
		}
		seq = append(seq, e)
	}
	k.rc.N = total
	k.rc.Table = tableOf(seq, k.eps, 1/float64(n))
	bad := 0
	for i := 0; i+n <= len(seq); i++ {
		win := map[string]bool{}
		for _, e := range seq[i : i+n] {
			if k.want.Allows(e) {
				win[e] = true
			}
		}
		if len(win) != n {
			bad++
		}
	}
	if bad > 0 {
		fail(k.rc, bad, "%d of %d windows of %d consecutive connections missed an endpoint: not a strict rotation (first connections: %s)",
			bad, len(seq)-n+1, n, strings.Join(seq[:min(len(seq), 3*n)], " "))
	}
}

// tableOf counts a sequence of outcomes per endpoint (and anything else
// observed), with the expected share p of each endpoint.
func tableOf(seq []string, eps []string, p float64) []report.Row {
	cnt := map[string]int{}
	for _, e := range seq {
		cnt[e]++
	}
	var rows []report.Row
	for _, e := range eps {
		rows = append(rows, report.Row{Outcome: e, Observed: float64(cnt[e]), Expected: p * float64(len(seq))})
		delete(cnt, e)
	}
	var rest []string
	for e := range cnt {
		rest = append(rest, e)
	}
	sort.Strings(rest)
	for _, e := range rest {
		rows = append(rows, report.Row{Outcome: e, Observed: float64(cnt[e])})
	}
	return rows
}

// heldPerEndpoint is how many connections the least-connection check holds
// open on each endpoint; heldProbes how many new connections it then sends.
const (
	heldPerEndpoint = 3
	heldProbes      = 20
)

// ipvsHeld checks the least-connection schedulers: hold heldPerEndpoint
// real TCP connections per eligible endpoint (they spread evenly, since an
// active connection weighs 256 inactive ones), close those of one endpoint,
// then every new connection must go to it.
func (s *suite) ipvsHeld(ctx context.Context, c *scenario.Check, node string) {
	k, ok := s.newIPVSCheck(c, node, s.scheduler()+" held connections")
	defer s.finish(k)
	if !ok {
		return
	}
	if _, err := s.kernelOnly("the least-connection check (real TCP connections)"); err != nil {
		k.rc.Verdict, k.rc.Message = report.Error, err.Error()
		return
	}
	s.mc.quiesce()
	h, err := s.hold(ctx, k, heldPerEndpoint*len(k.eps))
	defer h.close()
	if err != nil {
		k.rc.Verdict, k.rc.Message = report.Error, err.Error()
		return
	}
	spread := map[string]int{}
	for _, e := range h.at {
		spread[e]++
	}
	for _, e := range k.eps {
		if spread[e] != heldPerEndpoint {
			fail(k.rc, 1, "held connections are not spread evenly: %v", spread)
			k.rc.N = len(h.at)
			return
		}
	}
	// Close the held connections of the first endpoint: it is now the only
	// one without active connections. Close the listeners too, so that a
	// probe is answered with a reset (its connection then turns inactive)
	// rather than a SYN-ACK (it would stay SYN_RECV, which counts as active).
	free := k.eps[0]
	h.closeAt(free)
	h.closeListeners()
	time.Sleep(200 * time.Millisecond)
	seq := make([]string, 0, heldProbes)
	for i := 0; i < heldProbes; i++ {
		e, err := s.probeOne(ctx, k, k.client.Config.Addrs[0], s.rng)
		if err != nil {
			k.rc.Verdict, k.rc.Message = report.Error, err.Error()
			return
		}
		seq = append(seq, e)
	}
	k.rc.N = len(seq)
	got := 0
	for _, e := range seq {
		if e == free {
			got++
		}
	}
	for _, r := range tableOf(seq, k.eps, 0) {
		if r.Outcome == free {
			r.Expected = float64(len(seq))
		}
		k.rc.Table = append(k.rc.Table, r)
	}
	if got != len(seq) {
		fail(k.rc, len(seq)-got, "%d of %d new connections went elsewhere than %s, the only endpoint without held connections", len(seq)-got, len(seq), free)
	}
}

// held is a set of real TCP connections through the virtual server, with
// the listeners that accepted them in the backend namespaces.
type held struct {
	mu        sync.Mutex
	listeners []net.Listener
	clients   []net.Conn
	servers   []net.Conn
	at        []string       // endpoint of each client connection
	byID      map[int]string // connection number (its hello) -> endpoint
	accepted  chan struct{}
	closed    bool // close ran: a late accept is closed at once
}

func (h *held) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, c := range h.clients {
		c.Close()
	}
	for _, c := range h.servers {
		c.Close()
	}
	for _, l := range h.listeners {
		l.Close()
	}
}

func (h *held) closeListeners() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.listeners {
		l.Close()
	}
}

func (h *held) closeAt(ep string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, c := range h.clients {
		if h.at[i] == ep {
			c.Close()
		}
	}
	for _, c := range h.servers {
		if c.LocalAddr().String() == ep {
			c.Close()
		}
	}
}

// hold opens n TCP connections from the check's client to its virtual
// server (holdConns).
func (s *suite) hold(ctx context.Context, k *ipvsCheck, n int) (*held, error) {
	return s.holdConns(ctx, k.client, k.client.Config.Addrs[0], k.vip, k.eps, n, false)
}

// holdConns opens n TCP connections from client at src to vip, one after
// the other, each accepted by a listener on its endpoint's address (of
// eps, "ip:port") in the backend namespace, and records where each landed:
// each connection first sends its number (hello), which the endpoint that
// accepts it reads, whatever source address and port the node gave it
// (masquerade). With echo, the accepted connections then echo what they
// read.
func (s *suite) holdConns(ctx context.Context, client *netns.Client, src netip.Addr, vip netip.AddrPort, eps []string, n int, echo bool) (*held, error) {
	h := &held{byID: map[int]string{}, accepted: make(chan struct{}, 64)}
	for _, e := range eps {
		if err := h.listen(s.topo, e, echo); err != nil {
			return h, err
		}
	}
	for i := 0; i < n; i++ {
		c, err := s.dialHeld(ctx, client, src, vip)
		if err != nil {
			return h, fmt.Errorf("could not hold connection %d of %d to %s: %w", i+1, n, vip, err)
		}
		h.mu.Lock()
		h.clients = append(h.clients, c)
		h.mu.Unlock()
		if _, err := c.Write(hello(i)); err != nil {
			return h, fmt.Errorf("connection %d to %s: could not send its hello: %w", i+1, vip, err)
		}
		if err := h.await(i); err != nil {
			return h, fmt.Errorf("connection %d to %s: %w", i+1, vip, err)
		}
	}
	return h, nil
}

// heldPortLo and heldPortHi bound the source ports of held connections:
// below the probes' (portLo), so that no probe's 5-tuple meets a held
// connection's entry.
const (
	heldPortLo = 1024
	heldPortHi = portLo
)

// dialHeld connects from client at src, from a source port below the
// probes' drawn at random (another one when the kernel refuses it: in use,
// or a TIME_WAIT of an earlier connection; at most 8 tries).
func (s *suite) dialHeld(ctx context.Context, client *netns.Client, src netip.Addr, vip netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	var err error
	for try := 0; try < 8; try++ {
		local := &net.TCPAddr{IP: src.AsSlice(), Port: heldPortLo + s.rng.IntN(heldPortHi-heldPortLo)}
		err = client.NS.Do(func() (err error) {
			d := net.Dialer{Timeout: timeScaled(3 * time.Second), LocalAddr: local}
			c, err = d.DialContext(ctx, "tcp4", vip.String())
			return err
		})
		if err == nil || !errors.Is(err, unix.EADDRINUSE) && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return c, err
		}
	}
	return nil, err
}

// listen accepts on endpoint e ("ip:port") in its backend namespace.
func (h *held) listen(t *netns.Topology, e string, echo bool) error {
	ap := netip.MustParseAddrPort(e)
	be, ok := t.BackendFor(ap.Addr())
	if !ok {
		return fmt.Errorf("no backend namespace holds %s", e)
	}
	var l net.Listener
	if err := be.Do(func() (err error) { l, err = net.Listen("tcp4", e); return }); err != nil {
		return fmt.Errorf("could not listen on %s: %w", e, err)
	}
	h.mu.Lock()
	h.listeners = append(h.listeners, l)
	h.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			if h.closed {
				h.mu.Unlock()
				c.Close()
				return
			}
			h.servers = append(h.servers, c)
			h.mu.Unlock()
			go h.serve(c, echo)
		}
	}()
	return nil
}

// helloLen is the length of a held connection's hello.
const helloLen = 16

func hello(i int) []byte { return []byte(fmt.Sprintf("kpsim-hello-%04d", i)) }

// serve reads an accepted connection's hello (bounded), records where the
// connection landed, and echoes after it when echo is set.
func (h *held) serve(c net.Conn, echo bool) {
	b := make([]byte, helloLen)
	_ = c.SetReadDeadline(time.Now().Add(timeScaled(3 * time.Second)))
	if _, err := io.ReadFull(c, b); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var i int
	if _, err := fmt.Sscanf(string(b), "kpsim-hello-%04d", &i); err != nil {
		return
	}
	h.mu.Lock()
	h.byID[i] = c.LocalAddr().String()
	h.mu.Unlock()
	select { // a wake-up for await; it also polls
	case h.accepted <- struct{}{}:
	default:
	}
	if echo {
		_, _ = io.Copy(c, c)
	}
}

// await records the endpoint that accepted connection i (bounded: 3 s,
// stretched with the run's waits).
func (h *held) await(i int) error {
	deadline := time.After(timeScaled(3 * time.Second))
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		h.mu.Lock()
		e, ok := h.byID[i]
		if ok {
			h.at = append(h.at, e)
		}
		h.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-h.accepted:
		case <-poll.C:
		case <-deadline:
			return errors.New("not accepted by any endpoint")
		}
	}
}

// consistencyProbes is how many connections each source (address, or
// address and port for mh) sends.
const consistencyProbes = 10

// ipvsConsistency checks the hash schedulers: sh maps each source address
// to one endpoint, dh the virtual server to one endpoint, mh (with the
// source port hashed) each source address and port to one endpoint, the
// same again once the connection's entry is replaced.
func (s *suite) ipvsConsistency(ctx context.Context, c *scenario.Check, node, sched string) {
	k, ok := s.newIPVSCheck(c, node, sched+" consistency")
	defer s.finish(k)
	if !ok {
		return
	}
	var addrs []netip.Addr
	for _, cl := range s.mc.clients() {
		if cl.Node == node {
			addrs = append(addrs, cl.Config.Addrs...)
		}
	}
	s.mc.quiesce()
	if sched == "mh" {
		s.mhConsistency(ctx, k)
		return
	}
	s.mc.flush()
	s.mc.phase()
	clients := map[netip.Addr]*netns.Client{}
	for _, cl := range s.mc.clients() {
		for _, a := range cl.Config.Addrs {
			clients[a] = cl
		}
	}
	sent := 0
	for _, a := range addrs {
		n, err := s.mc.send(ctx, Probe{Client: clients[a], Src: a, VIP: k.vip, Proto: protoOf(k.sp), N: consistencyProbes}, s.rng)
		sent += n
		if err != nil {
			k.rc.Verdict, k.rc.Message = report.Error, err.Error()
			return
		}
	}
	counts := s.mc.collect(sent)
	k.rc.N = sent
	bySrc := map[netip.Addr]map[string]int{}
	total := map[string]int{}
	arrived := 0
	for key, v := range counts.Arrivals {
		if bySrc[key.Client] == nil {
			bySrc[key.Client] = map[string]int{}
		}
		bySrc[key.Client][key.Endpoint.String()] += v
		total[key.Endpoint.String()] += v
		arrived += v
	}
	for _, e := range k.eps {
		k.rc.Table = append(k.rc.Table, report.Row{Outcome: e, Observed: float64(total[e])})
	}
	lost := sent - arrived
	if lost > 0 {
		k.rc.Table = append(k.rc.Table, report.Row{Outcome: "REJECT or lost", Observed: float64(lost)})
	}
	var bad []string
	for e := range total {
		if !k.want.Allows(e) {
			bad = append(bad, e+" is not eligible")
		}
	}
	switch sched {
	case "sh":
		for _, a := range addrs {
			if len(bySrc[a]) > 1 {
				bad = append(bad, fmt.Sprintf("source %s reached %d endpoints", a, len(bySrc[a])))
			}
		}
	case "dh":
		if len(total) > 1 {
			bad = append(bad, fmt.Sprintf("the virtual server's connections reached %d endpoints", len(total)))
		}
	}
	if lost > 0 {
		bad = append(bad, fmt.Sprintf("%d of %d connections were rejected or lost", lost, sent))
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		fail(k.rc, len(bad), "%s: %s", sched, strings.Join(bad, "; "))
	}
}

// mhConsistency probes mhPairs source ports one at a time, replaces their
// connection entries (the conntrack flush, then a SYN on a closed IPVS
// connection is scheduled afresh) and probes the same ports again: each must
// reach its endpoint again.
func (s *suite) mhConsistency(ctx context.Context, k *ipvsCheck) {
	const mhPairs = 20
	src := k.client.Config.Addrs[0]
	first := make([]string, mhPairs)
	seed := s.rng.Uint64()
	for round := 0; round < 2; round++ {
		s.mc.flush()
		for i := 0; i < mhPairs; i++ {
			// The same generator state gives the same source port.
			e, err := s.probeOne(ctx, k, src, rand.New(rand.NewPCG(seed, uint64(i))))
			if err != nil {
				k.rc.Verdict, k.rc.Message = report.Error, err.Error()
				return
			}
			if round == 0 {
				first[i] = e
				continue
			}
			k.rc.N += 2
			if e != first[i] || !k.want.Allows(e) {
				k.rc.Statistic++
			}
		}
	}
	k.rc.Table = tableOf(first, k.eps, 1/float64(len(k.eps)))
	if k.rc.Statistic > 0 {
		fail(k.rc, int(k.rc.Statistic), "mh: %.0f of %d source ports reached another endpoint (or none) the second time", k.rc.Statistic, mhPairs)
	}
	if slices.Contains(first, "lost") || slices.Contains(first, "REJECT") {
		fail(k.rc, int(k.rc.Statistic)+1, "mh: connections were rejected or lost: %v", first)
	}
}
