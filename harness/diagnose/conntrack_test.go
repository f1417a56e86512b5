package diagnose

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kpsim/kpsim/sim/scenario"
)

// The conntrack fixtures are real captures (testdata/conntrack/README.md,
// gen-conntrack.sh): a node namespace programmed with
// testdata/iptables/overall.nft.save after two stages of traffic, and the
// output forms of entries conntrack -I inserted.

func readConntrackFixture(t *testing.T, name string) *Conntrack {
	t.Helper()
	path := filepath.Join("testdata", "conntrack", name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := ReadConntrack(path, data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return ct
}

// flowKey is an entry without its timeout, line and id.
type flowKey struct {
	proto, state       string
	orig, reply        Tuple
	unreplied, assured bool
}

func keyOf(f *Flow) flowKey {
	return flowKey{f.Proto, f.State, f.Orig, f.Reply, f.Unreplied, f.Assured}
}

// The node's table, twice: conntrack -L > FILE 2>&1 (the count line cut
// entry 274 in two: the reader joins it) and -o extended,id. Both hold the
// 278 entries the traffic made, the same ones.
func TestReadConntrackOverall(t *testing.T) {
	plain := readConntrackFixture(t, "overall.conntrack")
	ext := readConntrackFixture(t, "overall-extended.conntrack")
	if plain.Shown != 278 || ext.Shown != -1 {
		t.Errorf("shown: plain %d, extended %d; want 278 and -1 (no count line)", plain.Shown, ext.Shown)
	}
	if len(plain.Entries) != 278 || len(ext.Entries) != 278 {
		t.Fatalf("entries: plain %d, extended %d; want 278", len(plain.Entries), len(ext.Entries))
	}
	joined := plain.Entries[273]
	if joined.Line.Line != 274 || !strings.HasSuffix(joined.Line.Text, "[ASSURED] mark=0 use=1") || strings.Contains(joined.Line.Text, "conntrack v") || !joined.Assured {
		t.Errorf("the entry the count line cut: %+v", joined)
	}
	// The count line moved every later entry one line down.
	if last := plain.Entries[277]; last.Line.Line != 279 {
		t.Errorf("last entry at line %d, want 279", last.Line.Line)
	}
	byClass := map[string]int{}
	keys := map[flowKey]bool{}
	for _, f := range plain.Entries {
		byClass[f.Proto+" "+f.State]++
		keys[keyOf(f)] = true
		if f.Family != "ipv4" || f.Timeout < 0 {
			t.Errorf("line %d: family %q timeout %d", f.Line.Line, f.Family, f.Timeout)
		}
	}
	want := map[string]int{"tcp ESTABLISHED": 204, "tcp TIME_WAIT": 30, "udp ": 43, "icmp ": 1}
	if diff := cmp.Diff(want, byClass); diff != "" {
		t.Errorf("entries by protocol and state (-want +got):\n%s", diff)
	}
	for _, f := range ext.Entries {
		if !keys[keyOf(f)] {
			t.Errorf("extended line %d is not in the plain listing: %s", f.Line.Line, f.Line.Text)
		}
		if f.Family != "ipv4" {
			t.Errorf("extended line %d: family %q", f.Line.Line, f.Family)
		}
	}
	var unreplied int
	for _, f := range plain.Entries {
		if f.Unreplied {
			unreplied++
			if f.Proto != "udp" || f.Orig.Dst != netip.MustParseAddr("10.180.0.99") || f.Reply.Src != f.Orig.Dst {
				t.Errorf("unexpected [UNREPLIED] entry: %s", f.Line.Text)
			}
		}
		if f.Proto == "icmp" && (f.Orig.Dst != netip.MustParseAddr("10.180.0.1") || f.Orig.DPort != 0 || f.Reply.Src != f.Orig.Dst) {
			t.Errorf("icmp entry: %+v", f)
		}
	}
	if unreplied != 2 {
		t.Errorf("%d [UNREPLIED] entries, want the 2 flows nobody answered", unreplied)
	}
}

// The output forms: -o extended,id,ktimestamp with accounting and
// timestamps (count line first), and /proc/net/nf_conntrack (IPv6 written
// out in full).
func TestReadConntrackForms(t *testing.T) {
	type row struct {
		Family, Proto, State string
		Timeout              int
		Orig, Reply          string
		Unreplied, Assured   bool
		Mark                 uint32
		Zone                 uint16
	}
	rows := func(ct *Conntrack) []row {
		var out []row
		for _, f := range ct.Entries {
			t := func(tu Tuple) string {
				return tu.Src.String() + ">" + tu.Dst.String() + " " + netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(tu.SPort)).String() + ">" + netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(tu.DPort)).String()
			}
			out = append(out, row{f.Family, f.Proto, f.State, -1, t(f.Orig), t(f.Reply), f.Unreplied, f.Assured, f.Mark, f.Zone})
		}
		return out
	}
	want := []row{
		{"ipv4", "icmp", "", -1, "10.0.5.2>10.180.0.1 0.0.0.0:0>0.0.0.0:0", "10.180.0.1>10.0.5.2 0.0.0.0:0>0.0.0.0:0", true, false, 0, 0},
		{"ipv4", "udp", "", -1, "10.0.5.2>172.30.0.48 0.0.0.0:5353>0.0.0.0:53", "10.180.0.13>10.0.5.2 0.0.0.0:53>0.0.0.0:5353", true, false, 0, 0},
		{"ipv4", "sctp", "ESTABLISHED", -1, "10.0.5.2>172.30.0.60 0.0.0.0:3000>0.0.0.0:3868", "10.180.0.30>10.0.5.2 0.0.0.0:3868>0.0.0.0:3000", true, false, 0, 0},
		{"ipv4", "tcp", "ESTABLISHED", -1, "10.0.5.2>172.30.0.42 0.0.0.0:40000>0.0.0.0:80", "10.180.0.4>10.0.5.2 0.0.0.0:80>0.0.0.0:40000", true, true, 16384, 7},
		{"ipv6", "tcp", "TIME_WAIT", -1, "fd00::2>fd00:96::10 0.0.0.0:40001>0.0.0.0:80", "fd00:180::4>fd00::2 0.0.0.0:80>0.0.0.0:40001", true, false, 0, 0},
	}
	for _, name := range []string{"forms.conntrack", "forms.proc"} {
		ct := readConntrackFixture(t, name)
		if diff := cmp.Diff(want, rows(ct)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
		wantShown := map[string]int{"forms.conntrack": 5, "forms.proc": -1}[name]
		if ct.Shown != wantShown {
			t.Errorf("%s: shown %d, want %d", name, ct.Shown, wantShown)
		}
		if f := ct.Entries[3]; f.Timeout < 431000 || f.Line.Line == 0 {
			t.Errorf("%s: tcp entry timeout %d line %d", name, f.Timeout, f.Line.Line)
		}
	}
}

// Lines that are no entry are bad input naming file:line:col, as the
// other readers' are; so is a capture conntrack itself refused.
func TestReadConntrackMalformed(t *testing.T) {
	good := "tcp      6 431999 ESTABLISHED src=10.0.0.1 dst=10.96.0.10 sport=40000 dport=80 src=10.244.1.5 dst=10.0.0.1 sport=8080 dport=40000 [ASSURED] mark=0 use=1"
	cut := "udp      17 29 src=10.0.0.1 dst=10.96.0.10 sport=5353 dport=53"
	noPorts := "tcp      6 10 SYN_SENT src=10.0.0.1 dst=10.96.0.10 src=10.244.1.5 dst=10.0.0.1"
	cases := []struct {
		name, text string
		line, col  int
		msg        string
	}{
		{"not an entry", "Chain KUBE-SERVICES (2 references)", 1, 1, "expected an entry"},
		{"bad address", strings.Replace(good, "dst=10.96.0.10", "dst=10.96.0.300", 1), 1, strings.Index(good, "dst=10.96.0.10") + 1, "not an address"},
		{"bad port", strings.Replace(good, "sport=8080", "sport=80800", 1), 1, strings.Index(good, "sport=8080") + 1, "want a port"},
		{"no reply tuple", cut + " mark=0 use=1", 1, len(cut) + 2, "inside the original tuple"},
		{"cut short", cut, 1, len(cut) + 1, "the reply tuple is missing"},
		{"no ports", noPorts, 1, len(noPorts) + 1, "no sport= and dport="},
		{"ASSURED first", "tcp      6 10 [ASSURED] src=10.0.0.1 dst=10.96.0.10 sport=1 dport=2 src=10.244.1.5 dst=10.0.0.1 sport=2 dport=1", 1, 15, "out of place"},
		{"open bracket", good + " [start=Sun Dec  6", 1, len(good) + 2, "a [ without ]"},
		{"event", "    [NEW] " + good, 1, 5, "conntrack -E"},
		{"bad mark", strings.Replace(good, "mark=0", "mark=x", 1), 1, strings.Index(good, "mark=0") + 1, "mark=x"},
		{"bad layer 3", "ipv4 tcp 6 10 " + good[9:], 1, 1, "layer-3"},
		{"second line", good + "\n\nfoo bar", 3, 1, "expected an entry"},
		{"tool error", "conntrack v1.4.7 (conntrack-tools): Operation failed: Operation not permitted", 1, 1, "the capture failed"},
		{"two counts", good + "\nconntrack v1.4.7 (conntrack-tools): 1 flow entries have been shown.\nconntrack v1.4.7 (conntrack-tools): 1 flow entries have been shown.", 3, 1, "a second count line"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadConntrack("ct.txt", []byte(c.text))
			var el scenario.ErrorList
			if !errors.As(err, &el) || len(el) == 0 {
				t.Fatalf("want a scenario.ErrorList, got %v", err)
			}
			fe := el[0]
			if fe.File != "ct.txt" || fe.Pos.Line != c.line || fe.Pos.Column != c.col || !strings.Contains(fe.Message, c.msg) {
				t.Errorf("got %v (%+v), want ct.txt:%d:%d %q", fe, *fe, c.line, c.col, c.msg)
			}
		})
	}
	if _, err := ReadConntrackFile(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "no such conntrack table file") {
		t.Errorf("missing file: %v", err)
	}
}

// What the reader takes without complaint: an empty table, blank lines,
// the count line on its own at either end, fields it does not know.
func TestReadConntrackLenient(t *testing.T) {
	good := "udp      17 29 src=10.0.0.1 dst=10.96.0.10 sport=5353 dport=53 [UNREPLIED] src=10.244.1.5 dst=10.0.0.1 sport=53 dport=5353 mark=0 secctx=system_u:object_r:unlabeled_t:s0 helper=tftp future-field=1 use=1"
	for _, text := range []string{
		"",
		"conntrack v1.4.8 (conntrack-tools): 0 flow entries have been shown.\n",
		good + "\n\n" + "conntrack v1.4.6 (conntrack-tools): 1 flow entries have been shown.\n",
		"conntrack v1.4.6 (conntrack-tools): 1 flow entries have been shown.\r\n" + good + "\r\n",
	} {
		ct, err := ReadConntrack("ct.txt", []byte(text))
		if err != nil {
			t.Errorf("%q: %v", text, err)
			continue
		}
		for _, f := range ct.Entries {
			if !f.Unreplied || f.Assured || f.Reply.Src != netip.MustParseAddr("10.244.1.5") || f.Timeout != 29 {
				t.Errorf("%q: %+v", text, f)
			}
		}
	}
}
