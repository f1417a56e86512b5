package engine

import (
	"testing"
	"time"
)

// TestConntrackReserve: entries survive a Reserve, and n reserved entries
// go in without a sweep or a rehash.
func TestConntrackReserve(t *testing.T) {
	ct := NewConntrack(ConntrackConfig{})
	conn := func(i int) *Conn {
		return &Conn{SrcIP: 0x0A000000 + uint32(i>>16), SrcPort: uint16(i), Proto: TCP, End: int64(time.Second)}
	}
	for i := range 100 {
		c := conn(i)
		i2, _ := ct.lookup(ctKey(c), 1, 0)
		ct.put(i2, ctKey(c), 1, int32(i%7), c, 0)
	}
	ct.Reserve(100_000, 0)
	if len(ct.slots) < 200_002 || ct.Stats.Grows != 0 {
		t.Fatalf("reserve: %d slots, %d grows", len(ct.slots), ct.Stats.Grows)
	}
	for i := range 100 {
		if ep, ok := ct.Lookup(1, conn(i), 0); !ok || ep != int32(i%7) {
			t.Fatalf("entry %d lost by Reserve: %d %v", i, ep, ok)
		}
	}
	sweeps := ct.Stats.Sweeps
	for i := 100; i < 100_000; i++ {
		c := conn(i)
		i2, _ := ct.lookup(ctKey(c), 1, 0)
		ct.put(i2, ctKey(c), 1, 0, c, 0)
	}
	if ct.Stats.Grows != 0 || ct.Stats.Sweeps != sweeps {
		t.Errorf("%d grows and %d sweeps after reserving room", ct.Stats.Grows, ct.Stats.Sweeps-sweeps)
	}
	if n := ct.Len(0); n != 100_000 {
		t.Errorf("%d live entries, want 100000", n)
	}
	size := len(ct.slots)
	ct.Reserve(10, 0)
	if len(ct.slots) != size {
		t.Error("Reserve shrank the table")
	}
}

func TestConntrackReset(t *testing.T) {
	ct := NewConntrack(ConntrackConfig{})
	ct.Reserve(5000, 0)
	c := &Conn{SrcIP: 1, SrcPort: 2, Proto: TCP, End: int64(time.Second)}
	i, _ := ct.lookup(ctKey(c), 3, 0)
	ct.put(i, ctKey(c), 3, 7, c, 0)
	size := ct.Bytes()
	ct.Reset()
	if _, ok := ct.Lookup(3, c, 0); ok || ct.Len(0) != 0 || ct.Stats.Inserted != 0 || ct.Bytes() != size {
		t.Errorf("after Reset: %d live, %+v, %d bytes (was %d)", ct.Len(0), ct.Stats, ct.Bytes(), size)
	}
}
