package diagnose

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/sim/scenario"
)

// The inputs below are written with ipvsadm 1.31's own printf formats
// (ipvsadm.c print_title, print_service_entry, print_largenum, list_conn,
// print_conn), so their spacing is the tool's.

func lnHeader() string {
	return "IP Virtual Server version 1.2.1 (size=4096)\n" +
		"Prot LocalAddress:Port Scheduler Flags\n" +
		"  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
}

func lnService(proto, vip, rest string) string {
	return fmt.Sprintf("%-4s %s %s\n", proto, vip, rest)
}

func lnDest(addr string, weight, active, inact int) string {
	return fmt.Sprintf("  -> %-28s %-7s %-6d %-10d %-10d\n", addr, "Masq", weight, active, inact)
}

func statsHeader() string {
	return fmt.Sprintf("IP Virtual Server version 1.2.1 (size=4096)\n%-33s %8s %8s %8s %8s %8s\n  -> RemoteAddress:Port\n",
		"Prot LocalAddress:Port", "Conns", "InPkts", "OutPkts", "InBytes", "OutBytes")
}

// exact is print_largenum with --exact.
func exact(v uint64) string {
	s := fmt.Sprint(v)
	w := 9
	if len(s) > 8 {
		w = len(s) + 1
	}
	return fmt.Sprintf("%*d", w, v)
}

// rounded is print_largenum without --exact.
func rounded(i uint64) string {
	switch {
	case i < 100000000:
		return fmt.Sprintf("%9d", i)
	case i < 1000000000:
		return fmt.Sprintf("%8dK", i/1000)
	case i < 100000000000:
		return fmt.Sprintf("%8dM", i/1000000)
	default:
		return fmt.Sprintf("%8dG", i/1000000000)
	}
}

func statsService(proto, vip string, f func(uint64) string, v ...uint64) string {
	s := fmt.Sprintf("%-33s", fmt.Sprintf("%-4s %s", proto, vip))
	for _, x := range v {
		s += f(x)
	}
	return s + "\n"
}

func statsDest(addr string, f func(uint64) string, v ...uint64) string {
	s := fmt.Sprintf("  -> %-28s", addr)
	for _, x := range v {
		s += f(x)
	}
	return s + "\n"
}

func connHeader() string {
	return "IPVS connection entries\n" + fmt.Sprintf("pro expire %-11s %-18s %-18s %s\n", "state", "source", "virtual", "destination")
}

func conn(proto string, expires int, state, src, vip, dst string) string {
	return fmt.Sprintf("%-3s %-6s %-11s %-18s %-18s %s\n", proto, fmt.Sprintf("%02d:%02d", expires/60, expires%60), state, src, vip, dst)
}

func mustRead(t *testing.T, in string) *Dump {
	t.Helper()
	d, err := ReadIPVSAdm("node.txt", []byte(in))
	if err != nil {
		t.Fatalf("ReadIPVSAdm: %v\ninput:\n%s", err, in)
	}
	return d
}

