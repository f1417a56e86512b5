package traffic

import (
	"math/rand/v2"
	"testing"
)

// TestBlockPortIsConformsFormula: BlockPort is the formula harness/conform's
// block.port used before it moved here, written out again, over walks with
// random starts and strides up to and past the period.
func TestBlockPortIsConformsFormula(t *testing.T) {
	old := func(start, step, j int) uint16 { return uint16(16384 + (start+j*step)%49152) }
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		start, step := r.IntN(49152), 1+2*r.IntN(49152/2)
		for _, j := range []int{0, 1, 2, 4095, 32767, 49151, 49152, 100_000} {
			if got, want := BlockPort(start, step, j), old(start, step, j); got != want {
				t.Fatalf("BlockPort(%d, %d, %d) = %d, want %d", start, step, j, got, want)
			}
		}
	}
	if got := BlockPort(PortSpan-1, 1, 1); got != PortLo {
		t.Errorf("the walk wraps to %d, want %d", got, PortLo)
	}
	if got := BlockPort(PortSpan-1, 0, 0); got != 65535 {
		t.Errorf("the last port is %d, want 65535", got)
	}
}
