package engine

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Mode is a kube-proxy mode.
type Mode uint8

// The modes.
const (
	IPTables Mode = iota + 1
	NFTables
	IPVS
)

// ErrUnknownMode is wrapped by ModeOf's error (it is cluster.ErrUnknownMode).
var ErrUnknownMode = cluster.ErrUnknownMode

// modeNames is each Mode's cluster.Mode, indexed by Mode.
var modeNames = [...]cluster.Mode{IPTables: cluster.ModeIPTables, NFTables: cluster.ModeNFTables, IPVS: cluster.ModeIPVS}

// ModeOf is the engine's index of a kube-proxy mode: the one conversion
// from cluster.Mode. Its error wraps ErrUnknownMode.
func ModeOf(m cluster.Mode) (Mode, error) {
	for i, n := range modeNames {
		if i > 0 && n == m {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w %q (valid: %s)", ErrUnknownMode, m, cluster.ModeList())
}

// Cluster is the mode as cluster.Mode ("" for the zero Mode).
func (m Mode) Cluster() cluster.Mode {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return ""
}

// String is the mode's kube-proxy name.
func (m Mode) String() string {
	if m > 0 && int(m) < len(modeNames) {
		return string(modeNames[m])
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Verdict is what a node does with a new connection.
type Verdict uint8

// The verdicts.
const (
	// Accept: the connection is DNATed to an endpoint.
	Accept Verdict = iota
	// Drop: the packet is dropped silently (internalTrafficPolicy Local
	// without a local endpoint in iptables and nftables modes; a full
	// conntrack table).
	Drop
	// Reject: the client gets an ICMP error (no endpoints; IPVS with no
	// available real server).
	Reject
)

// String is the verdict in capitals, as kube-proxy's tracers print it.
func (v Verdict) String() string {
	switch v {
	case Accept:
		return "ACCEPT"
	case Drop:
		return "DROP"
	case Reject:
		return "REJECT"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Proto is an IP protocol number.
type Proto uint8

// The protocols of Service ports.
const (
	TCP  Proto = 6
	UDP  Proto = 17
	SCTP Proto = 132
)

// String is the protocol's lower-case name.
func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// Conn is a new connection from a client pod to a Service port, as the
// engines see its first packet. Times are virtual nanoseconds.
type Conn struct {
	// SrcIP is the client's IPv4 address as a number (IPv4 below).
	SrcIP   uint32
	SrcPort uint16
	Proto   Proto
	// End is when the client closes the connection (TCP) or sends its last
	// datagram (UDP). Conntrack and IPVS keep their entries a protocol
	// timeout longer.
	End int64
}

// IPv4 converts an address to the number the engines use; it returns 0 for
// anything but IPv4.
func IPv4(a netip.Addr) uint32 {
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// AddrFromIPv4 is the inverse of IPv4.
func AddrFromIPv4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Backend is one endpoint as a node's rules know it.
type Backend struct {
	// ID is stable across syncs for the same ip:port (see Interner); the
	// conntrack table and the per-endpoint affinity state refer to it.
	ID   int32
	IP   uint32
	Port uint16
}

// Rules is what a node has programmed for one service port: the verdict for
// new connections and, when it is Accept, the endpoints in rule order.
type Rules struct {
	Verdict  Verdict
	Backends []Backend
	// Reason says why the verdict is DROP or REJECT, as kube-proxy's rule
	// comment does ("has no endpoints", "has no local endpoints").
	Reason string
	// AffinityTimeout is the ClientIP affinity timeout; 0 means no affinity.
	AffinityTimeout time.Duration
	Proto           Proto
	// VIP and VPort are the ClusterIP and port (IPVS dh hashes the VIP).
	VIP   uint32
	VPort uint16
}

// Engine decides new connections for one service port on one node.
// Implementations are not safe for concurrent use: a node's engines share
// its random source, so run one node per goroutine.
type Engine interface {
	// Choose decides a new connection (one without a live conntrack entry)
	// arriving at virtual time now: the backend ID and Accept, or -1 and
	// Drop or Reject. now must not decrease between calls.
	Choose(c *Conn, now int64) (endpoint int32, v Verdict)
	// Program replaces the rules, as a completed sync does.
	Program(r Rules, now int64)
}

var (
	_ Engine = (*IPTablesEngine)(nil)
	_ Engine = (*NFTablesEngine)(nil)
	_ Engine = (*IPVSEngine)(nil)
)

// Interner gives each endpoint (ip:port) a small stable ID. It is safe for
// concurrent use; Render calls it, the hot path does not.
type Interner struct {
	mu   sync.Mutex
	ids  map[netip.AddrPort]int32
	keys []netip.AddrPort
}

// NewInterner returns an empty interner.
func NewInterner() *Interner { return &Interner{ids: map[netip.AddrPort]int32{}} }

// ID returns the endpoint's ID, assigning the next one on first sight.
func (in *Interner) ID(ap netip.AddrPort) int32 {
	in.mu.Lock()
	defer in.mu.Unlock()
	if id, ok := in.ids[ap]; ok {
		return id
	}
	id := int32(len(in.keys))
	in.ids[ap] = id
	in.keys = append(in.keys, ap)
	return id
}

// Key returns the endpoint of an ID; the zero AddrPort if it was never given.
func (in *Interner) Key(id int32) netip.AddrPort {
	in.mu.Lock()
	defer in.mu.Unlock()
	if id < 0 || int(id) >= len(in.keys) {
		return netip.AddrPort{}
	}
	return in.keys[id]
}

// Len is the number of IDs given.
func (in *Interner) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.keys)
}

// backendList is an engine's endpoints in rule order: its own copy, or the
// caller's slice when the caller promised never to modify it (Node's
// ProgramShared), which a node's thousands of engines then share with the
// rendered version instead of holding one copy each.
type backendList struct {
	s     []Backend
	owned bool // s is the engine's own copy, reusable by the next set
}

func (b *backendList) set(bs []Backend, copyThem bool) {
	if !copyThem {
		b.s, b.owned = bs, false
		return
	}
	if !b.owned {
		b.s, b.owned = nil, true
	}
	b.s = append(b.s[:0], bs...)
}

// sharedProgrammer is an engine that can keep the caller's backends.
type sharedProgrammer interface {
	programShared(r Rules, now int64)
}