func findPort(t *testing.T, d *Dump, chain string) *ServicePort {
	t.Helper()
	for _, p := range d.Ports {
		if p.Chain == chain {
			return p
		}
	}
	var have []string
	for _, p := range d.Ports {
		have = append(have, p.Chain)
	}
	t.Fatalf("no port %q; have %q", chain, have)
	return nil
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// allSections is an -Ln listing, its --stats --exact and its -Lnc
// connections, concatenated: an rr Service on TCP and UDP (one real
// server quiesced), a persistent one with templates, a wrr NodePort and
// an sh SCTP Service listed without stats.
func allSections() string {
	return lnHeader() +
		lnService("TCP", "10.96.0.10:53", "rr") +
		lnDest("10.244.0.5:53", 1, 2, 30) +
		lnDest("10.244.1.5:53", 1, 0, 27) +
		lnDest("10.244.1.6:53", 0, 0, 4) + // quiesced: graceful termination
		lnService("UDP", "10.96.0.10:53", "rr") +
		lnDest("10.244.0.5:53", 1, 0, 0) +
		lnDest("10.244.1.5:53", 1, 0, 0) +
		lnService("TCP", "10.96.0.11:80", "rr persistent 10800") +
		lnDest("10.244.1.5:80", 1, 0, 3) +
		lnDest("10.244.2.5:80", 1, 0, 1) +
		lnService("TCP", "172.18.0.2:30080", "wrr") +
		lnDest("10.244.1.5:80", 3, 0, 0) +
		lnDest("10.244.2.5:80", 1, 0, 0) +
		lnService("SCTP", "10.96.0.12:9999", "sh") +
		lnDest("10.244.1.7:9999", 1, 0, 0) +
		statsHeader() +
		statsService("TCP", "10.96.0.10:53", exact, 300, 900, 900, 54000, 99000) +
		statsDest("10.244.0.5:53", exact, 101, 303, 303, 18000, 33000) +
		statsDest("10.244.1.5:53", exact, 99, 297, 297, 18000, 33000) +
		statsDest("10.244.1.6:53", exact, 100, 300, 300, 18000, 33000) +
		statsService("UDP", "10.96.0.10:53", exact, 0, 0, 0, 0, 0) +
		statsDest("10.244.0.5:53", exact, 0, 0, 0, 0, 0) +
		statsDest("10.244.1.5:53", exact, 0, 0, 0, 0, 0) +
		statsService("TCP", "10.96.0.11:80", exact, 4, 12, 12, 720, 1000) +
		statsDest("10.244.1.5:80", exact, 3, 9, 9, 540, 750) +
		statsDest("10.244.2.5:80", exact, 1, 3, 3, 180, 250) +
		connHeader() +
		conn("TCP", 10797, "NONE", "10.244.0.7:0", "10.96.0.11:80", "10.244.1.5:80") +
		conn("TCP", 10500, "NONE", "10.244.0.8:0", "10.96.0.11:80", "10.244.2.5:80") +
		conn("TCP", 110, "TIME_WAIT", "10.244.0.7:41000", "10.96.0.11:80", "10.244.1.5:80") +
		conn("TCP", 9000, "ASSURED", "10.244.0.9:0", "10.96.0.11:80", "10.244.1.5:80")
}

func TestReadIPVSAdmAllSections(t *testing.T) {
	d := mustRead(t, allSections())
	if d.Mode != "ipvs" || d.Format != FormatIPVSAdm || !d.Counters || d.CountersWhy != "" {
		t.Errorf("dump: mode %q format %q counters %v (%q)", d.Mode, d.Format, d.Counters, d.CountersWhy)
	}
	if len(d.Ports) != 5 {
		t.Fatalf("%d ports, want 5", len(d.Ports))
	}
	// Sorted by ClusterIP, port, protocol.
	var order []string
	for _, p := range d.Ports {
		order = append(order, p.Chain)
	}
	want := "TCP 10.96.0.10:53,UDP 10.96.0.10:53,TCP 10.96.0.11:80,SCTP 10.96.0.12:9999,TCP 172.18.0.2:30080"
	if got := strings.Join(order, ","); got != want {
		t.Errorf("order %s, want %s", got, want)
	}

	dns := findPort(t, d, "TCP 10.96.0.10:53")
	if dns.Scheduler != "rr" || !dns.Exact || dns.Affinity != nil || dns.Protocol != "tcp" || dns.Port != 53 || dns.ClusterIP != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("dns: %+v", dns)
	}
	wantEp := []struct {
		addr             string
		w                int
		p                float64
		obs, act, inactv uint64
		line             int
	}{
		{"10.244.0.5:53", 1, 0.5, 101, 2, 30, 23},
		{"10.244.1.5:53", 1, 0.5, 99, 0, 27, 24},
		{"10.244.1.6:53", 0, 0, 100, 0, 4, 25},
	}
	if len(dns.Endpoints) != len(wantEp) {
		t.Fatalf("dns endpoints %d", len(dns.Endpoints))
	}
	for i, w := range wantEp {
		e := dns.Endpoints[i]
		if e.Addr.String() != w.addr || e.Weight != w.w || !near(e.P, w.p) || e.Observed != w.obs || e.Active != w.act || e.Inactive != w.inactv {
			t.Errorf("dns endpoint %d: %+v, want %+v", i, e, w)
		}
		if e.Evidence.Line != w.line || !strings.HasPrefix(e.Evidence.Text, "-> "+w.addr) {
			t.Errorf("dns endpoint %d evidence %+v, want the --stats line %d", i, e.Evidence, w.line)
		}
	}
	if len(dns.Evidence) != 2 || dns.Evidence[0].Line != 4 || dns.Evidence[1].Line != 22 || dns.Evidence[0].Text != "TCP  10.96.0.10:53 rr" {
		t.Errorf("dns evidence %+v", dns.Evidence)
	}

	aff := findPort(t, d, "TCP 10.96.0.11:80")
	if aff.Affinity == nil || aff.Affinity.Timeout != 10800*time.Second || aff.Affinity.Mechanism != "persistence" || !aff.Affinity.ClientsKnown || aff.Affinity.Evidence.Line != 11 {
		t.Fatalf("affinity %+v", aff.Affinity)
	}
	c1 := aff.Endpoints[0].Clients
	if len(c1) != 2 || c1[0] != (Client{netip.MustParseAddr("10.244.0.7"), 179*time.Minute + 57*time.Second}) || c1[1].Addr.String() != "10.244.0.9" || c1[1].Expires != 150*time.Minute {
		t.Errorf("clients of 10.244.1.5: %+v", c1)
	}
	if c2 := aff.Endpoints[1].Clients; len(c2) != 1 || c2[0].Addr.String() != "10.244.0.8" || c2[0].Expires != 175*time.Minute {
		t.Errorf("clients of 10.244.2.5: %+v", c2)
	}

	np := findPort(t, d, "TCP 172.18.0.2:30080")
	if np.Scheduler != "wrr" || !np.Exact || !near(np.Endpoints[0].P, 0.75) || !near(np.Endpoints[1].P, 0.25) {
		t.Errorf("wrr: exact %v P %v %v", np.Exact, np.Endpoints[0].P, np.Endpoints[1].P)
	}
	sctp := findPort(t, d, "SCTP 10.96.0.12:9999")
	if sctp.Scheduler != "sh" || sctp.Exact || sctp.Protocol != "sctp" || !near(sctp.Endpoints[0].P, 1) {
		t.Errorf("sh: %+v", sctp)
	}
	// A port listed by -Ln but absent from --stats has zero counts.
	if e := findPort(t, d, "SCTP 10.96.0.12:9999").Endpoints[0]; e.Observed != 0 || e.Evidence.Line != 18 {
		t.Errorf("sctp endpoint %+v", e)
	}
	if len(d.Skipped) != 0 {
		t.Errorf("skipped %+v", d.Skipped)
	}
}

