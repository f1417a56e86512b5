package conform

import (
	"math/rand/v2"

	"github.com/kpsim/kpsim/harness/traffic"
)

// Source ports of probes: the walk covers 16384-65535 (traffic.PortLo and
// PortSpan, shared with the in-cluster agent).
const (
	portLo   = traffic.PortLo
	portSpan = traffic.PortSpan
)

// MaxBlockProbes is the most probes one block of a batch sends from one
// source address. Within a block every probe has a source port of its own (a
// walk through the 49,152 ports never repeats in fewer steps), and the
// prober empties the nodes' conntrack tables between blocks, so no probe
// meets a live conntrack entry of an earlier probe: each is a fresh NAT
// decision. A live entry lasts 120 s in SYN_SENT (the backends' resets are
// dropped) and would make a repeated 5-tuple follow the earlier choice. The
// bound is 2^15, well inside the period, so that a block never comes near
// the walk's end; it also bounds the conntrack entries a block needs.
const MaxBlockProbes = 32_768

// block is one part of a batch: probes First..First+N-1 of the batch, with
// source port portLo + (Start + j*Step) mod portSpan for its j-th probe.
type block struct {
	First, N    int
	Start, Step int
}

// planBlocks splits a batch of n probes into ceil(n/MaxBlockProbes) blocks
// of nearly equal size, each with its own random start and stride. The
// stride is odd and not a multiple of 3, so coprime with 49,152 = 2^14 * 3:
// the walk visits every port once per period.
func planBlocks(n int, r *rand.Rand) []block {
	if n <= 0 {
		return nil
	}
	k := (n + MaxBlockProbes - 1) / MaxBlockProbes
	out := make([]block, 0, k)
	first := 0
	for i := range k {
		size := n / k
		if i < n%k {
			size++
		}
		start, step := r.IntN(portSpan), 1+2*r.IntN(portSpan/2)
		for gcd(step, portSpan) != 1 {
			step = (step + 2) % portSpan
		}
		out = append(out, block{First: first, N: size, Start: start, Step: step})
		first += size
	}
	return out
}

// port is the source port of the block's j-th probe.
func (b block) port(j int) uint16 { return traffic.BlockPort(b.Start, b.Step, j) }

// probes splits the block into blocks of one probe each, probe j on the
// port the whole block gives it, so that paced probes keep the walk.
func (b block) probes() []block {
	out := make([]block, b.N)
	for j := range out {
		out[j] = block{First: b.First + j, N: 1, Start: (b.Start + j*b.Step) % traffic.PortSpan, Step: b.Step}
	}
	return out
}
