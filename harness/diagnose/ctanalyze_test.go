package diagnose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func ctPortNamed(t *testing.T, cr *ConntrackReport, name string) *CTPort {
	t.Helper()
	for _, cp := range cr.Ports {
		if cp.Port == name {
			return cp
		}
	}
	t.Fatalf("no conntrack port %s", name)
	return nil
}

// ctEndpointWords is a port's reply sources: address, entries, long-lived,
// tested, listed, pinned.
func ctEndpointWords(cp *CTPort) []string {
	var out []string
	for _, e := range cp.Endpoints {
		out = append(out, fmt.Sprintf("%s %d/%d/%d listed=%v %s", e.Addr, e.Counts.Total(), e.LongLived, e.Tested, e.Listed, e.Pinned))
	}
	return out
}

func findingWords(r *Report) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Level != LevelFinding {
			continue
		}
		out = append(out, fmt.Sprintf("%s %s %s", f.About, f.Kind, f.Port))
	}
	return out
}

// The real capture against the rules it was taken under (gen-conntrack.sh):
// svc2's long-lived connections pin the two endpoints it had before its
// scale-up (a finding, about traffic); svc8's UDP flows to the deleted
// 10.180.0.12 are the black hole kube-proxy's cleanup removes (a finding,
// about conntrack); svc1's TCP connections to the deleted 10.180.0.2 are a
// note; svc10's long-lived connections through its cluster IP fit the
// split, and those through its externalTrafficPolicy Local destinations
// (external IP, load-balancer IP, node port) are counted, not tested.
// The committed dump, the legacy one and the node's own iptables-save at
// the capture give the same conntrack report.
func TestConntrackOverall(t *testing.T) {
	ct := readConntrackFixture(t, "overall.conntrack")
	var first []byte
	for _, dump := range []string{"iptables/overall.nft.save", "iptables/overall.legacy.save", "conntrack/overall-node.nft.save"} {
		data, err := os.ReadFile(filepath.Join("testdata", dump))
		if err != nil {
			t.Fatal(err)
		}
		d, err := ReadIPTablesSave(dump, data)
		if err != nil {
			t.Fatal(err)
		}
		r := Analyze(d, Options{Conntrack: ct})
		cr := r.Conntrack
		if cr == nil {
			t.Fatal("no conntrack report")
		}
		got, _ := json.Marshal(cr)
		if first == nil {
			first = got
			checkOverallConntrack(t, r)
		} else if !bytes.Equal(first, got) {
			t.Errorf("%s: the conntrack report differs from the one against iptables/overall.nft.save", dump)
		}
	}
}

