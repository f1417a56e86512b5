package diagnose

import (
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kpsim/kpsim/sim/scenario"
)

// The read-backs in testdata/nft/ are what the real nft listed after our
// rules for testdata/nft-scenario.yaml (node-a) were loaded into a
// namespace (make diagnose-testdata-nft): the correct rules and two named
// faults, as text (whole ruleset and `list table`) and JSON.

func nftReadBack(t *testing.T, name string) *Dump {
	t.Helper()
	path := filepath.Join("testdata/nft", name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := ReadNFT(path, data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

func portNamed(t *testing.T, d *Dump, name string) *ServicePort {
	t.Helper()
	for _, sp := range d.Ports {
		if sp.Name == name {
			return sp
		}
	}
	t.Fatalf("%s: no port %s", d.File, name)
	return nil
}

var addrs = cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{})

var forms = []string{".nft", "-table.nft", ".json"}

// The ports of nft-scenario.yaml as node-a's rules handle them.
var wantPorts = []struct {
	name     string
	ip       string
	port     int
	proto    string
	n        int
	noEp     string
	local    bool
	affinity bool
}{
	{"demo/two:http", "10.96.0.2", 80, "tcp", 2, "", false, false},
	{"demo/three:http", "10.96.0.3", 80, "tcp", 3, "", false, false},
	{"demo/dns:dns-tcp", "10.96.0.10", 53, "tcp", 2, "", false, false},
	{"demo/dns:dns", "10.96.0.10", 53, "udp", 2, "", false, false},
	{"demo/web20:http", "10.96.0.20", 80, "tcp", 20, "", false, false},
	{"demo/web50:http", "10.96.0.50", 80, "tcp", 50, "", false, false},
	{"demo/web200:http", "10.96.0.200", 80, "tcp", 200, "", false, false},
	{"demo/sticky:http", "10.96.1.1", 80, "tcp", 3, "", false, true},
	{"demo/local:http", "10.96.1.2", 80, "tcp", 2, "", true, false}, // node-a's two of three
	{"demo/local-none:http", "10.96.1.3", 80, "tcp", 0, "DROP", true, false},
	{"demo/empty:http", "10.96.1.4", 80, "tcp", 0, "REJECT", false, false},
}

func TestReadNFTFairSplit(t *testing.T) {
	for _, form := range forms {
		t.Run(form, func(t *testing.T) {
			d := nftReadBack(t, "fair"+form)
			if d.Mode != "nftables" || d.Counters || d.CountersWhy != CountersWhyNFT {
				t.Errorf("mode %q counters %v why %q", d.Mode, d.Counters, d.CountersWhy)
			}
			if len(d.Skipped) != 0 {
				t.Errorf("skipped: %+v", d.Skipped)
			}
			if len(d.Ports) != len(wantPorts) {
				t.Fatalf("%d ports, want %d", len(d.Ports), len(wantPorts))
			}
			for i, w := range wantPorts {
				sp := d.Ports[i] // sorted by ClusterIP, port, protocol
				if sp.Name != w.name || sp.ClusterIP != netip.MustParseAddr(w.ip) || sp.Port != w.port || sp.Protocol != w.proto {
					t.Errorf("port %d: %s %s:%d/%s, want %s %s:%d/%s", i, sp.Name, sp.ClusterIP, sp.Port, sp.Protocol, w.name, w.ip, w.port, w.proto)
					continue
				}
				if len(sp.Endpoints) != w.n || sp.NoEndpoints != w.noEp || sp.LocalOnly != w.local || (sp.Affinity != nil) != w.affinity {
					t.Errorf("%s: %d endpoints, no-endpoints %q, local %v, affinity %v; want %d %q %v %v", w.name,
						len(sp.Endpoints), sp.NoEndpoints, sp.LocalOnly, sp.Affinity != nil, w.n, w.noEp, w.local, w.affinity)
				}
				if sp.Scheduler != "numgen" || !sp.Exact {
					t.Errorf("%s: scheduler %q exact %v", w.name, sp.Scheduler, sp.Exact)
				}
				for _, ep := range sp.Endpoints {
					if math.Abs(ep.P-1/float64(w.n)) > 1e-12 {
						t.Errorf("%s: %s has P = %v, want 1/%d", w.name, ep.Addr, ep.P, w.n)
					}
				}
				if len(sp.Evidence) == 0 {
					t.Errorf("%s: no evidence", w.name)
				}
			}
			local := portNamed(t, d, "demo/local:http")
			for _, ep := range local.Endpoints {
				if !netip.MustParsePrefix("10.244.0.0/24").Contains(ep.Addr.Addr()) {
					t.Errorf("local-policy port lists %s, not an endpoint of node-a", ep.Addr)
				}
			}
			if web := portNamed(t, d, "demo/web200:http"); web.Endpoints[0].Addr.String() != "10.244.2.100:8080" {
				t.Errorf("web200's first endpoint is %s, want 10.244.2.100:8080 (kube-proxy's string order)", web.Endpoints[0].Addr)
			}
		})
	}
}

func TestReadNFTAffinityWithElements(t *testing.T) {
	for _, form := range forms {
		t.Run(form, func(t *testing.T) {
			sp := portNamed(t, nftReadBack(t, "fair"+form), "demo/sticky:http")
			a := sp.Affinity
			if a == nil || a.Mechanism != "set" || a.Timeout != 3*time.Hour || !a.ClientsKnown {
				t.Fatalf("affinity %+v, want set, 3h, clients known", a)
			}
			// gen-nft.sh added two clients to the set of 10.244.1.61
			// (the set's timeout, 3h) and one with a timeout of its own,
			// 1h, to that of 10.244.1.60, a moment before listing: the
			// time left is just under the timeout (whole seconds).
			type client struct {
				addr    string
				timeout time.Duration
			}
			want := map[string][]client{
				"10.244.0.60:8080": nil,
				"10.244.1.60:8080": {{"10.244.1.200", time.Hour}},
				"10.244.1.61:8080": {{"10.244.0.200", 3 * time.Hour}, {"10.244.0.201", 3 * time.Hour}},
			}
			for _, ep := range sp.Endpoints {
				w, ok := want[ep.Addr.String()]
				if !ok {
					t.Errorf("unexpected endpoint %s", ep.Addr)
					continue
				}
				if len(ep.Clients) != len(w) {
					t.Errorf("%s: clients %+v, want %+v", ep.Addr, ep.Clients, w)
					continue
				}
				for i, c := range ep.Clients {
					if c.Addr.String() != w[i].addr || c.Expires > w[i].timeout || c.Expires < w[i].timeout-time.Minute || c.Expires%time.Second != 0 {
						t.Errorf("%s: client %s expires in %v, want %s just under %v, whole seconds", ep.Addr, c.Addr, c.Expires, w[i].addr, w[i].timeout)
					}
				}
				if !strings.HasPrefix(ep.Chain, "endpoint-") {
					t.Errorf("%s: chain %q, want its endpoint chain", ep.Addr, ep.Chain)
				}
			}
		})
	}
}

// cascadeShares is what a cascade with probability 1/n in every rule
// gives (the uniform-probability fault): 1/n, (1-1/n)/n, ..., the
// remainder to the last.
func cascadeShares(n int) []float64 {
	out := make([]float64, n)
	rest := 1.0
	for i := range n - 1 {
		out[i] = rest / float64(n)
		rest -= out[i]
	}
	out[n-1] = rest
	return out
}

func TestReadNFTUniformProbabilityFault(t *testing.T) {
	for _, form := range forms {
		t.Run(form, func(t *testing.T) {
			d := nftReadBack(t, "uniform-probability"+form)
			if len(d.Skipped) != 0 {
				t.Fatalf("skipped: %+v", d.Skipped)
			}
			for _, w := range wantPorts {
				sp := portNamed(t, d, w.name)
				if len(sp.Endpoints) != w.n {
					t.Fatalf("%s: %d endpoints, want %d", w.name, len(sp.Endpoints), w.n)
				}
				if w.n == 0 {
					continue
				}
				// Exact while n^(n-1) < 2^31, else the buckets of
				// mod 2^31 round each share to 2^-31, and the last
				// (the remainder) gathers the roundings.
				tol := 1e-12
				if w.n > 10 {
					tol = float64(w.n) / (1 << 31)
				}
				want := cascadeShares(w.n)
				for i, ep := range sp.Endpoints {
					if math.Abs(ep.P-want[i]) > tol {
						t.Errorf("%s: endpoint %d (%s) has P = %.10f, want %.10f", w.name, i, ep.Addr, ep.P, want[i])
					}
				}
			}
			if three := portNamed(t, d, "demo/three:http"); math.Abs(three.Endpoints[2].P-4.0/9) > 1e-12 {
				t.Errorf("three's last endpoint has P = %v, want 4/9", three.Endpoints[2].P)
			}
		})
	}
}

func TestReadNFTSkewAtMDEFault(t *testing.T) {
	for _, form := range forms {
		t.Run(form, func(t *testing.T) {
			d := nftReadBack(t, "skew-at-mde"+form)
			for _, w := range wantPorts {
				sp := portNamed(t, d, w.name)
				if len(sp.Endpoints) != w.n {
					t.Fatalf("%s: %d endpoints, want %d", w.name, len(sp.Endpoints), w.n)
				}
				k := float64(w.n)
				for i, ep := range sp.Endpoints {
					// numgen mod 10k(k-1): 11(k-1) values for the
					// first endpoint, 10k-11 for each other.
					want := (10*k - 11) / (10 * k * (k - 1))
					if i == 0 {
						want = 11 / (10 * k)
					}
					if math.Abs(ep.P-want) > 1e-12 {
						t.Errorf("%s: endpoint %d has P = %v, want %v", w.name, i, ep.P, want)
					}
				}
			}
		})
	}
}

func TestReadNFTIgnoresOtherTables(t *testing.T) {
	d := nftReadBack(t, "fair.nft")
	var got []string
	for _, ig := range d.Ignored {
		got = append(got, ig.What+" @"+strconv.Itoa(ig.First.Line)+" +"+strconv.Itoa(ig.Lines))
	}
	want := []string{"table inet filter @250 +7", "table ip nat @257 +10",
		"table ip6 kube-proxy (kube-proxy's IPv6 rules: only IPv4 is read) @267 +5"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ignored (-want +got):\n%s", diff)
	}
	if d := nftReadBack(t, "fair-table.nft"); len(d.Ignored) != 0 {
		t.Errorf("nft list table: ignored %+v", d.Ignored)
	}
}

// normalized drops what differs between the text and the JSON form by
// nature: where things are (lines; JSON is one line), the format, and the
// size of ignored tables (lines in text, objects in JSON).
func normalized(d *Dump) *Dump {
	c := *d
	c.File, c.Format = "", ""
	c.Ignored = nil
	for _, ig := range d.Ignored {
		c.Ignored = append(c.Ignored, Ignored{What: ig.What})
	}
	c.Skipped = nil
	for _, s := range d.Skipped {
		c.Skipped = append(c.Skipped, Skipped{Reason: s.Reason})
	}
	c.Ports = nil
	for _, sp := range d.Ports {
		p := *sp
		p.Evidence = nil
		if sp.Affinity != nil {
			a := *sp.Affinity
			a.Evidence = Line{}
			p.Affinity = &a
		}
		p.Endpoints = nil
		for _, ep := range sp.Endpoints {
			e := *ep
			e.Evidence = Line{}
			// The two listings ran one after the other: the time
			// left may differ by a tick (compared apart).
			e.Clients = nil
			for _, c := range ep.Clients {
				e.Clients = append(e.Clients, Client{Addr: c.Addr})
			}
			p.Endpoints = append(p.Endpoints, &e)
		}
		c.Ports = append(c.Ports, &p)
	}
	return &c
}

func TestReadNFTTextAndJSONAgree(t *testing.T) {
	for _, v := range []string{"fair", "uniform-probability", "skew-at-mde"} {
		text, js := nftReadBack(t, v+".nft"), nftReadBack(t, v+".json")
		if text.Format != FormatNFT || js.Format != FormatNFTJSON {
			t.Errorf("formats %q %q", text.Format, js.Format)
		}
		if diff := cmp.Diff(normalized(text), normalized(js), addrs); diff != "" {
			t.Errorf("%s: text and JSON differ (-text +json):\n%s", v, diff)
			continue
		}
		for i, sp := range text.Ports {
			for j, ep := range sp.Endpoints {
				for k, c := range ep.Clients {
					if d := c.Expires - js.Ports[i].Endpoints[j].Clients[k].Expires; d < -2*time.Second || d > 2*time.Second {
						t.Errorf("%s: %s expires in %v in the text, %v in the JSON", v, c.Addr, c.Expires, js.Ports[i].Endpoints[j].Clients[k].Expires)
					}
				}
			}
		}
	}
}

// kube-proxy 1.29-1.36: one chain per endpoint, the service chain picks
// one with a numgen vmap; here with counters someone added.
const olderLayout = `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . udp . 53 : goto service-ULMVA6XW-kube-system/kube-dns/udp/dns }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr . meta l4proto . th dport vmap @service-ips
	}

	chain service-ULMVA6XW-kube-system/kube-dns/udp/dns {
		ip daddr 10.96.0.10 udp dport 53 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 3 vmap { 0 : goto endpoint-5OJB2KTY-kube-system/kube-dns/udp/dns__10.244.0.2/53, 1 : goto endpoint-ZZ4TVNBM-kube-system/kube-dns/udp/dns__10.244.0.3/53, 2 : goto endpoint-7RVP4LUQ-kube-system/kube-dns/udp/dns__10.244.1.2/53 }
	}

	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}

	chain endpoint-5OJB2KTY-kube-system/kube-dns/udp/dns__10.244.0.2/53 {
		ip saddr 10.244.0.2 jump mark-for-masquerade
		meta l4proto udp counter packets 1200 bytes 90000 dnat to 10.244.0.2:53
	}

	chain endpoint-ZZ4TVNBM-kube-system/kube-dns/udp/dns__10.244.0.3/53 {
		ip saddr 10.244.0.3 jump mark-for-masquerade
		meta l4proto udp counter packets 1100 bytes 80000 dnat to 10.244.0.3:53
	}

	chain endpoint-7RVP4LUQ-kube-system/kube-dns/udp/dns__10.244.1.2/53 {
		ip saddr 10.244.1.2 jump mark-for-masquerade
		meta l4proto udp counter packets 0 bytes 0 dnat to 10.244.1.2:53
	}
}
`

func TestReadNFTOlderLayoutWithCounters(t *testing.T) {
	d, err := ReadNFT("old.nft", []byte(olderLayout))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Skipped) != 0 || len(d.Ports) != 1 {
		t.Fatalf("skipped %+v, %d ports", d.Skipped, len(d.Ports))
	}
	sp := d.Ports[0]
	if sp.Name != "kube-system/kube-dns:dns" || sp.Protocol != "udp" || sp.Affinity != nil {
		t.Errorf("port %s %s affinity %v", sp.Name, sp.Protocol, sp.Affinity)
	}
	var got []string
	for _, ep := range sp.Endpoints {
		got = append(got, ep.Addr.String()+" "+ep.Chain[:17]+" "+strconv.Itoa(int(ep.Observed))+" "+strconv.Itoa(int(math.Round(ep.P*3000))))
	}
	want := []string{"10.244.0.2:53 endpoint-5OJB2KTY 1200 1000", "10.244.0.3:53 endpoint-ZZ4TVNBM 1100 1000", "10.244.1.2:53 endpoint-7RVP4LUQ 0 1000"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	if !d.Counters || !strings.Contains(d.CountersWhy, "someone added") {
		t.Errorf("counters %v %q: every endpoint rule has one, they should be used", d.Counters, d.CountersWhy)
	}
	// Without the counter on one endpoint none is used.
	d, err = ReadNFT("old.nft", []byte(strings.Replace(olderLayout, "counter packets 0 bytes 0 ", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if d.Counters || d.Ports[0].Endpoints[0].Observed != 0 {
		t.Errorf("counters %v, observed %d: a partial set of counters must not be used", d.Counters, d.Ports[0].Endpoints[0].Observed)
	}
}

func TestReadNFTSkipsUnknownConstructs(t *testing.T) {
	in := `table ip kube-proxy {
	flowtable ft {
		hook ingress priority filter
		devices = { lo }
	}

	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.2 . tcp . 80 : goto service-TAZRFJ6F-demo/two/tcp/http }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr . meta l4proto . th dport vmap @service-ips
	}

	chain service-TAZRFJ6F-demo/two/tcp/http {
		ip daddr 10.96.0.2 ct helper set "ftp"
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.0.2 . 8080, 1 : 10.244.1.2 . 8080 }
		jump nowhere
	}
}
`
	d, err := ReadNFT("u.nft", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range d.Skipped {
		got = append(got, strconv.Itoa(s.Line.Line)+": "+s.Reason)
	}
	want := []string{
		`2: object "flowtable ft" is not one kube-proxy writes`,
		`18: the tracer does not understand this rule (unknown expression at "ct helper set \"ftp\""): left out`,
		`20: the rule names chain nowhere, which the dump does not define: left out`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
	if sp := d.Ports[0]; len(sp.Endpoints) != 2 || sp.Endpoints[0].P != 0.5 {
		t.Errorf("the port's rules that were understood should still give 1/2 each: %+v", sp.Endpoints)
	}
}

func TestReadNFTMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"statement outside a table", "chain services {\n}\n",
			`bad.nft:1:1: ruleset: expected "table" (every statement of a listing is inside a table), found "chain"`},
		{"unbalanced braces", "table ip kube-proxy {\n\tchain services {\n\t\tjump x\n",
			`bad.nft:4:1: chain services: expected "}" closing the chain opened at line 2 (unbalanced braces)`},
		{"unbalanced elements", "table ip kube-proxy {\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 10.0.0.1,\n",
			`bad.nft:5:1: set s elements: expected "}" closing the elements opened at line 4:14 (unbalanced braces)`},
		{"unbalanced table", "table ip kube-proxy {\n",
			`bad.nft:2:1: table ip kube-proxy: expected "}" closing the table opened at line 1 (unbalanced braces)`},
		{"unbalanced set", "table ip kube-proxy {\n\tset s {\n\t\ttype ipv4_addr\n",
			`bad.nft:4:1: set s: expected "}" closing the set opened at line 2 (unbalanced braces)`},
		{"unbalanced map", "table ip kube-proxy {\n\tmap m {\n\t\ttype ipv4_addr : verdict\n",
			`bad.nft:4:1: map m: expected "}" closing the map opened at line 2 (unbalanced braces)`},
		{"chain without a name", "table ip kube-proxy {\n\tchain {\n",
			`bad.nft:2:8: table ip kube-proxy chain: expected a chain name, found "{"`},
		{"map without a name", "table ip kube-proxy {\n\tmap {\n",
			`bad.nft:2:6: table ip kube-proxy map: expected a map name, found "{"`},
		{"chain without a brace", "table ip kube-proxy {\n\tchain c\n}\n",
			`bad.nft:2:9: chain c: expected "{", found end of line`},
		{"unterminated string", "table ip kube-proxy {\n\tcomment \"rules for\n}\n",
			`bad.nft:2:10: string: unterminated string: expected a closing " on the same line`},
		{"table without a name", "table ip {\n}\n",
			`bad.nft:1:10: table ip: expected a table name, found "{"`},
		{"bad timeout", "table ip kube-proxy {\n\tset s {\n\t\ttimeout soon\n\t}\n}\n",
			`bad.nft:3:11: set s timeout: expected a duration (3h, 10800s), found "soon"`},
		{"map element without a value", "table ip kube-proxy {\n\tmap m {\n\t\ttype ipv4_addr : verdict\n\t\telements = { 10.0.0.1 }\n\t}\n}\n",
			`bad.nft:4:16: map m elements: expected "KEY : VALUE" in a map element`},
		{"bad priority", "table ip kube-proxy {\n\tchain c {\n\t\ttype nat hook prerouting priority soon; policy accept;\n\t}\n}\n",
			`bad.nft:2:1: chain c: expected a base chain priority (a number or filter, dstnat, srcnat, ... with an offset), found "soon"`},
		{"JSON that does not parse", `{"nftables": [{"table": {]}`,
			`bad.nft:1:26: json: expected valid JSON (invalid character ']' looking for beginning of object key string)`},
		{"JSON cut short", `{"nftables": [`,
			`bad.nft:1:15: json: expected valid JSON (unexpected end of input)`},
		{"JSON of another shape", `{"rules": []}`,
			`bad.nft:1:2: json: expected {"nftables": [...]}, found key "rules"`},
		{"JSON list not a list", `{"nftables": {}}`,
			`bad.nft:1:14: json: expected {"nftables": [...]}: "nftables" must be a list, found "{"`},
		{"JSON rule before its chain", `{"nftables": [{"table": {"family": "ip", "name": "kube-proxy"}}, {"rule": {"family": "ip", "table": "kube-proxy", "chain": "c", "expr": []}}]}`,
			`bad.nft:1:66: rule: expected the chain "c" of the rule to be listed before it`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ReadNFT("bad.nft", []byte(tc.in))
			if err == nil {
				t.Fatalf("no error; dump %+v", d)
			}
			if !scenario.IsInvalid(err) {
				t.Errorf("%v is not bad input (exit 2)", err)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestReadNFTDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"3h": 3 * time.Hour, "2h59m59s968ms": 3*time.Hour - 32*time.Millisecond, "1d2h": 26 * time.Hour, "10800": 3 * time.Hour, "10800s": 3 * time.Hour,
	} {
		if got, err := parseNFTDuration(in); err != nil || got != want {
			t.Errorf("%s: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "h", "3x", "-3h"} {
		if _, err := parseNFTDuration(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// iptables-nft's tables come with a warning comment and rules nft can
// only print as xt expressions; both are someone else's, so ignored.
func TestReadNFTIptablesNFTTables(t *testing.T) {
	in := `# Warning: table ip nat is managed by iptables-nft, do not touch!
table ip nat {
	chain DOCKER {
		iifname "docker0" counter packets 0 bytes 0 return
	}

	chain POSTROUTING {
		type nat hook postrouting priority srcnat; policy accept;
		oifname != "docker0" ip saddr 172.17.0.0/16 counter packets 3 bytes 180 xt target "MASQUERADE"
	}
}
`
	d, err := ReadNFT("ipt.nft", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Ports) != 0 || len(d.Skipped) != 0 || len(d.Ignored) != 1 || d.Ignored[0].What != "table ip nat" || d.Ignored[0].Lines != 10 || d.Ignored[0].First.Line != 2 {
		t.Errorf("ports %d, skipped %+v, ignored %+v; want only table ip nat ignored, lines 2-11", len(d.Ports), d.Skipped, d.Ignored)
	}
}