func TestReadIPVSAdmShares(t *testing.T) {
	for _, tc := range []struct {
		sched   string
		weights []int
		exact   bool
		p       []float64
	}{
		{"rr", []int{1, 1, 1}, true, []float64{1. / 3, 1. / 3, 1. / 3}},
		// rr only skips weight 0 (ip_vs_rr.c): weight 2 changes nothing.
		{"rr", []int{1, 2, 1}, true, []float64{1. / 3, 1. / 3, 1. / 3}},
		{"rr", []int{1, 0, 1}, true, []float64{0.5, 0, 0.5}},
		{"rr", []int{0, 0}, true, []float64{0, 0}},
		{"wrr", []int{1, 2, 1}, true, []float64{0.25, 0.5, 0.25}},
		{"wrr", []int{11, 19, 19, 0}, true, []float64{11. / 49, 19. / 49, 19. / 49, 0}},
		{"lc", []int{1, 2}, false, []float64{0.5, 0.5}},
		{"wlc", []int{1, 3}, false, []float64{0.25, 0.75}},
		{"sh", []int{1, 1}, false, []float64{0.5, 0.5}},
		{"mh", []int{1, 1, 0}, false, []float64{0.5, 0.5, 0}},
		{"dh", []int{1}, false, []float64{1}},
	} {
		in := lnHeader() + lnService("TCP", "10.96.0.10:80", tc.sched)
		for i, w := range tc.weights {
			in += lnDest(fmt.Sprintf("10.244.0.%d:8080", i+1), w, 0, 0)
		}
		d := mustRead(t, in)
		p := d.Ports[0]
		if p.Exact != tc.exact || p.Scheduler != tc.sched {
			t.Errorf("%s %v: exact %v", tc.sched, tc.weights, p.Exact)
		}
		for i, e := range p.Endpoints {
			if !near(e.P, tc.p[i]) || e.Weight != tc.weights[i] {
				t.Errorf("%s %v: endpoint %d P %v weight %d, want %v", tc.sched, tc.weights, i, e.P, e.Weight, tc.p[i])
			}
		}
		if d.Counters || !strings.Contains(d.CountersWhy, "--stats") {
			t.Errorf("no --stats: counters %v %q", d.Counters, d.CountersWhy)
		}
	}
}

