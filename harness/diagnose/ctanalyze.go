package diagnose

// The conntrack analysis (--conntrack): which service port each entry of
// the node's conntrack table belongs to, which endpoint it is pinned to,
// how much of the port's traffic sits on long-lived entries, whether the
// long-lived connections are split as the rules intend, and which entries
// point at endpoints the rules no longer list.
//
//	conntrack -L ─► ReadConntrack ─► entries
//	                                   │  original destination: the port's own address:port/proto,
//	                                   │  a Frontend (external / load-balancer IP:port; a node port
//	                                   │  on any address, when the entry was translated)
//	                                   ▼
//	               per port: entries per endpoint (reply source) and class (TCP established, other
//	                         TCP, UDP, other); long-lived = TCP ESTABLISHED + ASSURED; stale = reply
//	                         source not listed by the rules; untranslated = reply source is the
//	                         original destination
//	                                   │  long-lived entries through destinations split like the port's
//	                                   │  own (not externalTrafficPolicy Local ones): Pearson chi-square
//	                                   │  against the intended split (clients instead with affinity),
//	                                   │  Holm over the tested ports, simultaneous intervals
//	                                   ▼
//	               ConntrackReport + findings: long-lived-skew (traffic), stale-udp-conntrack and
//	               untranslated-udp-conntrack (conntrack); notes for TCP
//
// A conntrack entry is the NAT decision of one connection (one UDP flow),
// made by the rules in force when its first packet came: the table shows
// where the node's open connections are pinned, which the rules' counters
// (new connections since they were written) cannot.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/harness/stats"
)

// LongLivedDefinition says what the report counts as long-lived.
const LongLivedDefinition = "TCP entries in state ESTABLISHED with [ASSURED] (the handshake completed): such a connection keeps the endpoint its first packet's DNAT chose until it closes, or until it stays idle for the established timeout (nf_conntrack_tcp_timeout_established, 432000 s = 5 days by default; the entry's timeout column is what is left of it); a rule change never moves it"

// Conntrack finding kinds.
const (
	KindLongLivedSkew    = "long-lived-skew"
	KindStaleUDP         = "stale-udp-conntrack"
	KindUntranslatedUDP  = "untranslated-udp-conntrack"
	KindStaleTCP         = "stale-tcp-conntrack"
	KindUntranslatedTCP  = "untranslated-tcp-conntrack"
	KindLongLivedTooFew  = "too-few-long-lived"
	KindConntrackCount   = "conntrack-count"
	KindConntrackOutside = "conntrack-not-service"
)

// AboutConntrack: the node's conntrack table holds entries kube-proxy's
// cleanup deletes (UDP entries to a service port whose reply source is
// not an endpoint the rules list).
const AboutConntrack = "conntrack"

func init() {
	aboutOf[KindLongLivedSkew] = AboutTraffic
	aboutOf[KindStaleUDP] = AboutConntrack
	aboutOf[KindUntranslatedUDP] = AboutConntrack
}

// Counts splits entries by protocol and state.
type Counts struct {
	TCPEstablished int `json:"tcpEstablished"`
	TCPOther       int `json:"tcpOther"` // SYN_SENT, TIME_WAIT, CLOSE_WAIT, …
	UDP            int `json:"udp"`
	Other          int `json:"other"` // SCTP, ICMP, GRE, …
}

func (c *Counts) add(f *Flow) {
	switch {
	case f.Proto == "tcp" && f.State == "ESTABLISHED":
		c.TCPEstablished++
	case f.Proto == "tcp":
		c.TCPOther++
	case f.Proto == "udp":
		c.UDP++
	default:
		c.Other++
	}
}

// Total is every entry counted.
func (c Counts) Total() int { return c.TCPEstablished + c.TCPOther + c.UDP + c.Other }

// Remaining summarises entries' timeouts: the seconds left.
type Remaining struct {
	Min    int `json:"min"`
	Median int `json:"median"`
	Max    int `json:"max"`
}

func remaining(ts []int) *Remaining {
	if len(ts) == 0 {
		return nil
	}
	s := slices.Clone(ts)
	slices.Sort(s)
	return &Remaining{Min: s[0], Median: s[len(s)/2], Max: s[len(s)-1]}
}

func (r *Remaining) String() string {
	if r == nil {
		return "-"
	}
	days := ""
	if r.Max >= 86400 {
		days = fmt.Sprintf(", %.1f days", float64(r.Max)/86400)
	}
	if r.Min == r.Max {
		return fmt.Sprintf("%d s%s", r.Min, days)
	}
	return fmt.Sprintf("%d-%d s (median %d%s)", r.Min, r.Max, r.Median, days)
}