func checkOverallConntrack(t *testing.T, r *Report) {
	t.Helper()
	cr := r.Conntrack
	want := Counts{TCPEstablished: 201, TCPOther: 30, UDP: 41}
	if cr.Service != want || cr.NotService != (Counts{TCPEstablished: 3, UDP: 2, Other: 1}) || cr.LongLived != 201 || cr.Shown != 278 {
		t.Errorf("totals: service %+v, elsewhere %+v, long-lived %d, shown %d", cr.Service, cr.NotService, cr.LongLived, cr.Shown)
	}
	if !(float64(cr.ShareLo) < 201.0/272 && 201.0/272 < float64(cr.ShareHi)) || float64(cr.Share) != 201.0/272 {
		t.Errorf("long-lived share %v [%v, %v]", cr.Share, cr.ShareLo, cr.ShareHi)
	}
	if cr.Remaining == nil || cr.Remaining.Min < 431000 || cr.Remaining.Max > 432000 {
		t.Errorf("remaining %+v: want a few seconds under 432000", cr.Remaining)
	}
	if diff := cmp.Diff([]string{
		"10.180.0.4:80 56/48/48 listed=true more",
		"10.180.0.5:80 39/30/30 listed=true ",
		"10.180.1.7:80 25/12/12 listed=true less",
	}, ctEndpointWords(ctPortNamed(t, cr, "ns2/svc2:p80"))); diff != "" {
		t.Errorf("svc2 (-want +got):\n%s", diff)
	}
	svc2 := ctPortNamed(t, cr, "ns2/svc2:p80")
	if svc2.Verdict != "pinned unevenly" || !svc2.Rejected || svc2.Counts != (Counts{TCPEstablished: 90, TCPOther: 30}) {
		t.Errorf("svc2: %s rejected %v counts %+v", svc2.Verdict, svc2.Rejected, svc2.Counts)
	}
	svc10 := ctPortNamed(t, cr, "ns10/svc10:p80")
	var dests []string
	for _, f := range svc10.Frontends {
		dests = append(dests, fmt.Sprintf("%s %s %d %v", f.What, f.Dest, f.Entries, f.Tested))
	}
	if diff := cmp.Diff([]string{"service address 172.30.0.50:80 40 true", "external IP 192.168.99.10:80 10 false",
		"load-balancer IP 1.2.3.10:80 6 false", "node port *:30010 10 false"}, dests); diff != "" {
		t.Errorf("svc10 destinations (-want +got):\n%s", diff)
	}
	if svc10.Verdict != "as intended" || svc10.TestN != 40 || svc10.LongLived != 66 {
		t.Errorf("svc10: %s, tested %d of %d long-lived", svc10.Verdict, svc10.TestN, svc10.LongLived)
	}
	if diff := cmp.Diff([]string{"10.180.0.13:53 25/0/0 listed=true ", "10.180.0.14:53 12/0/0 listed=true ", "10.180.0.12:53 4/0/0 listed=false "},
		ctEndpointWords(ctPortNamed(t, cr, "ns8/svc8:dns"))); diff != "" {
		t.Errorf("svc8 (-want +got):\n%s", diff)
	}
	if got := ctPortNamed(t, cr, "ns9/svc9").Frontends; len(got) != 2 || got[1].Dest != "*:30080" || got[1].Entries != 5 {
		t.Errorf("svc9's node port entries: %+v", got)
	}
	if svc11 := ctPortNamed(t, cr, "ns11/svc11:p80"); svc11.Tested != "clients" || svc11.TestN != 2 || svc11.Verdict != "too few" {
		t.Errorf("svc11 (affinity): tested %q n %d verdict %s", svc11.Tested, svc11.TestN, svc11.Verdict)
	}
	if diff := cmp.Diff([]string{"cluster no-local-endpoint ns5/svc5:p80", "traffic long-lived-skew ns2/svc2:p80", "conntrack stale-udp-conntrack ns8/svc8:dns"}, findingWords(r)); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
	f := has(r, LevelFinding, KindStaleUDP)
	if len(f.Evidence) != 4 || !strings.Contains(f.Message, "4 UDP entries still send to 10.180.0.12:53") {
		t.Errorf("stale UDP: %s %v", f.Message, f.Evidence)
	}
	if n := has(r, LevelNote, KindStaleTCP); n == nil || n.Port != "ns1/svc1:p80" || !strings.Contains(n.Message, "10.180.0.2:80") || len(n.Evidence) != 2 {
		t.Errorf("stale TCP note: %+v", n)
	}
	if n := has(r, LevelNote, KindConntrackOutside); n == nil || !strings.Contains(n.Message, "6 of 278") {
		t.Errorf("outside note: %+v", n)
	}
}

// flowAt builds a translated IPv4 entry: client → dest, answered by ep.
func flowAt(line int, proto, state string, assured bool, client string, sport int, dest, ep string) *Flow {
	d := netip.MustParseAddrPort(dest)
	e := netip.MustParseAddrPort(ep)
	c := netip.MustParseAddr(client)
	f := &Flow{Family: "ipv4", Proto: proto, State: state, Assured: assured, Timeout: 1000 + line,
		Orig:  Tuple{Src: c, Dst: d.Addr(), SPort: sport, DPort: int(d.Port())},
		Reply: Tuple{Src: e.Addr(), Dst: c, SPort: int(e.Port()), DPort: sport}}
	f.Line = Line{File: "ct.txt", Line: line, Text: fmt.Sprintf("%s %s src=%s dst=%s sport=%d dport=%d src=%s", proto, state, client, d.Addr(), sport, d.Port(), e.Addr())}
	return f
}

// established adds n long-lived connections of one client per endpoint
// count to ct.
func established(ct *Conntrack, dest string, sp *ServicePort, counts []int, client func(i int) string) {
	for i, n := range counts {
		for j := 0; j < n; j++ {
			ct.Entries = append(ct.Entries, flowAt(len(ct.Entries)+1, "tcp", "ESTABLISHED", true, client(j), 30000+len(ct.Entries), dest, sp.Endpoints[i].Addr.String()))
		}
	}
}

