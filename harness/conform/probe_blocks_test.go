package conform

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/sim/cluster"
)

var spnWeb20 = cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "web20"}, Port: "http", Protocol: "TCP"}

// TestPlanBlocksNeverRepeatsATuple: for batch sizes around and far past the
// walk's period, every block has at most MaxBlockProbes probes, the blocks
// cover the batch exactly once, and no (source address, port) repeats inside
// a block. A batch of 100,000 probes makes at least 4 blocks.
func TestPlanBlocksNeverRepeatsATuple(t *testing.T) {
	src := netip.MustParseAddr("10.244.0.200")
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{1, 2, 1999, 32_768, 32_769, 49_152, 49_153, 100_000, 400_000, 1_000_000} {
		blocks := planBlocks(n, r)
		next := 0
		for i, b := range blocks {
			if b.N <= 0 || b.N > MaxBlockProbes {
				t.Fatalf("n %d: block %d has %d probes (max %d)", n, i, b.N, MaxBlockProbes)
			}
			if b.First != next {
				t.Fatalf("n %d: block %d starts at %d, want %d", n, i, b.First, next)
			}
			next += b.N
			seen := make(map[netip.AddrPort]int, b.N)
			for j := range b.N {
				p := b.port(j)
				if p < portLo {
					t.Fatalf("n %d: port %d below the range", n, p)
				}
				ap := netip.AddrPortFrom(src, p)
				if k, dup := seen[ap]; dup {
					t.Fatalf("n %d: block %d repeats %s at probes %d and %d", n, i, ap, k, j)
				}
				seen[ap] = j
			}
		}
		if next != n {
			t.Fatalf("n %d: blocks cover %d probes", n, next)
		}
		if want := (n + MaxBlockProbes - 1) / MaxBlockProbes; len(blocks) != want {
			t.Errorf("n %d: %d blocks, want %d", n, len(blocks), want)
		}
	}
	if b := planBlocks(100_000, r); len(b) < 4 {
		t.Errorf("100,000 probes make %d blocks, want >= 4", len(b))
	}
}

// TestWalkRepeatsPastItsPeriod shows why blocks are needed: one walk of
// more than 49,152 probes repeats its first port.
func TestWalkRepeatsPastItsPeriod(t *testing.T) {
	b := block{N: portSpan + 1, Start: 5, Step: 7}
	if b.port(0) != b.port(portSpan) {
		t.Errorf("port 0 %d, port %d %d: the walk's period is not %d", b.port(0), portSpan, b.port(portSpan), portSpan)
	}
}

func TestBlockProof(t *testing.T) {
	for _, c := range []struct {
		probes, arrived int
		entries         int64
		want            string
	}{
		{32768, 32768, 32768, ""},
		{100, 0, 0, ""},           // all rejected: no entry, no arrival, no reuse shown
		{32768, 32760, 32760, ""}, // 8 lost without a decision
		{32768, 32768, 20000, "12,768 probes followed a live entry"},
		{32768, 32768, 40000, "the table held other connections"},
	} {
		got := blockProof(0, c.probes, c.arrived, c.entries, counterConntrack)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("blockProof(%d, %d, %d) = %q, want %q", c.probes, c.arrived, c.entries, got, c.want)
		}
	}
}

func TestIndependenceString(t *testing.T) {
	var i Independence
	i.add(Independence{Counter: counterConntrack, Blocks: 3, Probes: 98304, Entries: 98304, Arrived: 98304})
	if got, want := i.String(), "independent: 3 blocks, 98,304 probes, 98,304 new conntrack entries"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	i.add(Independence{Blocks: 1, Probes: 10, Entries: 5, Arrived: 10, Problems: []string{blockProof(3, 10, 10, 5, counterConntrack)}})
	if i.Holds() || !strings.HasPrefix(i.String(), "NOT shown independent: 4 blocks, 98,314 probes") {
		t.Errorf("a reuse block must disprove the phase: %q", i.String())
	}
}