func TestReadIPVSAdmStatsOnly(t *testing.T) {
	in := statsHeader() +
		statsService("TCP", "10.96.0.10:80", rounded, 250000000, 1, 1, 1, 1) +
		statsDest("10.244.0.1:8080", rounded, 125000500, 1, 1, 1, 1) +
		statsDest("10.244.0.2:8080", rounded, 99999999, 1, 1, 1, 1) +
		statsDest("10.244.0.3:8080", rounded, 25000000, 1, 1, 1, 1)
	d := mustRead(t, in)
	if !d.Counters {
		t.Fatal("stats without counters")
	}
	p := d.Ports[0]
	if p.Scheduler != "rr" || !p.Exact {
		t.Errorf("default scheduler: %q exact %v", p.Scheduler, p.Exact)
	}
	obs := []uint64{125000000, 99999999, 25000000}
	for i, e := range p.Endpoints {
		if e.Observed != obs[i] || e.Weight != 1 || !near(e.P, 1./3) {
			t.Errorf("endpoint %d: %+v", i, e)
		}
	}
	var reasons []string
	for _, s := range d.Skipped {
		reasons = append(reasons, s.Reason)
	}
	all := strings.Join(reasons, "\n")
	if !strings.Contains(all, "assumed kube-proxy's defaults (scheduler rr") || !strings.Contains(all, "rounded down") {
		t.Errorf("skipped:\n%s", all)
	}
	for _, s := range d.Skipped {
		if strings.Contains(s.Reason, "rounded") && s.Line.Line != 4 {
			t.Errorf("the rounding note names line %d, want 4 (the first suffixed count)", s.Line.Line)
		}
	}
}

func TestReadIPVSAdmFlagsAndOddities(t *testing.T) {
	in := lnHeader() +
		lnService("TCP", "10.96.0.10:80", "mh mh-port") +
		lnDest("10.244.0.1:8080", 1, 0, 0) +
		lnService("TCP", "10.96.0.11:80", "sh (sh-fallback,sh-port) persistent 60 mask 255.255.255.0") +
		lnDest("10.244.0.1:8080", 1, 0, 0) +
		lnService("UDP", "10.96.0.12:53", "rr persistent 300 ops bogus-flag") +
		lnDest("10.244.0.1:53", 1, 0, 0) +
		"FWM  5 rr\n" +
		lnDest("10.244.0.1:0", 1, 0, 0) +
		lnService("TCP", "[fd00::10]:80", "rr") +
		fmt.Sprintf("  -> %-28s %-7s %-6d %-10d %-10d\r\n", "[fd00::1:5]:8080", "Route", 1, 0, 0)
	d := mustRead(t, in)
	mh := findPort(t, d, "TCP 10.96.0.10:80")
	if mh.Scheduler != "mh" || mh.Exact {
		t.Errorf("mh: %+v", mh)
	}
	sh := findPort(t, d, "TCP 10.96.0.11:80")
	if sh.Affinity == nil || sh.Affinity.Timeout != time.Minute || sh.Affinity.ClientsKnown {
		t.Errorf("sh affinity %+v", sh.Affinity)
	}
	fwm := findPort(t, d, "FWM 5")
	if fwm.FWMark != 5 || fwm.ClusterIP.IsValid() || len(fwm.Endpoints) != 1 {
		t.Errorf("fwm: %+v", fwm)
	}
	v6 := findPort(t, d, "TCP [fd00::10]:80")
	if v6.Endpoints[0].Addr != netip.MustParseAddrPort("[fd00::1:5]:8080") {
		t.Errorf("v6: %+v", v6.Endpoints[0])
	}
	var got []string
	for _, s := range d.Skipped {
		got = append(got, fmt.Sprintf("%d %s", s.Line.Line, s.Reason))
	}
	all := strings.Join(got, "\n")
	for _, w := range []string{"6 persistence granularity \"mask 255.255.255.0\"", "8 one-packet scheduling", "8 unknown flag \"bogus-flag\""} {
		if !strings.Contains(all, w) {
			t.Errorf("skipped lacks %q:\n%s", w, all)
		}
	}
	if len(d.Skipped) != 3 {
		t.Errorf("%d skipped, want 3:\n%s", len(d.Skipped), all)
	}
}

