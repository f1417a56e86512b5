package diagnose

// The ipvsadm reader. It reads what ipvsadm 1.31 (Debian 12) prints, as
// its print functions write it (ipvsadm.c: list_all, print_title,
// print_service_entry, print_largenum, list_conn, print_conn), one section
// or several concatenated in one file, told apart by their header lines:
//
//	IP Virtual Server version 1.2.1 (size=4096)         optional, list_all
//	Prot LocalAddress:Port Scheduler Flags               -Ln
//	  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
//	Prot LocalAddress:Port   Conns InPkts OutPkts InBytes OutBytes   --stats [--exact]
//	Prot LocalAddress:Port   CPS InPPS OutPPS InBPS OutBPS           --rate
//	Prot LocalAddress:Port   Uthreshold Lthreshold ActiveConn InActConn  --thresholds
//	Prot LocalAddress:Port   Weight PersistConn ActiveConn InActConn     --persistent-conn
//	IPVS connection entries                              -Lnc
//	pro expire state       source             virtual            destination [pe name pe_data]
//
// A virtual server is "TCP  10.96.0.10:53", "UDP  ...", "SCTP ..." or
// "FWM  5" ("FWM  5 IPv6"); the -Ln line adds the scheduler and its flags
// ("persistent 10800", "mask 255.255.255.0", "pe sip", "ops", scheduler
// flags such as "mh-port"). Each section is merged into one ServicePort per
// virtual server: the scheduler, weights, persistence, ActiveConn and
// InActConn from -Ln, Conns from --stats, the persistence templates of -Lnc
// (state NONE or ASSURED, client port 0) as the clients affinity
// remembers, with the time left.
//
// What the split is: ip_vs_rr.c takes the next real server with a positive
// weight, whatever the weight (rr ignores weights but 0), so rr's share is
// 1/k over the k servers of positive weight; ip_vs_wrr.c serves each server
// its weight per rotation, so wrr's share is weight/sum. Both hold exactly
// over whole rotations, so P is Exact for them. Every other scheduler
// (lc, wlc, sed, nq: the load at each connection; sh, dh, mh: a hash of
// the address) is not a fixed split: P is its nominal share (weights for
// wlc, sed, nq; even otherwise), Exact false. Weight 0 (quiesced: kube-proxy's
// graceful termination) is P 0 everywhere.

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/sim/scenario"
)

// ipvsDefaultScheduler is kube-proxy's --ipvs-scheduler default, assumed
// when a dump has no -Ln section to say.
const ipvsDefaultScheduler = "rr"

// ipvsSection is the kind of ipvsadm listing a line belongs to.
type ipvsSection int

const (
	secNone        ipvsSection = iota
	secList                    // -Ln
	secListTunnel              // -Ln --tun-info
	secStats                   // --stats
	secRate                    // --rate
	secThresholds              // --thresholds
	secPersistConn             // --persistent-conn
	secConns                   // -Lnc
	secConnsPE                 // -Lnc --persistent-conn
)

func (s ipvsSection) String() string {
	switch s {
	case secList, secListTunnel:
		return "-Ln"
	case secStats:
		return "--stats"
	case secRate:
		return "--rate"
	case secThresholds:
		return "--thresholds"
	case secPersistConn:
		return "--persistent-conn"
	case secConns, secConnsPE:
		return "-Lnc"
	}
	return "none"
}

// ipvsField is one whitespace-separated field and its 1-based column.
type ipvsField struct {
	s   string
	col int
}

func ipvsFields(line string) []ipvsField {
	var out []ipvsField
	start := -1
	for i := 0; i <= len(line); i++ {
		sp := i == len(line) || line[i] == ' ' || line[i] == '\t'
		if sp && start >= 0 {
			out = append(out, ipvsField{line[start:i], start + 1})
			start = -1
		} else if !sp && start < 0 {
			start = i
		}
	}
	return out
}

