package engine

import (
	"slices"
	"testing"
	"time"
)

// arenaRun programs a node of 300 service ports (some with affinity, some
// re-programmed without an endpoint later) in an arena and returns the
// endpoints its connections reach.
func arenaRun(t *testing.T, a *Arena, mode Mode) []int32 {
	t.Helper()
	n, err := NewNodeIn(a, "node-1", NodeConfig{Mode: mode}, NewRandSeed(5, 6))
	if err != nil {
		t.Fatal(err)
	}
	const ports = 300
	n.ReserveServices(ports)
	for s := range ports {
		n.ProgramShared(s, acceptRules(2+s%9, time.Duration(sec*int64(s%2))), 0)
	}
	var out []int32
	for i := range 3000 {
		s := i % ports
		if i == 1500 {
			for k := 0; k < ports; k += 7 {
				r := acceptRules(2+k%9, 0)
				r.Backends = r.Backends[1:]
				n.Program(k, r, int64(i)*sec/1000)
			}
		}
		c := &Conn{SrcIP: 0x0A000000 + uint32(i%50), SrcPort: uint16(1000 + i), Proto: TCP, End: int64(i+10) * sec / 1000}
		out = append(out, n.Connect(s, c, int64(i)*sec/1000).Endpoint)
	}
	return out
}

// TestArenaReuse: a node built in an arena after Reset decides exactly as
// one built in a fresh arena, and takes its memory from the kept blocks.
func TestArenaReuse(t *testing.T) {
	for _, mode := range []Mode{IPTables, NFTables, IPVS} {
		want := arenaRun(t, NewArena(), mode)
		a := NewArena()
		// A different node first, so that the reused blocks hold its state.
		if _, err := NewNodeIn(a, "other", NodeConfig{Mode: mode}, NewRandSeed(7, 8)); err != nil {
			t.Fatal(err)
		}
		arenaRun(t, a, mode)
		blocks := len(a.ipvs.blocks) + len(a.ipt.blocks) + len(a.nft.blocks) + len(a.dests.blocks) + len(a.ptrs.blocks) + len(a.engines.blocks)
		a.Reset()
		if got := arenaRun(t, a, mode); !slices.Equal(got, want) {
			t.Errorf("%v: after Reset the node decided differently", mode)
		}
		if after := len(a.ipvs.blocks) + len(a.ipt.blocks) + len(a.nft.blocks) + len(a.dests.blocks) + len(a.ptrs.blocks) + len(a.engines.blocks); after != blocks {
			t.Errorf("%v: %d blocks after the reused run, %d before: the arena allocated again", mode, after, blocks)
		}
	}
}

func TestBlockListTake(t *testing.T) {
	var b blockList[int]
	x := b.take(3, 4)
	x[0], x[1], x[2] = 1, 2, 3
	y := b.take(2, 4) // does not fit the first block's last element
	if len(b.blocks) != 2 || cap(x) != 3 || len(y) != 2 {
		t.Fatalf("blocks %d, cap %d, len %d", len(b.blocks), cap(x), len(y))
	}
	x = append(x, 9) // capacity n: appending never writes into y
	if y[0] == 9 || x[3] != 9 {
		t.Error("an append to one run wrote into the next")
	}
	b.reset()
	if z := b.take(3, 4); &z[0] != &b.blocks[0][0] {
		t.Error("after reset the first block is not reused")
	}
}

// TestArenaConntrack: the nodes built in an arena between two Resets have
// their own tables; after Reset the next nodes get the same tables back,
// emptied, unless their configuration differs.
func TestArenaConntrack(t *testing.T) {
	a := NewArena()
	cfg := NodeConfig{Mode: IPTables}
	n1, _ := NewNodeIn(a, "n1", cfg, NewRandSeed(1, 2))
	n2, _ := NewNodeIn(a, "n2", cfg, NewRandSeed(1, 2))
	if n1.CT == n2.CT {
		t.Fatal("two nodes of one arena share a conntrack table")
	}
	n1.ProgramShared(0, acceptRules(3, 0), 0)
	n1.Connect(0, &Conn{SrcIP: 0x0A000001, SrcPort: 1000, Proto: TCP, End: sec}, 0)
	if n1.CT.Len(0) != 1 {
		t.Fatalf("%d live entries, want 1", n1.CT.Len(0))
	}
	old1, old2 := n1.CT, n2.CT
	a.Reset()
	m1, _ := NewNodeIn(a, "m1", cfg, NewRandSeed(1, 2))
	if m1.CT != old1 || m1.CT.Len(0) != 0 {
		t.Errorf("after Reset: same table %v, %d live entries; want the first node's table, emptied", m1.CT == old1, m1.CT.Len(0))
	}
	other := cfg
	other.Conntrack.TCPTimeWait = time.Second
	m2, _ := NewNodeIn(a, "m2", other, NewRandSeed(1, 2))
	if m2.CT == old2 || m2.CT.cfg.TCPTimeWait != time.Second {
		t.Error("a node of another conntrack configuration got a table of the old one")
	}
}