// IsLongLived reports whether an entry is long-lived (LongLivedDefinition).
func IsLongLived(f *Flow) bool { return f.Proto == "tcp" && f.State == "ESTABLISHED" && f.Assured }

// ConntrackReport is what the conntrack table says about the node.
type ConntrackReport struct {
	File       string `json:"file"`
	Definition string `json:"longLivedDefinition"`
	// Entries is every entry read, Shown conntrack's own count (-1 when
	// the file lacks it).
	Entries int `json:"entries"`
	Shown   int `json:"shown"`
	// Service counts the entries whose original destination is a
	// destination of a service port of the dump, by class; NotService
	// the others (IPv6 entries among them: the dump is read for IPv4).
	Service    Counts `json:"service"`
	NotService Counts `json:"notService"`
	IPv6       int    `json:"ipv6,omitempty"`
	// LongLived is how many of Service are long-lived, Share their part
	// with a Clopper-Pearson interval at 1 − Alpha.
	LongLived int        `json:"longLived"`
	Share     Float      `json:"longLivedShare"`
	ShareLo   Float      `json:"longLivedShareLo"`
	ShareHi   Float      `json:"longLivedShareHi"`
	Remaining *Remaining `json:"longLivedRemaining,omitempty"`
	// Tested is how many ports' long-lived split was tested (Holm over
	// them at Alpha, a family of its own beside the counters' tests).
	Tested int       `json:"tested"`
	Alpha  float64   `json:"alpha"`
	Ports  []*CTPort `json:"ports"`
}

// CTPort is one service port's entries.
type CTPort struct {
	Port      string       `json:"port"`
	Key       string       `json:"key"`
	Counts    Counts       `json:"counts"`
	LongLived int          `json:"longLived"`
	Share     Float        `json:"longLivedShare"`
	Remaining *Remaining   `json:"longLivedRemaining,omitempty"`
	Frontends []CTFrontend `json:"destinations"`
	// Endpoints are the port's endpoints in the rules' order (with no
	// entry too), then other addresses the rules list for a destination,
	// then reply sources the rules do not list (Listed false: stale).
	Endpoints []*CTEndpoint `json:"endpoints"`
	// Untranslated counts entries whose reply source is the original
	// destination: no DNAT was applied.
	Untranslated Counts `json:"untranslated"`
	// Tested names what the test counted: "long-lived connections",
	// "clients" (ClientIP affinity: one client's connections follow its
	// first), or "" (no test; Verdict says why).
	Tested   string        `json:"tested,omitempty"`
	TestN    int           `json:"testN,omitempty"`
	Chi      *stats.Result `json:"chiSquare,omitempty"`
	P        Float         `json:"p"`
	Adjusted Float         `json:"holmAdjustedP"`
	Rejected bool          `json:"rejected"`
	// Verdict: "as intended", "pinned unevenly", "too few", "no
	// long-lived", "single endpoint", "no endpoints", "not tested" (a
	// scheduler that splits by load or source, or long-lived entries only
	// through externalTrafficPolicy Local destinations).
	Verdict string `json:"verdict"`

	pr      *PortReport
	byAddr  map[netip.AddrPort]*CTEndpoint
	listed  map[netip.AddrPort]bool
	untrans []Line
	ltimes  []int
	own     int // Endpoints[:own] are the port's own endpoints, in the rules' order
}

// CTFrontend is one destination of a port and its entries.
type CTFrontend struct {
	What      string `json:"what"` // "service address", "external IP", "load-balancer IP", "node port"
	Dest      string `json:"dest"` // "172.30.0.42:80", "*:30010"
	Entries   int    `json:"entries"`
	LongLived int    `json:"longLived"`
	// Tested reports that its long-lived entries are in the port's test
	// (false for externalTrafficPolicy Local destinations: outside
	// clients reach only this node's endpoints).
	Tested bool `json:"tested"`
}

