package traffic

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sink records each packet's source port, and refuses every
// refuse-th write with ENOBUFS.
type sink struct {
	mu     sync.Mutex
	seen   map[uint16]bool
	n      int
	refuse int
}

func (s *sink) Send(pkt []byte, _ netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if s.refuse > 0 && s.n%s.refuse == 0 {
		return unix.ENOBUFS
	}
	ihl := int(pkt[0]&0x0f) * 4
	s.seen[uint16(binary.BigEndian.Uint16(pkt[ihl:]))] = true
	return nil
}

// TestSendWalk: every probe of the walk once, on its port, over
// one sink below 2,000 probes and interleaved over two above; a full queue
// skips the probe and is counted.
func TestSendWalk(t *testing.T) {
	for _, n := range []int{10, 5000} {
		a, b := &sink{seen: map[uint16]bool{}}, &sink{seen: map[uint16]bool{}}
		w := Walk{Proto: TCP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddrPort("10.96.0.1:80"), N: n, Start: 7, Step: 5,
			ID: func(j int) uint32 { return uint32(j) }, Deadline: time.Now().Add(time.Minute), MaxSendErrors: 10}
		sent, failed, err := SendWalk(context.Background(), w, []PacketSink{a, b})
		if err != nil || sent != n || failed != 0 {
			t.Fatalf("n %d: sent %d, failed %d, %v", n, sent, failed, err)
		}
		if n < 2000 && b.n != 0 || n >= 2000 && (a.n == 0 || b.n == 0) {
			t.Errorf("n %d: sinks got %d and %d", n, a.n, b.n)
		}
		for j := range n {
			if p := BlockPort(7, 5, j); !a.seen[p] && !b.seen[p] {
				t.Fatalf("n %d: probe %d (port %d) not sent", n, j, p)
			}
		}
	}
	full := &sink{seen: map[uint16]bool{}, refuse: 4}
	w := Walk{Proto: UDP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddrPort("10.96.0.1:53"), N: 100, Step: 1,
		ID: func(j int) uint32 { return uint32(j) }, Deadline: time.Now().Add(time.Minute), MaxSendErrors: 1000}
	if sent, failed, err := SendWalk(context.Background(), w, []PacketSink{full}); err != nil || sent != 75 || failed != 25 {
		t.Errorf("a full queue: sent %d, failed %d, %v", sent, failed, err)
	}
}
