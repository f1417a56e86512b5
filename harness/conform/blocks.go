package conform

import "math/rand/v2"

// The probe plan. A probe is a new connection only if no conntrack entry of
// its 5-tuple is alive; the node namespaces' tables are emptied before every
// block (Prober.Send), and inside a block source ports never repeat: a walk
// through the port range with a random start and a stride coprime to it.
// So no probe of a check can meet a live entry of an earlier probe, however
// many the check sends (statistics audit, D1: one walk of 49,152 ports over
// 400,000 probes reused tuples and broke the draws' independence).
const (
	portLow   = 16384
	portSpan  = 49152
	blockSize = 32768 // probes per block, at most portSpan
)

// probeBlock is one block of the walk: n probes from start by step.
type probeBlock struct {
	n, start, step int
}

// port is the source port of the block's i-th probe.
func (b probeBlock) port(i int) uint16 { return uint16(portLow + (b.start+i*b.step)%portSpan) }

// planBlocks splits n probes into blocks of at most blockSize, each with a
// walk of its own drawn from r.
func planBlocks(n int, r *rand.Rand) []probeBlock {
	var out []probeBlock
	for n > 0 {
		k := min(n, blockSize)
		start, step := r.IntN(portSpan), 1+2*r.IntN(portSpan/2)
		for gcd(step, portSpan) != 1 {
			step += 2
		}
		out = append(out, probeBlock{n: k, start: start, step: step})
		n -= k
	}
	return out
}