// CTEndpoint is one reply source of a port.
type CTEndpoint struct {
	Addr      netip.AddrPort `json:"addr"`
	Listed    bool           `json:"listed"`
	Counts    Counts         `json:"counts"`
	LongLived int            `json:"longLived"`
	// Tested is its count in the port's test (long-lived entries through
	// tested destinations, or their clients), Intended its share in the
	// rules, Share the observed one with a simultaneous interval.
	Tested    int        `json:"tested"`
	Intended  float64    `json:"intended"`
	Expected  float64    `json:"expected"`
	Share     float64    `json:"share"`
	Lo        Float      `json:"lo"`
	Hi        Float      `json:"hi"`
	Pinned    string     `json:"pinned,omitempty"` // "more" or "less" than its share (interval beyond it)
	Remaining *Remaining `json:"longLivedRemaining,omitempty"`
	Evidence  Line       `json:"evidence"`

	clients  map[netip.Addr]bool
	times    []int
	lines    []Line // the entries of a reply source the rules do not list
	longLine Line   // its first long-lived entry
}

// ctKey is an original destination: address (invalid for a node port),
// port and protocol.
type ctKey struct {
	addr  netip.Addr
	port  int
	proto string
}

// ctTarget is the port and destination an original destination leads to.
type ctTarget struct {
	cp    *CTPort
	front int
}

type ctIndex map[ctKey]ctTarget

// lookup finds an entry's port: its original destination as one of a
// port's addresses, else (when a DNAT was applied) as a node port. The
// node's own addresses are not in the dump, so an untranslated entry to a
// node port's number is not counted as the port's.
func (idx ctIndex) lookup(f *Flow) (ctTarget, bool) {
	if f.Family != "ipv4" || f.Orig.DPort == 0 {
		return ctTarget{}, false
	}
	if t, ok := idx[ctKey{f.Orig.Dst, f.Orig.DPort, f.Proto}]; ok {
		return t, true
	}
	if translated(f) {
		t, ok := idx[ctKey{netip.Addr{}, f.Orig.DPort, f.Proto}]
		return t, ok
	}
	return ctTarget{}, false
}

// translated reports a DNAT: the answers come from elsewhere than the
// original destination.
func translated(f *Flow) bool { return f.Reply.Src != f.Orig.Dst || f.Reply.SPort != f.Orig.DPort }

// analyzeConntrack adds the conntrack report and its findings.
func (r *Report) analyzeConntrack(ct *Conntrack) {
	cr := &ConntrackReport{File: ct.File, Definition: LongLivedDefinition, Entries: len(ct.Entries), Shown: ct.Shown,
		Alpha: r.Alpha, Share: nan, ShareLo: nan, ShareHi: nan, Ports: []*CTPort{}}
	r.Conntrack = cr
	idx := r.ctIndex(cr)
	var times []int
	for _, f := range ct.Entries {
		t, ok := idx.lookup(f)
		if !ok {
			cr.NotService.add(f)
			if f.Family == "ipv6" {
				cr.IPv6++
			}
			continue
		}
		cr.Service.add(f)
		if IsLongLived(f) {
			cr.LongLived++
			times = append(times, f.Timeout)
		}
		t.cp.addFlow(f, t.front)
	}
	if n := cr.Service.Total(); n > 0 {
		cr.Share = Float(float64(cr.LongLived) / float64(n))
		lo, hi := stats.ClopperPearson(cr.LongLived, n, 1-r.Alpha)
		cr.ShareLo, cr.ShareHi = Float(lo), Float(hi)
	}
	cr.Remaining = remaining(times)
	for _, cp := range cr.Ports {
		cp.summarise()
	}
	r.ctTest(cr)
	r.ctFindings(cr)
}