func dest(sp *ServicePort) string { return netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)).String() }

// A fair multinomial sample of long-lived connections is no finding; the
// same port with a skewed sample is one, naming the endpoint pinned more
// than its share. Entries that are not long-lived (other TCP states,
// ESTABLISHED without ASSURED) are counted, not tested.
func TestConntrackLongLivedSplit(t *testing.T) {
	sp := port("demo/web:http", fairCascade(3), nil)
	for _, c := range []struct {
		counts []uint64
		skew   bool
	}{{draw(7, 300, []float64{1. / 3, 1. / 3, 1. / 3}), false}, {[]uint64{150, 80, 70}, true}} {
		ct := &Conntrack{File: "ct.txt", Shown: -1}
		counts := make([]int, 3)
		for i, n := range c.counts {
			counts[i] = int(n)
		}
		established(ct, dest(sp), sp, counts, func(j int) string { return fmt.Sprintf("10.0.%d.%d", j/200, 1+j%200) })
		ct.Entries = append(ct.Entries, flowAt(900, "tcp", "TIME_WAIT", true, "10.0.9.1", 40000, dest(sp), sp.Endpoints[0].Addr.String()),
			flowAt(901, "tcp", "ESTABLISHED", false, "10.0.9.1", 40001, dest(sp), sp.Endpoints[0].Addr.String()))
		r := Analyze(dumpOf(false, sp), Options{Conntrack: ct})
		cp := r.Conntrack.Ports[0]
		if cp.TestN != 300 || cp.LongLived != 300 || cp.Counts.Total() != 302 || cp.Chi == nil {
			t.Fatalf("counts %v: tested %d, long-lived %d, entries %d", c.counts, cp.TestN, cp.LongLived, cp.Counts.Total())
		}
		f := has(r, LevelFinding, KindLongLivedSkew)
		if (f != nil) != c.skew {
			t.Errorf("counts %v: finding %v, want %v (p = %v)", c.counts, f, c.skew, cp.P)
		}
		if c.skew && (cp.Endpoints[0].Pinned != "more" || !strings.Contains(f.Message, "pinned more than their share: 10.244.1.10:8080 holds 150 (0.500")) {
			t.Errorf("skew: %s / %s", cp.Endpoints[0].Pinned, f.Message)
		}
	}
}

// With ClientIP affinity the test counts clients: 40 clients spread
// evenly, each with a different number of connections, fit the split
// although their connections do not.
func TestConntrackAffinityCountsClients(t *testing.T) {
	sp := port("demo/sticky:http", fairCascade(2), nil)
	sp.Affinity = &Affinity{Timeout: 10800e9, Mechanism: "recent"}
	ct := &Conntrack{File: "ct.txt", Shown: -1}
	for c := 0; c < 40; c++ {
		ep := sp.Endpoints[c%2].Addr.String()
		conns := 1
		if c%2 == 0 {
			conns = 5 // the first endpoint's clients hold five connections each
		}
		for k := 0; k < conns; k++ {
			ct.Entries = append(ct.Entries, flowAt(len(ct.Entries)+1, "tcp", "ESTABLISHED", true, fmt.Sprintf("10.0.0.%d", 1+c), 30000+len(ct.Entries), dest(sp), ep))
		}
	}
	r := Analyze(dumpOf(false, sp), Options{Conntrack: ct})
	cp := r.Conntrack.Ports[0]
	if cp.Tested != "clients" || cp.TestN != 40 || cp.LongLived != 120 || cp.Verdict != "as intended" || has(r, LevelFinding, KindLongLivedSkew) != nil {
		t.Errorf("affinity: tested %q n %d long-lived %d verdict %s", cp.Tested, cp.TestN, cp.LongLived, cp.Verdict)
	}
}