// ipvsKey names a virtual server: "TCP 10.96.0.10:53", "FWM 5", "FWM 5 IPv6".
type ipvsKey string

type ipvsReader struct {
	file   string
	errs   scenario.ErrorList
	dump   *Dump
	ports  map[ipvsKey]*ServicePort
	order  []ipvsKey
	eps    map[ipvsKey]map[netip.AddrPort]*Endpoint
	seen   map[ipvsSection]bool // sections present
	listed map[ipvsKey]bool     // services with an -Ln line
	// per service: weights known (from -Ln or --persistent-conn)
	weighted map[ipvsKey]bool
	// listedDest: real servers whose weight a listing gave
	listedDest map[ipvsKey]map[netip.AddrPort]bool
	// templates of -Lnc, resolved at the end
	templates []ipvsTemplate
	rounded   *Line // first count printed with a K/M/G/T suffix
	rateLine  *Line // first --rate header
	sec       ipvsSection
	// cur is the virtual server whose real servers follow.
	cur     ipvsKey
	curLine int
	// expectArrow: the header's second line ("  -> RemoteAddress:Port ...")
	// comes next.
	expectArrow bool
}

type ipvsTemplate struct {
	line    Line
	key     ipvsKey
	client  netip.Addr
	dest    netip.AddrPort
	expires time.Duration
}

// ReadIPVSAdm reads what ipvsadm printed (-Ln, -Ln --stats [--exact],
// -Ln --rate, -Lnc; one or several concatenated) into a Dump. A line it
// cannot read is a *scenario.FieldError at file:line:column in the
// returned scenario.ErrorList; flags it does not know on a virtual
// server's line are Skipped entries.
func ReadIPVSAdm(file string, data []byte) (*Dump, error) {
	r := &ipvsReader{
		file:     file,
		dump:     &Dump{File: file, Format: FormatIPVSAdm, Mode: "ipvs"},
		ports:    map[ipvsKey]*ServicePort{},
		eps:      map[ipvsKey]map[netip.AddrPort]*Endpoint{},
		seen:     map[ipvsSection]bool{},
		listed:   map[ipvsKey]bool{},
		weighted: map[ipvsKey]bool{},

		listedDest: map[ipvsKey]map[netip.AddrPort]bool{},
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		r.line(n, strings.TrimRight(sc.Text(), "\r"))
		if len(r.errs) >= 20 {
			break
		}
	}
	if err := sc.Err(); err != nil {
		r.errorf(n+1, 1, "file", "could not read the line: %v", err)
	}
	if len(r.errs) == 0 && len(r.seen) == 0 {
		r.errorf(1, 1, "file", "expected ipvsadm output: a header \"Prot LocalAddress:Port ...\" (ipvsadm -Ln, --stats, --rate) or \"IPVS connection entries\" (ipvsadm -Lnc)")
	}
	if len(r.errs) > 0 {
		return nil, r.errs
	}
	r.finish()
	return r.dump, nil
}

func (r *ipvsReader) errorf(line, col int, field, format string, args ...any) {
	r.errs = append(r.errs, &scenario.FieldError{File: r.file, Pos: scenario.Pos{Line: line, Column: col},
		Field: field, Message: fmt.Sprintf(format, args...)})
}

func (r *ipvsReader) skip(n int, text, format string, args ...any) {
	r.dump.Skipped = append(r.dump.Skipped, Skipped{Line: Line{File: r.file, Line: n, Text: strings.TrimSpace(text)},
		Reason: fmt.Sprintf(format, args...)})
}

func (r *ipvsReader) evidence(n int, text string) Line {
	return Line{File: r.file, Line: n, Text: strings.TrimSpace(text)}
}