// ctIndex makes a CTPort per port of the dump and indexes its
// destinations: its own address and its Frontends.
func (r *Report) ctIndex(cr *ConntrackReport) ctIndex {
	idx := ctIndex{}
	put := func(k ctKey, t ctTarget) {
		if _, dup := idx[k]; !dup {
			idx[k] = t
		}
	}
	labels := map[string]int{}
	for _, pr := range r.Ports {
		labels[pr.Label()]++
	}
	for _, pr := range r.Ports {
		p := pr.port
		if p.FWMark != 0 {
			continue // an IPVS firewall-mark service has no address
		}
		label := pr.Label()
		if labels[label] > 1 { // nftables external IPs, IPVS virtual servers: one name, several ports
			label += " " + pr.Key
		}
		cp := &CTPort{Port: label, Key: pr.Key, Share: nan, P: nan, Adjusted: nan, pr: pr,
			byAddr: map[netip.AddrPort]*CTEndpoint{}, listed: map[netip.AddrPort]bool{}}
		for _, e := range pr.Endpoints {
			cp.listed[e.Addr] = true
			cp.endpoint(e.Addr).Intended += e.Intended // a repeated address: its shares add up
		}
		cp.own = len(cp.Endpoints)
		if xp := p.External; xp != nil {
			for _, ap := range xp.Reachable {
				cp.listed[ap] = true // pods and the node reach the cluster endpoints through an external path
			}
		}
		cp.Frontends = append(cp.Frontends, CTFrontend{What: "service address", Dest: netip.AddrPortFrom(p.ClusterIP, uint16(p.Port)).String(), Tested: !p.ExternalLocal})
		put(ctKey{p.ClusterIP, p.Port, p.Protocol}, ctTarget{cp, 0})
		for _, f := range p.Frontends {
			dest := fmt.Sprintf("*:%d", f.Port)
			if f.Addr.IsValid() {
				dest = netip.AddrPortFrom(f.Addr, uint16(f.Port)).String()
			}
			cp.Frontends = append(cp.Frontends, CTFrontend{What: f.What, Dest: dest, Tested: !f.Local})
			for _, ep := range f.Endpoints {
				cp.listed[ep] = true
			}
			put(ctKey{f.Addr, f.Port, p.Protocol}, ctTarget{cp, len(cp.Frontends) - 1})
		}
		cr.Ports = append(cr.Ports, cp)
	}
	return idx
}

// endpoint returns the port's entry for a reply source, made on first use.
func (cp *CTPort) endpoint(ap netip.AddrPort) *CTEndpoint {
	e := cp.byAddr[ap]
	if e == nil {
		e = &CTEndpoint{Addr: ap, Listed: cp.listed[ap], Lo: nan, Hi: nan, clients: map[netip.Addr]bool{}}
		cp.byAddr[ap] = e
		cp.Endpoints = append(cp.Endpoints, e)
	}
	return e
}

// addFlow counts one entry of the port, reached through destination front.
func (cp *CTPort) addFlow(f *Flow, front int) {
	cp.Counts.add(f)
	fr := &cp.Frontends[front]
	fr.Entries++
	long := IsLongLived(f)
	if long {
		cp.LongLived++
		fr.LongLived++
		cp.ltimes = append(cp.ltimes, f.Timeout)
	}
	if !translated(f) {
		cp.Untranslated.add(f)
		cp.untrans = append(cp.untrans, f.Line)
		return
	}
	e := cp.endpoint(netip.AddrPortFrom(f.Reply.Src, uint16(f.Reply.SPort)))
	e.Counts.add(f)
	if e.Evidence.Line == 0 {
		e.Evidence = f.Line
	}
	if !e.Listed {
		e.lines = append(e.lines, f.Line)
	}
	if !long {
		return
	}
	e.LongLived++
	e.times = append(e.times, f.Timeout)
	if e.longLine.Line == 0 {
		e.longLine = f.Line
	}
	if fr.Tested && e.Intended > 0 { // one of the test's cells
		e.Tested++
		e.clients[f.Orig.Src] = true
	}
}

// summarise orders the endpoints (the rules' own first, then other
// listed addresses, then stale ones) and fills the shares and timeouts.
func (cp *CTPort) summarise() {
	slices.SortStableFunc(cp.Endpoints[cp.own:], func(a, b *CTEndpoint) int {
		if a.Listed != b.Listed {
			return boolInt(!a.Listed) - boolInt(!b.Listed)
		}
		return a.Addr.Compare(b.Addr)
	})
	if n := cp.Counts.Total(); n > 0 {
		cp.Share = Float(float64(cp.LongLived) / float64(n))
	}
	cp.Remaining = remaining(cp.ltimes)
	for _, e := range cp.Endpoints {
		e.Remaining = remaining(e.times)
	}
}

// ctTest tests each port's long-lived split, Holm over the tested ports.
func (r *Report) ctTest(cr *ConntrackReport) {
	var cands []*CTPort
	for _, cp := range cr.Ports {
		if r.ctPrepare(cp) {
			cands = append(cands, cp)
		}
	}
	cr.Tested = len(cands)
	ps := make([]float64, len(cands))
	for i, cp := range cands {
		ps[i] = float64(cp.P)
	}
	rej := stats.Holm(ps, r.Alpha)
	adj := stats.HolmAdjusted(ps)
	for i, cp := range cands {
		cp.Rejected, cp.Adjusted = rej[i], Float(adj[i])
		cp.Verdict = "as intended"
		if !cp.Rejected {
			continue
		}
		cp.Verdict = "pinned unevenly"
		for _, e := range cp.cells() {
			switch {
			case e.Lo.Valid() && float64(e.Lo) > e.Expected/float64(cp.TestN):
				e.Pinned = "more"
			case e.Hi.Valid() && float64(e.Hi) < e.Expected/float64(cp.TestN):
				e.Pinned = "less"
			}
		}
	}
}

