package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func newNode(t *testing.T, mode Mode, ct ConntrackConfig) *Node {
	t.Helper()
	n, err := NewNode("node-1", NodeConfig{Mode: mode, Conntrack: ct}, NewRandSeed(21, 22))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConntrackKeepsEstablishedFlow(t *testing.T) {
	for _, mode := range []Mode{IPTables, NFTables, IPVS} {
		n := newNode(t, mode, ConntrackConfig{})
		r := acceptRules(4, 0)
		n.Program(0, r, 0)
		c := &Conn{SrcIP: 0x0A000002, SrcPort: 40000, Proto: TCP, End: 100 * sec}
		first := n.Connect(0, c, 0)
		if first.Verdict != Accept || first.Established {
			t.Fatalf("%v: first packet %+v", mode, first)
		}
		// The endpoint leaves the rules; TCP entries are not flushed.
		r.Backends = slices.DeleteFunc(r.Backends, func(b Backend) bool { return b.ID == first.Endpoint })
		n.Program(0, r, sec)
		for _, at := range []int64{2, 50, 99} {
			got := n.Connect(0, c, at*sec)
			if !got.Established || got.Endpoint != first.Endpoint {
				t.Fatalf("%v: at %d s the established flow went to %+v, want %d", mode, at, got, first.Endpoint)
			}
		}
		// A new flow never reaches the removed endpoint.
		for p := range 200 {
			got := n.Connect(0, &Conn{SrcIP: 0x0A000002, SrcPort: uint16(p), Proto: TCP, End: 200 * sec}, 60*sec)
			if got.Endpoint == first.Endpoint {
				t.Fatalf("%v: new flow to a removed endpoint", mode)
			}
		}
		// The flow ended at 100 s: the same tuple afterwards is a new flow
		// (a SYN on a TIME_WAIT entry replaces it).
		if got := n.Connect(0, &Conn{SrcIP: 0x0A000002, SrcPort: 40000, Proto: TCP, End: 300 * sec}, 150*sec); got.Established || got.Endpoint == first.Endpoint {
			t.Errorf("%v: reuse after close: %+v", mode, got)
		}
	}
}

func TestConntrackUDPFlushOnEndpointRemoval(t *testing.T) {
	for _, mode := range []Mode{IPTables, NFTables, IPVS} {
		n := newNode(t, mode, ConntrackConfig{})
		r := acceptRules(3, 0)
		r.Proto = UDP
		n.Program(0, r, 0)
		// A DNS-like client with a fixed source port: its entry lives 30 s
		// after each datagram, so later "connections" reuse it.
		c := &Conn{SrcIP: 0x0A000009, SrcPort: 5353, Proto: UDP}
		first := n.Connect(0, c, 0)
		for _, at := range []int64{10, 35, 60} {
			if got := n.Connect(0, c, at*sec); !got.Established || got.Endpoint != first.Endpoint {
				t.Fatalf("%v: at %d s: %+v", mode, at, got)
			}
		}
		keep := n.Connect(0, &Conn{SrcIP: 0x0A00000A, SrcPort: 5353, Proto: UDP}, 61*sec)
		// Removing the endpoint flushes its UDP entries only.
		r.Backends = slices.DeleteFunc(r.Backends, func(b Backend) bool { return b.ID == first.Endpoint })
		n.Program(0, r, 62*sec)
		if got := n.Connect(0, c, 63*sec); got.Established || got.Endpoint == first.Endpoint {
			t.Errorf("%v: flow to the removed endpoint survived: %+v", mode, got)
		}
		if keep.Endpoint != first.Endpoint {
			if got := n.Connect(0, &Conn{SrcIP: 0x0A00000A, SrcPort: 5353, Proto: UDP}, 64*sec); !got.Established || got.Endpoint != keep.Endpoint {
				t.Errorf("%v: an unrelated UDP flow was flushed: %+v", mode, got)
			}
		}
		// Idle past the timeout: a fresh decision.
		if got := n.Connect(0, c, 200*sec); got.Established {
			t.Errorf("%v: entry outlived its timeout", mode)
		}
	}
}

func TestNodeVerdicts(t *testing.T) {
	n := newNode(t, IPTables, ConntrackConfig{})
	if got := n.Connect(3, &Conn{}, 0); got.Verdict != Reject {
		t.Errorf("unknown service: %+v", got)
	}
	n.Program(0, Rules{Verdict: Drop, Proto: TCP}, 0)
	if got := n.Connect(0, &Conn{SrcIP: 1}, 0); got.Verdict != Drop || got.Endpoint != -1 {
		t.Errorf("drop: %+v", got)
	}
	if n.CT.Len(0) != 0 {
		t.Error("a dropped connection left a conntrack entry")
	}
	if n.Stats.Dropped != 1 || n.Stats.Rejected != 1 || n.Stats.Connections != 2 {
		t.Errorf("stats %+v", n.Stats)
	}
}

func TestConntrackMax(t *testing.T) {
	n := newNode(t, NFTables, ConntrackConfig{Max: 10})
	n.Program(0, acceptRules(2, 0), 0)
	for p := range 10 {
		if got := n.Connect(0, &Conn{SrcPort: uint16(p), Proto: TCP, End: 5 * sec}, 0); got.Verdict != Accept {
			t.Fatalf("connection %d: %+v", p, got)
		}
	}
	if got := n.Connect(0, &Conn{SrcPort: 99, Proto: TCP, End: 5 * sec}, sec); got.Verdict != Drop {
		t.Errorf("full table: %+v", got)
	}
	// Entries die 120 s after their flows end (125 s).
	if got := n.Connect(0, &Conn{SrcPort: 99, Proto: TCP, End: 130 * sec}, 125*sec); got.Verdict != Accept {
		t.Errorf("after expiry: %+v", got)
	}
	if n.CT.Stats.DroppedFull != 1 {
		t.Errorf("dropped %d", n.CT.Stats.DroppedFull)
	}
}

// TestConntrackAgainstMap drives the table with random flows and checks
// every answer against a plain map.
func TestConntrackAgainstMap(t *testing.T) {
	type ref struct {
		ep       int32
		end, exp uint32
	}
	ct := NewConntrack(ConntrackConfig{TCPTimeWait: 2 * time.Second, UDPTimeout: time.Second})
	model := map[[2]uint64]ref{}
	rng := rand.New(rand.NewPCG(3, 4))
	now := int64(0)
	for step := range 300_000 {
		now += int64(rng.IntN(200)) * 1000 // up to 0.2 ms per step
		c := &Conn{SrcIP: uint32(rng.IntN(50)), SrcPort: uint16(rng.IntN(400)), Proto: []Proto{TCP, UDP}[rng.IntN(2)]}
		c.End = now + int64(rng.IntN(3000))*1e6
		svc := uint32(rng.IntN(3))
		k := [2]uint64{ctKey(c), uint64(svc)}
		nowMs := msFloor(now)
		i, found := ct.lookup(ctKey(c), svc, nowMs)
		m, ok := model[k]
		live := ok && nowMs < m.exp
		if found != live {
			t.Fatalf("step %d: found %v, model %v", step, found, live)
		}
		if found {
			if ct.slots[i].ep != m.ep {
				t.Fatalf("step %d: ep %d, model %d", step, ct.slots[i].ep, m.ep)
			}
			continue
		}
		if rng.IntN(1000) == 0 {
			ep := int32(rng.IntN(4))
			ct.FlushUDP(int(svc), ep, now)
			for key, v := range model {
				if key[1] == uint64(svc) && v.ep == ep && Proto(key[0]>>8) == UDP {
					delete(model, key)
				}
			}
			continue
		}
		ep := int32(rng.IntN(4))
		ct.put(i, ctKey(c), svc, ep, c, nowMs)
		end := msCeil(c.End)
		model[k] = ref{ep: ep, end: end, exp: end + ct.wait(c.Proto)}
	}
	live := 0
	for _, v := range model {
		if msFloor(now) < v.exp {
			live++
		}
	}
	if got := ct.Len(now); got != live {
		t.Errorf("live %d, model %d", got, live)
	}
	t.Logf("sweeps %d, grows %d, slots %d, live %d", ct.Stats.Sweeps, ct.Stats.Grows, len(ct.slots), live)
}

func TestNodeAffinityWithConntrack(t *testing.T) {
	// Affinity holds across new flows (new source ports) and the recent
	// list is refreshed only by new flows, not by packets of an
	// established one.
	n := newNode(t, IPTables, ConntrackConfig{})
	n.Program(0, acceptRules(5, 10*time.Second), 0)
	first := n.Connect(0, &Conn{SrcIP: 7, SrcPort: 1, Proto: TCP, End: 60 * sec}, 0)
	for p := 2; p < 20; p++ {
		if got := n.Connect(0, &Conn{SrcIP: 7, SrcPort: uint16(p), Proto: TCP, End: sec * int64(p)}, sec*int64(p)/2); got.Endpoint != first.Endpoint || got.Established {
			t.Fatalf("flow %d: %+v", p, got)
		}
	}
	// Last new flow at 9.5 s: affinity gone after 19.5 s.
	counts := map[int32]int{}
	for k := range 2000 {
		got := n.Connect(0, &Conn{SrcIP: 1000 + uint32(k), SrcPort: 1, Proto: TCP, End: 100 * sec}, 30*sec)
		counts[got.Endpoint]++
	}
	if len(counts) != 5 {
		t.Errorf("fresh clients reached %v", counts)
	}
}