// header recognises a header line and starts its section.
func (r *ipvsReader) header(n int, text string, f []ipvsField) bool {
	t := strings.TrimSpace(text)
	switch {
	case strings.HasPrefix(t, "IP Virtual Server version "):
		r.sec, r.cur, r.expectArrow = secNone, "", false
		return true
	case t == "IPVS connection entries":
		r.sec, r.cur, r.expectArrow = secNone, "", false
		return true
	case len(f) >= 2 && f[0].s == "Prot" && f[1].s == "LocalAddress:Port":
		names := make([]string, 0, len(f)-2)
		for _, x := range f[2:] {
			names = append(names, x.s)
		}
		cols := strings.Join(names, " ")
		switch cols {
		case "Scheduler Flags":
			r.sec = secList
		case "Conns InPkts OutPkts InBytes OutBytes":
			r.sec = secStats
		case "CPS InPPS OutPPS InBPS OutBPS":
			r.sec = secRate
			if r.rateLine == nil {
				l := r.evidence(n, text)
				r.rateLine = &l
			}
		case "Uthreshold Lthreshold ActiveConn InActConn":
			r.sec = secThresholds
		case "Weight PersistConn ActiveConn InActConn":
			r.sec = secPersistConn
		default:
			r.errorf(n, f[2%len(f)].col, "header", "expected the columns of ipvsadm -Ln (Scheduler Flags), --stats (Conns InPkts OutPkts InBytes OutBytes), --rate (CPS InPPS OutPPS InBPS OutBPS), --thresholds or --persistent-conn, not %q", cols)
			r.sec = secNone
			return true
		}
		r.seen[r.sec] = true
		r.cur, r.expectArrow = "", true
		return true
	case len(f) >= 6 && f[0].s == "pro" && f[1].s == "expire" && f[2].s == "state" && f[3].s == "source" && f[4].s == "virtual" && f[5].s == "destination":
		switch {
		case len(f) == 6:
			r.sec = secConns
		case len(f) == 9 && f[6].s == "pe" && f[7].s == "name" && f[8].s == "pe_data":
			r.sec = secConnsPE
		default:
			r.errorf(n, f[6].col, "header", "expected \"pro expire state source virtual destination\", optionally followed by \"pe name pe_data\"")
			r.sec = secNone
			return true
		}
		r.seen[r.sec] = true
		r.cur, r.expectArrow = "", false
		return true
	}
	return false
}

func (r *ipvsReader) line(n int, text string) {
	f := ipvsFields(text)
	if len(f) == 0 {
		return
	}
	if r.expectArrow {
		r.expectArrow = false
		if f[0].s == "->" && len(f) >= 2 && f[1].s == "RemoteAddress:Port" {
			var rest []string
			for _, x := range f[2:] {
				rest = append(rest, x.s)
			}
			cols := strings.Join(rest, " ")
			switch {
			case r.sec == secList && cols == "Forward Weight ActiveConn InActConn":
			case r.sec == secList && cols == "Forward TunnelInfo Weight ActiveConn InActConn":
				r.sec = secListTunnel
			case r.sec != secList && cols == "":
			default:
				r.errorf(n, f[1].col, "header", "expected the real servers' columns of ipvsadm %s, not %q", r.sec, cols)
			}
			return
		}
		r.errorf(n, f[0].col, "header", "expected \"  -> RemoteAddress:Port ...\", the second line of ipvsadm's %s header", r.sec)
		return
	}
	if r.header(n, text, f) {
		return
	}
	switch r.sec {
	case secNone:
		r.errorf(n, f[0].col, "line", "expected an ipvsadm header (\"IP Virtual Server version ...\", \"Prot LocalAddress:Port ...\", \"IPVS connection entries\")")
	case secConns, secConnsPE:
		r.conn(n, text, f)
	default:
		if f[0].s == "->" {
			r.dest(n, text, f)
		} else {
			r.service(n, text, f)
		}
	}
}