// Entries that are not translated (their reply source is the service
// address): a finding for UDP (kube-proxy's cleanup deletes them), a note
// for TCP. An IPVS real server of weight 0 keeps its long-lived
// connections out of the test. IPv6 entries and entries to a node port's
// number that were not translated are not the dump's; a count that
// differs from conntrack's is a note.
func TestConntrackUntranslatedQuiescedAndOutside(t *testing.T) {
	udp := port("demo/dns:dns", fairCascade(2), nil)
	udp.Protocol = "udp"
	udp.Frontends = []Frontend{{What: "node port", Port: 30053, Endpoints: []netip.AddrPort{udp.Endpoints[0].Addr}}}
	web := port("demo/ipvs:http", []float64{0.5, 0.5, 0}, nil)
	web.Scheduler = "rr"
	for i, w := range []int{1, 1, 0} {
		web.Endpoints[i].Weight = w
	}
	ct := &Conntrack{File: "ct.txt", Shown: 99}
	for i := 0; i < 3; i++ {
		f := flowAt(i+1, "udp", "", false, "10.0.0.5", 5000+i, dest(udp), dest(udp))
		f.Unreplied = true
		ct.Entries = append(ct.Entries, f)
	}
	ct.Entries = append(ct.Entries, flowAt(4, "tcp", "SYN_SENT", false, "10.0.0.5", 6000, dest(udp), dest(udp)))
	ct.Entries[3].Proto = "tcp" // a TCP entry to the UDP port's address: another port
	ct.Entries = append(ct.Entries, flowAt(5, "udp", "", true, "10.0.0.6", 5100, "192.0.2.10:30053", udp.Endpoints[0].Addr.String()),
		flowAt(6, "udp", "", false, "10.0.0.6", 5101, "192.0.2.10:30053", "192.0.2.10:30053"))
	established(ct, dest(web), web, []int{30, 30, 25}, func(j int) string { return fmt.Sprintf("10.1.0.%d", 1+j) })
	v6 := flowAt(200, "tcp", "ESTABLISHED", true, "10.0.0.7", 7000, dest(web), web.Endpoints[0].Addr.String())
	v6.Family = "ipv6"
	ct.Entries = append(ct.Entries, v6)
	r := Analyze(dumpOf(false, udp, web), Options{Conntrack: ct})
	cu := ctPortNamed(t, r.Conntrack, "demo/dns:dns")
	if cu.Untranslated.UDP != 3 || cu.Frontends[1].Entries != 1 || cu.Counts.Total() != 4 {
		t.Errorf("udp port: untranslated %+v, node port entries %d, entries %d", cu.Untranslated, cu.Frontends[1].Entries, cu.Counts.Total())
	}
	if f := has(r, LevelFinding, KindUntranslatedUDP); f == nil || f.About != AboutConntrack || len(f.Evidence) != 3 {
		t.Errorf("untranslated UDP finding: %+v", f)
	}
	cw := ctPortNamed(t, r.Conntrack, "demo/ipvs:http")
	if cw.TestN != 60 || cw.LongLived != 85 || cw.Verdict != "as intended" || cw.Endpoints[2].Tested != 0 {
		t.Errorf("ipvs port: tested %d of %d long-lived, verdict %s, quiesced tested %d", cw.TestN, cw.LongLived, cw.Verdict, cw.Endpoints[2].Tested)
	}
	if r.Conntrack.IPv6 != 1 || r.Conntrack.NotService.Total() != 3 {
		t.Errorf("outside: ipv6 %d, not service %+v", r.Conntrack.IPv6, r.Conntrack.NotService)
	}
	if n := has(r, LevelNote, KindConntrackCount); n == nil || !strings.Contains(n.Message, "holds 92 entries where conntrack said it showed 99") {
		t.Errorf("count note: %+v", n)
	}
}