// cells are the endpoints a port's test counts: the rules' own endpoints
// with a positive share (an IPVS real server of weight 0 drains and takes
// no new connection).
func (cp *CTPort) cells() []*CTEndpoint {
	var out []*CTEndpoint
	for _, e := range cp.Endpoints[:cp.own] {
		if e.Intended > 0 {
			out = append(out, e)
		}
	}
	return out
}

// ctPrepare fills a port's tested counts, shares and intervals and runs
// its test; it reports whether the port takes part in Holm.
func (r *Report) ctPrepare(cp *CTPort) bool {
	p := cp.pr.port
	if len(cp.pr.Endpoints) == 0 {
		cp.Verdict = "no endpoints"
		return false
	}
	cp.Tested = "long-lived connections"
	if p.Affinity != nil {
		cp.Tested = "clients"
		for _, e := range cp.cells() {
			e.Tested = len(e.clients)
		}
	}
	cells := cp.cells()
	counts := make([]float64, len(cells))
	intended := make([]float64, len(cells))
	for i, e := range cells {
		counts[i], intended[i] = float64(e.Tested), e.Intended
	}
	intended = normalise(intended)
	n := sum64(counts)
	cp.TestN = int(n)
	if n > 0 {
		lo, hi := stats.SimultaneousIntervals(counts, 1-r.Alpha)
		for i, e := range cells {
			e.Expected, e.Share = n*intended[i], counts[i]/n
			e.Lo, e.Hi = Float(lo[i]), Float(hi[i])
		}
	}
	switch {
	case n == 0 && cp.LongLived > 0:
		cp.Verdict = "not tested" // its long-lived entries came through externalTrafficPolicy Local destinations
	case n == 0:
		cp.Verdict = "no long-lived"
	case !p.Exact:
		cp.Verdict = "not tested" // a scheduler that splits by load or source
	case len(cells) < 2:
		cp.Verdict = "single endpoint"
	case n*minPositive(intended) < stats.MinExpected:
		cp.Verdict = "too few"
	default:
		chi, err := stats.ChiSquareGOF(counts, intended)
		if err != nil {
			cp.Verdict = "too few"
			return false
		}
		cp.Chi, cp.P = &chi, Float(chi.P)
		return true
	}
	return false
}

// maxCTEvidence bounds the entry lines one conntrack finding carries (a
// busy node has thousands).
const maxCTEvidence = 20

func capLines(ls []Line) []Line {
	if len(ls) > maxCTEvidence {
		return ls[:maxCTEvidence]
	}
	return ls
}

// ctFindings states what the conntrack report shows.
func (r *Report) ctFindings(cr *ConntrackReport) {
	var few []string
	for _, cp := range cr.Ports {
		if cp.Rejected {
			r.ctSkew(cp)
		}
		if cp.Verdict == "too few" {
			need := int(stats.MinExpected/minPositive(normalise(cellShares(cp))) + 0.999999)
			few = append(few, fmt.Sprintf("%s (%d %s, a test needs %d)", cp.Port, cp.TestN, strings.TrimSuffix(cp.Tested, "s")+"(s)", need))
		}
		r.ctStale(cp)
	}
	if len(few) > 0 {
		r.add(LevelNote, KindLongLivedTooFew, nil, fmt.Sprintf("too few long-lived connections to test their split (an expected %g per endpoint): %s",
			stats.MinExpected, strings.Join(capList(few), ", ")))
	}
	if cr.Shown >= 0 && cr.Shown != cr.Entries {
		r.add(LevelNote, KindConntrackCount, nil, fmt.Sprintf("%s holds %d entries where conntrack said it showed %d: the file is cut, or holds more than one listing", cr.File, cr.Entries, cr.Shown))
	}
	if n := cr.NotService.Total(); n > 0 {
		msg := fmt.Sprintf("%d of %d conntrack entries are not addressed to a service port of the dump (other traffic of the node; node ports count only when translated, the node's addresses not being in the dump)", n, cr.Entries)
		if cr.IPv6 > 0 {
			msg += fmt.Sprintf("; %d of them are IPv6, which the dump is not read for", cr.IPv6)
		}
		r.add(LevelNote, KindConntrackOutside, nil, msg)
	}
}