// parseVirtual reads "TCP 10.96.0.10:53" or "FWM 5 [IPv6]" from f and
// returns the key, the port and how many fields it used.
func (r *ipvsReader) parseVirtual(n int, f []ipvsField) (ipvsKey, *ServicePort, int, bool) {
	proto := f[0].s
	switch proto {
	case "TCP", "UDP", "SCTP":
		if len(f) < 2 {
			r.errorf(n, f[0].col+len(f[0].s), "virtual server", "expected LocalAddress:Port after %s", proto)
			return "", nil, 0, false
		}
		ap, err := netip.ParseAddrPort(f[1].s)
		if err != nil {
			r.errorf(n, f[1].col, "virtual server", "expected LocalAddress:Port (numeric, as -n prints it), not %q", f[1].s)
			return "", nil, 0, false
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		key := ipvsKey(proto + " " + ap.String())
		return key, &ServicePort{ClusterIP: ap.Addr(), Port: int(ap.Port()), Protocol: strings.ToLower(proto), Chain: string(key)}, 2, true
	case "FWM":
		if len(f) < 2 {
			r.errorf(n, f[0].col+len(f[0].s), "virtual server", "expected a firewall mark after FWM")
			return "", nil, 0, false
		}
		m, err := strconv.ParseUint(f[1].s, 10, 32)
		if err != nil {
			r.errorf(n, f[1].col, "virtual server", "expected a firewall mark (a decimal number), not %q", f[1].s)
			return "", nil, 0, false
		}
		used := 2
		key := "FWM " + f[1].s
		if len(f) > 2 && f[2].s == "IPv6" {
			key += " IPv6"
			used = 3
		}
		return ipvsKey(key), &ServicePort{FWMark: uint32(m), Chain: key}, used, true
	}
	r.errorf(n, f[0].col, "virtual server", "expected a virtual server (TCP, UDP or SCTP LocalAddress:Port, or FWM mark) or \"  -> RemoteAddress:Port\", not %q", proto)
	return "", nil, 0, false
}

// port returns the service port for key, creating it from sp.
func (r *ipvsReader) port(key ipvsKey, sp *ServicePort) *ServicePort {
	if p, ok := r.ports[key]; ok {
		return p
	}
	r.ports[key] = sp
	r.order = append(r.order, key)
	r.eps[key] = map[netip.AddrPort]*Endpoint{}
	return sp
}

func (r *ipvsReader) service(n int, text string, f []ipvsField) {
	key, sp, used, ok := r.parseVirtual(n, f)
	if !ok {
		r.cur = ""
		return
	}
	p := r.port(key, sp)
	p.Evidence = append(p.Evidence, r.evidence(n, text))
	r.cur, r.curLine = key, n
	rest := f[used:]
	switch r.sec {
	case secList, secListTunnel:
		if r.listed[key] {
			r.skip(n, text, "virtual server %s listed again by -Ln: the later listing wins", key)
		}
		r.listed[key] = true
		if len(rest) == 0 {
			r.errorf(n, f[used-1].col+len(f[used-1].s), "virtual server "+string(key), "expected the scheduler after the virtual server")
			return
		}
		p.Scheduler = rest[0].s
		p.Affinity = nil
		r.flags(n, text, p, rest[1:])
	case secStats, secRate:
		if len(rest) != 5 {
			r.errorf(n, f[used-1].col+len(f[used-1].s), "virtual server "+string(key), "expected 5 numbers after the virtual server (%s), found %d fields", r.colNames(), len(rest))
			return
		}
		for _, x := range rest {
			if _, ok := r.number(n, x, string(key)); !ok {
				return
			}
		}
	case secThresholds, secPersistConn:
		if len(rest) != 0 {
			r.errorf(n, rest[0].col, "virtual server "+string(key), "expected nothing after the virtual server in ipvsadm %s", r.sec)
		}
	}
}

func (r *ipvsReader) colNames() string {
	switch r.sec {
	case secStats:
		return "Conns InPkts OutPkts InBytes OutBytes"
	case secRate:
		return "CPS InPPS OutPPS InBPS OutBPS"
	}
	return ""
}

// ipvsSchedFlags are the scheduler flags ipvsadm 1.31 prints by name
// (print_sched_flags).
var ipvsSchedFlags = map[string]bool{
	"sh-fallback": true, "sh-port": true, "mh-fallback": true, "mh-port": true,
	"flag-1": true, "flag-2": true, "flag-3": true,
}

// flags reads what follows the scheduler on an -Ln line.
func (r *ipvsReader) flags(n int, text string, p *ServicePort, f []ipvsField) {
	// value is the word after the flag at i; without one, the error says
	// that what was expected there.
	value := func(i int, what string) (string, bool) {
		if i+1 >= len(f) {
			r.errorf(n, f[i].col+len(f[i].s), "virtual server "+p.Chain, "expected %s after %q", what, f[i].s)
			return "", false
		}
		return f[i+1].s, true
	}
	for i := 0; i < len(f); i++ {
		tok := f[i].s
		switch tok {
		case "persistent":
			v, ok := value(i, "the persistence timeout (seconds)")
			if !ok {
				return
			}
			s, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				r.errorf(n, f[i+1].col, "virtual server "+p.Chain, "expected the persistence timeout in seconds, not %q", v)
				return
			}
			i++
			p.Affinity = &Affinity{Timeout: time.Duration(s) * time.Second, Mechanism: "persistence", Evidence: r.evidence(n, text)}
		case "mask":
			v, ok := value(i, "the persistence netmask")
			if !ok {
				return
			}
			i++
			r.skip(n, text, "persistence granularity \"mask %s\": a template covers a whole client network, not one address (kube-proxy writes /32)", v)
		case "pe":
			v, ok := value(i, "the persistence engine")
			if !ok {
				return
			}
			i++
			r.skip(n, text, "persistence engine %q: not kube-proxy's, templates are not read for it", v)
		case "ops":
			r.skip(n, text, "one-packet scheduling (ops): every UDP packet is scheduled on its own")
		default:
			names := strings.Split(strings.Trim(tok, "()"), ",")
			known := true
			for _, nm := range names {
				if !ipvsSchedFlags[nm] {
					known = false
				}
			}
			if !known {
				r.skip(n, text, "unknown flag %q on the virtual server's line", tok)
			}
			// Scheduler flags change sh/mh's hash (port, fallback), not
			// whether the split is a fixed one: nothing to record.
		}
	}
}

