package traffic

// Source ports of probes: a block's walk covers 16384-65535 (the ephemeral
// range of Linux' ip_local_port_range default and IANA's, 49,152 ports).
// The namespace prober (harness/conform) and the in-cluster agent
// (harness/agent) walk it with the same formula, BlockPort.
const (
	PortLo   = 16384
	PortSpan = 49152
)

// BlockPort is the source port of the j-th probe of a block that starts its
// walk at start with stride step: PortLo + (start + j*step) mod PortSpan.
// With 0 <= start < PortSpan and a stride coprime with PortSpan (2^14 * 3)
// the walk visits every port once per PortSpan probes.
func BlockPort(start, step, j int) uint16 { return uint16(PortLo + (start+j*step)%PortSpan) }