// Every output form carries the conntrack report.
func TestConntrackOutputs(t *testing.T) {
	data, err := os.ReadFile("testdata/iptables/overall.nft.save")
	if err != nil {
		t.Fatal(err)
	}
	d, err := ReadIPTablesSave("overall.nft.save", data)
	if err != nil {
		t.Fatal(err)
	}
	r := Analyze(d, Options{Conntrack: readConntrackFixture(t, "overall.conntrack")})
	var tb, md, js bytes.Buffer
	if err := r.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"long-lived (TCP ESTABLISHED and ASSURED): 201 of 272 service entries", "ns2/svc2:p80    10.180.0.4:80", "pinned more than its share",
		"stale: not in the rules", "node port *:30010: 10 (10 long-lived), externalTrafficPolicy Local: not in the test"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	for _, want := range []string{"## Conntrack", "### ns2/svc2:p80 (conntrack)", "| 10.180.0.4:80 | 56 | 48 | 48 | 0.533 |", "Long-lived: TCP entries in state ESTABLISHED"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	var back struct {
		Conntrack struct {
			LongLived int `json:"longLived"`
			Ports     []struct {
				Port    string `json:"port"`
				Verdict string `json:"verdict"`
			} `json:"ports"`
		} `json:"conntrack"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Conntrack.LongLived != 201 || len(back.Conntrack.Ports) != len(d.Ports) {
		t.Errorf("json: %v %+v", err, back.Conntrack)
	}
	dir := t.TempDir()
	if err := r.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "report.json")); err != nil || !bytes.Contains(b, []byte(`"longLivedDefinition"`)) {
		t.Errorf("report.json: %v", err)
	}
}

// The same traffic through the nftables layout of the same Services
// (MODE=nftables gen-conntrack.sh: testdata/nft/overall.nft loaded with
// nft): external and load-balancer IPs are ports of their own there, node
// ports are frontends, and the conntrack findings are the same kinds as in
// iptables mode. The node's listing at the capture and the committed one
// give the same report.
func TestConntrackNFTables(t *testing.T) {
	ct := readConntrackFixture(t, "nftables.conntrack")
	if ct.Shown != 278 || len(ct.Entries) != 278 {
		t.Fatalf("shown %d, entries %d", ct.Shown, len(ct.Entries))
	}
	var first []byte
	for _, dump := range []string{"conntrack/nftables-node.nft", "nft/overall.nft"} {
		data, err := os.ReadFile(filepath.Join("testdata", dump))
		if err != nil {
			t.Fatal(err)
		}
		d, err := ReadNFT(dump, data)
		if err != nil {
			t.Fatal(err)
		}
		r := Analyze(d, Options{Conntrack: ct})
		got, _ := json.Marshal(r.Conntrack)
		if first != nil {
			if !bytes.Equal(first, got) {
				t.Errorf("%s: the conntrack report differs from the node's own listing's", dump)
			}
			continue
		}
		first = got
		cr := r.Conntrack
		if cr.Service != (Counts{TCPEstablished: 201, TCPOther: 30, UDP: 41}) || cr.NotService.Total() != 6 {
			t.Errorf("totals: service %+v, elsewhere %+v", cr.Service, cr.NotService)
		}
		if diff := cmp.Diff([]string{"10.180.0.4:80 44/35/35 listed=true ", "10.180.0.5:80 58/47/47 listed=true more", "10.180.1.7:80 18/8/8 listed=true less"},
			ctEndpointWords(ctPortNamed(t, cr, "ns2/svc2:p80"))); diff != "" {
			t.Errorf("svc2 (-want +got):\n%s", diff)
		}
		lb := ctPortNamed(t, cr, "ns10/svc10:p80 via load-balancer IP 1.2.3.10:80")
		svc10 := ctPortNamed(t, cr, "ns10/svc10:p80")
		if lb.Verdict != "not tested" || lb.LongLived != 6 || svc10.TestN != 40 || svc10.Frontends[1].Dest != "*:30010" || svc10.Frontends[1].Entries != 10 || svc10.Frontends[1].Tested {
			t.Errorf("svc10: load-balancer IP %s (%d long-lived); cluster IP tested %d, destinations %+v", lb.Verdict, lb.LongLived, svc10.TestN, svc10.Frontends)
		}
		if e := ctPortNamed(t, cr, "ns8/svc8:dns").Endpoints; len(e) != 3 || e[2].Addr.String() != "10.180.0.12:53" || e[2].Listed || e[2].Counts.UDP != 9 {
			t.Errorf("svc8: %v", ctEndpointWords(ctPortNamed(t, cr, "ns8/svc8:dns")))
		}
		var ct []string
		for _, f := range r.Findings {
			if f.Level == LevelFinding && (f.About == AboutConntrack || f.Kind == KindLongLivedSkew) {
				ct = append(ct, f.Kind+" "+f.Port)
			}
		}
		if diff := cmp.Diff([]string{"long-lived-skew ns2/svc2:p80", "stale-udp-conntrack ns8/svc8:dns"}, ct); diff != "" {
			t.Errorf("conntrack findings (-want +got):\n%s", diff)
		}
	}
}