// number reads a count as print_largenum writes it: a plain number
// (always with --exact), or without --exact a number with a K, M, G or T
// suffix (divided by 10^3, 10^6, 10^9, 10^12 and truncated).
func (r *ipvsReader) number(n int, x ipvsField, field string) (uint64, bool) {
	s := x.s
	mult := uint64(1)
	if len(s) > 1 {
		switch s[len(s)-1] {
		case 'K':
			mult = 1e3
		case 'M':
			mult = 1e6
		case 'G':
			mult = 1e9
		case 'T':
			mult = 1e12
		}
		if mult > 1 {
			s = s[:len(s)-1]
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || (mult > 1 && v > (^uint64(0))/mult) {
		r.errorf(n, x.col, field, "expected a count (digits, or digits with a K, M, G or T suffix without --exact), not %q", x.s)
		return 0, false
	}
	if mult > 1 && r.rounded == nil {
		l := Line{File: r.file, Line: n}
		r.rounded = &l
	}
	return v * mult, true
}

func (r *ipvsReader) listDest(key ipvsKey, ap netip.AddrPort) {
	if r.listedDest[key] == nil {
		r.listedDest[key] = map[netip.AddrPort]bool{}
	}
	r.listedDest[key][ap] = true
}

func (r *ipvsReader) dest(n int, text string, f []ipvsField) {
	if r.cur == "" {
		r.errorf(n, f[0].col, "real server", "expected a virtual server's line before its real servers")
		return
	}
	key := r.cur
	p := r.ports[key]
	field := "real server of " + string(key)
	if len(f) < 2 {
		r.errorf(n, f[0].col+2, field, "expected RemoteAddress:Port after \"->\"")
		return
	}
	ap, err := netip.ParseAddrPort(f[1].s)
	if err != nil {
		r.errorf(n, f[1].col, field, "expected RemoteAddress:Port (numeric, as -n prints it), not %q", f[1].s)
		return
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	rest := f[2:]
	want := map[ipvsSection]int{secList: 4, secListTunnel: 5, secStats: 5, secRate: 5, secThresholds: 4, secPersistConn: 4}[r.sec]
	if len(rest) != want {
		col := f[1].col + len(f[1].s)
		if len(rest) > want {
			col = rest[want].col
		}
		r.errorf(n, col, field, "expected %d columns after the real server in ipvsadm %s, found %d", want, r.sec, len(rest))
		return
	}
	vals := make([]uint64, 0, 5)
	start := 0
	switch r.sec {
	case secList:
		start = 1 // Forward
	case secListTunnel:
		start = 2 // Forward TunnelInfo
	}
	if r.sec == secList || r.sec == secListTunnel {
		switch rest[0].s {
		case "Masq", "Local", "Tunnel", "Route":
		default:
			r.errorf(n, rest[0].col, field, "expected the forwarding method (Masq, Local, Tunnel, Route), not %q", rest[0].s)
			return
		}
	}
	for _, x := range rest[start:] {
		var v uint64
		var ok bool
		if r.sec == secStats || r.sec == secRate {
			v, ok = r.number(n, x, field)
		} else {
			var err error
			v, err = strconv.ParseUint(x.s, 10, 32)
			ok = err == nil
			if !ok {
				r.errorf(n, x.col, field, "expected a non-negative integer, not %q", x.s)
			}
		}
		if !ok {
			return
		}
		vals = append(vals, v)
	}
	ep, ok := r.eps[key][ap]
	if !ok {
		ep = &Endpoint{Addr: ap, Chain: ap.String()}
		r.eps[key][ap] = ep
		p.Endpoints = append(p.Endpoints, ep)
	}
	switch r.sec {
	case secList, secListTunnel:
		ep.Weight, ep.Active, ep.Inactive = int(vals[0]), vals[1], vals[2]
		r.weighted[key] = true
		r.listDest(key, ap)
		if ep.Evidence.Line == 0 {
			ep.Evidence = r.evidence(n, text)
		}
	case secStats:
		ep.Observed = vals[0]
		ep.Evidence = r.evidence(n, text) // the counts are what a finding cites
	case secPersistConn:
		ep.Weight, ep.Active, ep.Inactive = int(vals[0]), vals[2], vals[3]
		r.weighted[key] = true
		r.listDest(key, ap)
		if ep.Evidence.Line == 0 {
			ep.Evidence = r.evidence(n, text)
		}
	case secThresholds:
		ep.Active, ep.Inactive = vals[2], vals[3]
		if ep.Evidence.Line == 0 {
			ep.Evidence = r.evidence(n, text)
		}
	case secRate:
		if ep.Evidence.Line == 0 {
			ep.Evidence = r.evidence(n, text)
		}
	}
}

// ipvsConnProto are the protocol names the kernel writes in
// /proc/net/ip_vs_conn (ip_vs_proto_name); "IP" is a firewall-mark
// service's template.
var ipvsConnProto = map[string]bool{"TCP": true, "UDP": true, "SCTP": true, "IP": true}

func (r *ipvsReader) conn(n int, text string, f []ipvsField) {
	field := "connection entry"
	if len(f) != 6 && !(r.sec == secConnsPE && len(f) == 8) {
		col := f[len(f)-1].col
		if len(f) > 6 {
			col = f[6].col
		}
		r.errorf(n, col, field, "expected \"pro expire state source virtual destination\"%s, found %d fields",
			map[bool]string{true: " [pe_name pe_data]", false: ""}[r.sec == secConnsPE], len(f))
		return
	}
	if !ipvsConnProto[f[0].s] && !strings.HasPrefix(f[0].s, "IP_") {
		r.errorf(n, f[0].col, field, "expected the protocol (TCP, UDP, SCTP, IP), not %q", f[0].s)
		return
	}
	exp, ok := parseExpire(f[1].s)
	if !ok {
		r.errorf(n, f[1].col, field, "expected the time left as minutes:seconds (\"179:57\"), not %q", f[1].s)
		return
	}
	var aps [3]netip.AddrPort
	for i := range 3 {
		ap, err := netip.ParseAddrPort(f[3+i].s)
		if err != nil {
			r.errorf(n, f[3+i].col, field, "expected the %s address:port, not %q", [...]string{"source", "virtual", "destination"}[i], f[3+i].s)
			return
		}
		aps[i] = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	state := f[2].s
	// A persistence template (IP_VS_CONN_F_TEMPLATE) has client port 0
	// and a template state: NONE, or ASSURED (kernel 5.4+,
	// ip_vs_ctpl_state_name_table). An ordinary connection is no evidence
	// about affinity: it goes where the template sent it.
	if aps[0].Port() != 0 || (state != "NONE" && state != "ASSURED") {
		return
	}
	proto := f[0].s
	var key ipvsKey
	if proto == "IP" {
		// A firewall-mark template: the virtual "address" is the mark.
		key = ipvsKey("FWM " + strconv.FormatUint(uint64(ipv4Uint(aps[1].Addr())), 10))
		if aps[1].Addr().Is6() {
			key += " IPv6"
		}
	} else {
		key = ipvsKey(proto + " " + aps[1].String())
	}
	r.templates = append(r.templates, ipvsTemplate{line: r.evidence(n, text), key: key, client: aps[0].Addr(), dest: aps[2], expires: exp})
}

func ipv4Uint(a netip.Addr) uint32 {
	if !a.Is4() {
		b := a.As16()
		return uint32(b[12])<<24 | uint32(b[13])<<16 | uint32(b[14])<<8 | uint32(b[15])
	}
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// parseExpire reads print_conn's "%02d:%02d" of minutes and seconds
// (minutes may pass 99: 179:57 is a 3-hour template).
func parseExpire(s string) (time.Duration, bool) {
	m, sec, ok := strings.Cut(s, ":")
	if !ok || m == "" || len(sec) != 2 {
		return 0, false
	}
	mi, err1 := strconv.ParseUint(m, 10, 32)
	si, err2 := strconv.ParseUint(sec, 10, 8)
	if err1 != nil || err2 != nil || si > 59 {
		return 0, false
	}
	return time.Duration(mi)*time.Minute + time.Duration(si)*time.Second, true
}

// finish computes the shares, attaches the templates and orders the ports.
func (r *ipvsReader) finish() {
	d := r.dump
	hasList := r.seen[secList] || r.seen[secListTunnel]
	d.Counters = r.seen[secStats]
	if !d.Counters {
		d.CountersWhy = "no ipvsadm -Ln --stats section: ActiveConn and InActConn only count the connections still in the table, not every new connection (run ipvsadm -Ln --stats --exact)"
	}
	if r.rounded != nil {
		l := *r.rounded
		d.Skipped = append(d.Skipped, Skipped{Line: l, Reason: "counts printed with K/M/G/T suffixes (ipvsadm without --exact): each is rounded down to its unit (123K is 123000 to 123999); read as the lower bound (run ipvsadm -Ln --stats --exact)"})
	}
	if r.rateLine != nil {
		d.Skipped = append(d.Skipped, Skipped{Line: *r.rateLine, Reason: "ipvsadm --rate prints per-second estimates (the kernel's 2-second averages), not counts: not used"})
	}
	for _, key := range r.order {
		p := r.ports[key]
		if !hasList || !r.listed[key] {
			p.Scheduler = ipvsDefaultScheduler
			first := Line{File: r.file}
			if len(p.Evidence) > 0 {
				first = p.Evidence[0]
			}
			why := "the dump has no ipvsadm -Ln section"
			if hasList {
				why = "the -Ln section does not list this virtual server (it changed between the commands)"
			}
			d.Skipped = append(d.Skipped, Skipped{Line: first, Reason: why + ": scheduler, persistence and weights unknown; assumed kube-proxy's defaults (scheduler rr, weight 1, no persistence)"})
			if !r.weighted[key] {
				for _, ep := range p.Endpoints {
					ep.Weight = 1
				}
			}
		}
		if hasList && r.listed[key] {
			for _, ep := range p.Endpoints {
				if !r.listedDest[key][ep.Addr] {
					d.Skipped = append(d.Skipped, Skipped{Line: ep.Evidence, Reason: fmt.Sprintf("real server %s of %s is not in the -Ln listing (it changed between the commands): weight unknown, assumed 1", ep.Addr, key)})
					ep.Weight = 1
				}
			}
		}
		ipvsShares(p)
		if p.Affinity != nil {
			p.Affinity.ClientsKnown = r.seen[secConns] || r.seen[secConnsPE]
		}
	}
	for _, t := range r.templates {
		p, ok := r.ports[t.key]
		if !ok {
			d.Skipped = append(d.Skipped, Skipped{Line: t.line, Reason: fmt.Sprintf("persistence template for %s, a virtual server the listings do not show", t.key)})
			continue
		}
		if p.Affinity == nil {
			d.Skipped = append(d.Skipped, Skipped{Line: t.line, Reason: fmt.Sprintf("persistence template for %s, which the -Ln listing does not show as persistent", t.key)})
			continue
		}
		ep := r.eps[t.key][t.dest]
		if ep == nil {
			d.Skipped = append(d.Skipped, Skipped{Line: t.line, Reason: fmt.Sprintf("persistence template sends %s to %s, not a real server of %s", t.client, t.dest, t.key)})
			continue
		}
		ep.Clients = append(ep.Clients, Client{Addr: t.client, Expires: t.expires})
	}
	for _, key := range r.order {
		for _, ep := range r.ports[key].Endpoints {
			slices.SortFunc(ep.Clients, func(a, b Client) int { return a.Addr.Compare(b.Addr) })
		}
		d.Ports = append(d.Ports, r.ports[key])
	}
	slices.SortStableFunc(d.Ports, func(a, b *ServicePort) int {
		if c := a.ClusterIP.Compare(b.ClusterIP); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return a.Port - b.Port
		}
		if a.Protocol != b.Protocol {
			return strings.Compare(a.Protocol, b.Protocol)
		}
		return strings.Compare(a.Chain, b.Chain)
	})
}

// ipvsShares sets each endpoint's P from the scheduler and the weights
// (see the file comment) and Exact.
func ipvsShares(p *ServicePort) {
	var k, sum int
	for _, ep := range p.Endpoints {
		if ep.Weight > 0 {
			k++
			sum += ep.Weight
		}
	}
	weighted := false
	switch p.Scheduler {
	case "rr":
		p.Exact = true
	case "wrr":
		p.Exact, weighted = true, true
	case "wlc", "sed", "nq", "fo", "ovf", "lblc", "lblcr", "twos":
		weighted = true
	}
	for _, ep := range p.Endpoints {
		ep.P = 0
		switch {
		case ep.Weight <= 0:
		case weighted:
			ep.P = float64(ep.Weight) / float64(sum)
		default:
			ep.P = 1 / float64(k)
		}
	}
}