func TestClassifyLoss(t *testing.T) {
	for _, c := range []struct {
		name                               string
		sent, arrived, rejected, otherICMP int
		decided                            int64
		drops                              uint64
		lost, missed, dropped              int
		env                                bool
		text                               string
	}{
		{"clean", 9244, 9244, 0, 0, 9244, 0, 0, 0, 0, false, "no loss"},
		{"observer missed what the kernel decided", 9244, 9232, 0, 0, 9244, 0, 12, 12, 0, true, "the observer missed 12 probes"},
		{"socket drops without counters", 9244, 9232, 0, 0, -1, 12, 12, 12, 0, true, "12 socket drops"},
		{"dataplane drop: no decision", 9244, 9200, 0, 0, 9200, 0, 44, 0, 44, false, "the dataplane dropped them"},
		{"both", 1000, 900, 50, 10, 950, 0, 40, 50, 0, true, "missed 50"},
		{"mixed", 1000, 900, 0, 0, 910, 0, 100, 10, 90, true, "90 more lost without a decision"},
		{"expected drop", 100, 0, 0, 0, 0, 0, 100, 0, 100, false, "dropped"},
	} {
		l := ClassifyLoss(c.sent, c.arrived, c.rejected, c.otherICMP, c.decided, c.drops)
		if l.Lost != c.lost || l.Missed != c.missed || l.Dropped != c.dropped || l.Environment() != c.env || !strings.Contains(l.Text, c.text) {
			t.Errorf("%s: got lost %d missed %d dropped %d env %v %q; want %d %d %d %v %q", c.name, l.Lost, l.Missed, l.Dropped, l.Environment(), l.Text,
				c.lost, c.missed, c.dropped, c.env, c.text)
		}
		if r := l.Report(3); r.Sent != c.sent || r.Missed != c.missed || r.SendErrors != 3 || r.Decided != c.decided {
			t.Errorf("%s: report %+v", c.name, r)
		}
	}
}

func TestDecided(t *testing.T) {
	web := spnWeb20
	other := web
	other.Name = "web50"
	before := []dataplane.Counter{{ServicePort: web, Endpoint: "10.244.0.10:8080", Packets: 5}, {ServicePort: web, Endpoint: "REJECT", Packets: 1}}
	after := []dataplane.Counter{{ServicePort: web, Endpoint: "10.244.0.10:8080", Packets: 105}, {ServicePort: web, Endpoint: "10.244.1.10:8080", Packets: 50},
		{ServicePort: web, Endpoint: "REJECT", Packets: 9}, {ServicePort: other, Endpoint: "10.244.0.100:8080", Packets: 1000}}
	if got := Decided(web, before, after); got != 150 {
		t.Errorf("Decided = %d, want 150 (endpoint rules of the port only)", got)
	}
	if got := Decided(web, before, nil); got != -1 {
		t.Errorf("Decided without counters = %d, want -1", got)
	}
}

func TestParseIPVSStats(t *testing.T) {
	const stats = "   Total Incoming Outgoing         Incoming         Outgoing\n   Conns  Packets  Packets            Bytes            Bytes\n     4A      1F4        0             1E78                0\n\n Conns/s   Pkts/s   Pkts/s          Bytes/s          Bytes/s\n       0        0        0                0                0\n"
	if n, err := parseIPVSStats(stats); err != nil || n != 0x4a {
		t.Errorf("parseIPVSStats = %d, %v; want 74", n, err)
	}
	if _, err := parseIPVSStats("garbage"); err == nil {
		t.Error("garbage parsed")
	}
}

// TestSourcesNeverRepeatATuple: with as many source addresses as blocks, no
// (address, port) repeats anywhere in a batch of 400,000 probes.
func TestSourcesNeverRepeatATuple(t *testing.T) {
	const n = 400_000
	blocks := planBlocks(n, rand.New(rand.NewPCG(3, 4)))
	var srcs []netip.Addr
	a := netip.MustParseAddr("10.244.0.200")
	for range blocks {
		srcs = append(srcs, a)
		a = a.Next()
	}
	b := Probe{Src: netip.MustParseAddr("10.244.0.1"), Sources: srcs, N: n}
	seen := make(map[netip.AddrPort]bool, n)
	for i, bl := range blocks {
		for j := range bl.N {
			ap := netip.AddrPortFrom(b.source(i), bl.port(j))
			if seen[ap] {
				t.Fatalf("block %d repeats %s", i, ap)
			}
			seen[ap] = true
		}
	}
	if (Probe{Src: a}).source(5) != a {
		t.Error("without Sources every block is sent from Src")
	}
}