func TestReadIPVSAdmTemplatesElsewhere(t *testing.T) {
	in := lnHeader() +
		lnService("TCP", "10.96.0.11:80", "rr persistent 10800") +
		lnDest("10.244.1.5:80", 1, 0, 0) +
		lnService("TCP", "10.96.0.12:80", "rr") +
		lnDest("10.244.1.5:80", 1, 0, 0) +
		connHeader() +
		conn("TCP", 100, "NONE", "10.244.0.7:0", "10.96.0.99:80", "10.244.1.5:80") + // unknown virtual server
		conn("TCP", 100, "NONE", "10.244.0.7:0", "10.96.0.12:80", "10.244.1.5:80") + // not persistent
		conn("TCP", 100, "NONE", "10.244.0.7:0", "10.96.0.11:80", "10.244.9.9:80") + // not a real server
		conn("UDP", 100, "UDP", "10.244.0.7:5353", "10.96.0.11:80", "10.244.1.5:80") // a connection, not a template
	d := mustRead(t, in)
	if len(d.Skipped) != 3 {
		t.Fatalf("skipped %+v", d.Skipped)
	}
	for i, line := range []int{10, 11, 12} {
		if d.Skipped[i].Line.Line != line {
			t.Errorf("skipped %d names line %d, want %d", i, d.Skipped[i].Line.Line, line)
		}
	}
	p := findPort(t, d, "TCP 10.96.0.11:80")
	if !p.Affinity.ClientsKnown || len(p.Endpoints[0].Clients) != 0 {
		t.Errorf("known, no clients: %+v %+v", p.Affinity, p.Endpoints[0].Clients)
	}
}

func TestReadIPVSAdmErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		pos      scenario.Pos
		field    string
		msg      string
	}{
		{"empty", "", scenario.Pos{Line: 1, Column: 1}, "file", "expected ipvsadm output"},
		{"not ipvsadm", "Chain INPUT (policy ACCEPT)\n", scenario.Pos{Line: 1, Column: 1}, "line", "expected an ipvsadm header"},
		{"dest first", "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n" + lnDest("10.0.0.1:80", 1, 0, 0),
			scenario.Pos{Line: 3, Column: 3}, "real server", "before its real servers"},
		{"bad vip", lnHeader() + "TCP  10.96.0.300:80 rr\n", scenario.Pos{Line: 4, Column: 6}, "virtual server", "LocalAddress:Port"},
		{"no scheduler", lnHeader() + "TCP  10.96.0.3:80\n", scenario.Pos{Line: 4, Column: 18}, "virtual server TCP 10.96.0.3:80", "scheduler"},
		{"bad proto", lnHeader() + "ICMP 10.96.0.3:80 rr\n", scenario.Pos{Line: 4, Column: 1}, "virtual server", "\"ICMP\""},
		{"bad weight", lnHeader() + "TCP  10.96.0.3:80 rr\n  -> 10.0.0.1:80      Masq x 0 0\n", scenario.Pos{Line: 5, Column: 28}, "real server of TCP 10.96.0.3:80", "non-negative integer"},
		{"bad forward", lnHeader() + "TCP  10.96.0.3:80 rr\n  -> 10.0.0.1:80      Nat 1 0 0\n", scenario.Pos{Line: 5, Column: 23}, "real server of TCP 10.96.0.3:80", "forwarding method"},
		{"short dest", lnHeader() + "TCP  10.96.0.3:80 rr\n  -> 10.0.0.1:80      Masq 1 0\n", scenario.Pos{Line: 5, Column: 17}, "real server of TCP 10.96.0.3:80", "expected 4 columns"},
		{"bad persistent", lnHeader() + "TCP  10.96.0.3:80 rr persistent x\n", scenario.Pos{Line: 4, Column: 33}, "virtual server TCP 10.96.0.3:80", "timeout in seconds"},
		{"persistent without a timeout", lnHeader() + "TCP  10.96.0.3:80 rr persistent\n", scenario.Pos{Line: 4, Column: 32}, "virtual server TCP 10.96.0.3:80",
			`expected the persistence timeout (seconds) after "persistent"`},
		{"mask without a netmask", lnHeader() + "TCP  10.96.0.3:80 rr mask\n", scenario.Pos{Line: 4, Column: 26}, "virtual server TCP 10.96.0.3:80",
			`expected the persistence netmask after "mask"`},
		{"pe without an engine", lnHeader() + "TCP  10.96.0.3:80 rr pe\n", scenario.Pos{Line: 4, Column: 24}, "virtual server TCP 10.96.0.3:80",
			`expected the persistence engine after "pe"`},
		{"bad count", statsHeader() + statsService("TCP", "10.96.0.3:80", exact, 1, 1, 1, 1, 1) + "  -> 10.0.0.1:80     12X 1 1 1 1\n",
			scenario.Pos{Line: 5, Column: 22}, "real server of TCP 10.96.0.3:80", "expected a count"},
		{"stats short", statsHeader() + "TCP  10.96.0.3:80  1 2 3\n", scenario.Pos{Line: 4, Column: 18}, "virtual server TCP 10.96.0.3:80", "expected 5 numbers"},
		{"bad columns", "Prot LocalAddress:Port Foo Bar\n", scenario.Pos{Line: 1, Column: 24}, "header", "expected the columns"},
		{"no arrow", "Prot LocalAddress:Port Scheduler Flags\nTCP  10.96.0.3:80 rr\n", scenario.Pos{Line: 2, Column: 1}, "header", "RemoteAddress:Port"},
		{"bad expire", connHeader() + "TCP 1:2:3 NONE 10.0.0.1:0 10.96.0.3:80 10.0.0.2:80\n", scenario.Pos{Line: 3, Column: 5}, "connection entry", "minutes:seconds"},
		{"bad conn addr", connHeader() + "TCP 01:02 NONE 10.0.0.1 10.96.0.3:80 10.0.0.2:80\n", scenario.Pos{Line: 3, Column: 16}, "connection entry", "source address:port"},
		{"conn fields", connHeader() + "TCP 01:02 NONE 10.0.0.1:0 10.96.0.3:80\n", scenario.Pos{Line: 3, Column: 27}, "connection entry", "found 5 fields"},
		{"conn proto", connHeader() + "XYZ 01:02 NONE 10.0.0.1:0 10.96.0.3:80 10.0.0.2:80\n", scenario.Pos{Line: 3, Column: 1}, "connection entry", "protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ReadIPVSAdm("node.txt", []byte(tc.in))
			if err == nil {
				t.Fatalf("no error; dump %+v", d)
			}
			if !scenario.IsInvalid(err) {
				t.Fatalf("not bad input: %v", err)
			}
			var l scenario.ErrorList
			if !errors.As(err, &l) || len(l) == 0 {
				t.Fatalf("not an ErrorList: %T", err)
			}
			e := l[0]
			if e.File != "node.txt" || e.Pos != tc.pos || e.Field != tc.field || !strings.Contains(e.Message, tc.msg) {
				t.Errorf("got %s (pos %+v field %q), want pos %+v field %q message containing %q", e, e.Pos, e.Field, tc.pos, tc.field, tc.msg)
			}
		})
	}
}