func cellShares(cp *CTPort) []float64 {
	var out []float64
	for _, e := range cp.cells() {
		out = append(out, e.Intended)
	}
	return out
}

// ctSkew is the finding of a port whose long-lived split the test rejects.
func (r *Report) ctSkew(cp *CTPort) {
	var more, less, all []string
	var ev []Line
	for _, e := range cp.cells() {
		w := fmt.Sprintf("%s holds %d (%.3f, interval [%.3f, %.3f], intended %.3f)", e.Addr, e.Tested, e.Share, float64(e.Lo), float64(e.Hi), e.Expected/float64(cp.TestN))
		all = append(all, w)
		switch e.Pinned {
		case "more":
			more = append(more, w)
		case "less":
			less = append(less, w)
		}
		if e.longLine.Line > 0 {
			ev = append(ev, e.longLine)
		}
	}
	what := fmt.Sprintf("%d long-lived connections", cp.TestN)
	if cp.Tested == "clients" {
		what = fmt.Sprintf("the long-lived connections of %d client(s) (ClientIP affinity: a client's connections follow its first)", cp.TestN)
	}
	var parts []string
	if len(more) > 0 {
		parts = append(parts, "pinned more than their share: "+strings.Join(capList(more), ", "))
	}
	if len(less) > 0 {
		parts = append(parts, "less: "+strings.Join(capList(less), ", "))
	}
	if len(parts) == 0 {
		parts = append(parts, strings.Join(capList(all), ", "))
	}
	r.add(LevelFinding, KindLongLivedSkew, cp.pr, fmt.Sprintf("%s are not spread as the rules intend; %s; chi-square p = %.3g, Holm-adjusted %.3g at α = %g over %d port(s). A connection keeps the endpoint chosen when it opened: endpoints added since (a scale-up, a rollout) get only new ones, and clients that keep their connections (pools, HTTP/2, gRPC) keep sending there until they close them (remaining timeouts %s)",
		what, strings.Join(parts, "; "), float64(cp.P), float64(cp.Adjusted), r.Alpha, r.Conntrack.Tested, cp.Remaining), ev...)
}

// ctStale states the entries whose reply source the rules do not list
// (stale) and those no DNAT touched (untranslated).
func (r *Report) ctStale(cp *CTPort) {
	udp := cp.pr.port.Protocol == "udp"
	for _, e := range cp.Endpoints {
		if e.Listed || e.Counts.Total() == 0 {
			continue
		}
		lines := e.lines
		if udp {
			r.add(LevelFinding, KindStaleUDP, cp.pr, fmt.Sprintf("%d UDP entries still send to %s, which the rules no longer list for this port (a deleted or unready endpoint): every packet of those flows goes there and renews the entry (30 s unanswered, 120 s once assured), so a client that keeps its source port never reaches a live endpoint; kube-proxy deletes such entries after a sync that changes the Service's endpoints (CleanStaleEntries): this node's did not, or the capture raced its sync",
				e.Counts.Total(), e.Addr), capLines(lines)...)
			continue
		}
		r.add(LevelNote, KindStaleTCP, cp.pr, fmt.Sprintf("%d TCP entries (%d established, %d long-lived; timeouts left %s) go to %s, which the rules no longer list for this port: kube-proxy leaves TCP entries alone (a connection to a terminating pod keeps working); if the pod is gone, these connections hang until the client gives up or the entry times out",
			e.Counts.TCPEstablished+e.Counts.TCPOther, e.Counts.TCPEstablished, e.LongLived, e.Remaining, e.Addr), capLines(lines)...)
	}
	u := cp.Untranslated.Total()
	if u == 0 {
		return
	}
	if udp {
		r.add(LevelFinding, KindUntranslatedUDP, cp.pr, fmt.Sprintf("%d UDP entries to this port were never translated (their reply source is the destination itself): made when no rule of the port matched (before its rules were written, or while it had no endpoint), they keep those flows from the endpoints for as long as packets renew them; kube-proxy deletes them after a sync (CleanStaleEntries)", u), capLines(cp.untrans)...)
		return
	}
	r.add(LevelNote, KindUntranslatedTCP, cp.pr, fmt.Sprintf("%d entries to this port were never translated (their reply source is the destination itself): made when no rule of the port matched", u), capLines(cp.untrans)...)
}
