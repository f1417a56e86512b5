package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"

	"github.com/kpsim/kpsim/harness/traffic"
)

// FakeNet is a network without a kernel, for tests of the code that drives
// agents: the probe agents it makes hand every probe to it, it applies the
// Services' DNAT and delivers the probe to the echo agent at its
// destination, or answers with the ICMP error a kernel would send back to
// the prober: port unreachable from a Service without endpoints (as
// kube-proxy's REJECT) or from a host that does not serve the port, host
// unreachable when no agent has the address. Delivery is synchronous: when
// a send returns, its probes are counted. The agents need no Run.
//
// It models no loss, no conntrack and no checksum: a DNATed probe keeps its
// original checksums (the agents do not check them).
type FakeNet struct {
	mu       sync.Mutex
	hosts    map[netip.Addr]*fakeSource
	served   map[netip.Addr]map[PortSpec]bool
	services map[fakeService][]netip.AddrPort
}

type fakeService struct {
	proto traffic.Proto
	vip   netip.AddrPort
}

// NewFakeNet returns an empty network.
func NewFakeNet() *FakeNet {
	return &FakeNet{hosts: map[netip.Addr]*fakeSource{}, served: map[netip.Addr]map[PortSpec]bool{}, services: map[fakeService][]netip.AddrPort{}}
}

// Echo adds an echo agent at addr serving ports.
func (n *FakeNet) Echo(info Info, addr netip.Addr, ports []PortSpec) *Echo {
	src := &fakeSource{}
	e := NewEcho(info, ports, src)
	src.handle = e.onPacket
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hosts[addr], n.served[addr] = src, e.served
	return e
}

// Prober adds a probe agent at addr (its probes' default source).
func (n *FakeNet) Prober(info Info, addr netip.Addr) *Prober {
	src := &fakeSource{}
	s := fakeSink{n}
	p := NewProber(info, []PacketSink{s, s}, fakeRoute(addr), src)
	src.handle = p.onICMP
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hosts[addr] = src
	return p
}

// Service makes proto probes to vip go to one of endpoints, chosen by the
// probe's ID modulo their number (a deterministic spread), or rejected
// when there is none.
func (n *FakeNet) Service(proto traffic.Proto, vip netip.AddrPort, endpoints ...netip.AddrPort) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.services[fakeService{proto, vip}] = endpoints
}

// deliver carries one probe.
func (n *FakeNet) deliver(pkt []byte) {
	a, err := traffic.ParseArrival(pkt)
	if err != nil {
		return
	}
	n.mu.Lock()
	to, icmp := a.Dst, -1
	var from netip.Addr
	if eps, ok := n.services[fakeService{a.Proto, a.Dst}]; ok {
		if len(eps) == 0 {
			from, icmp = a.Dst.Addr(), traffic.CodePortUnreachable
		} else {
			to = eps[int(a.ID%uint32(len(eps)))]
		}
	}
	host := n.hosts[to.Addr()]
	switch {
	case icmp >= 0:
	case host == nil:
		from, icmp = a.Dst.Addr(), traffic.CodeHostUnreachable
	case n.served[to.Addr()] != nil && !n.served[to.Addr()][PortSpec{a.Proto, to.Port()}]:
		from, icmp = to.Addr(), traffic.CodePortUnreachable
	}
	back := n.hosts[a.Src.Addr()]
	n.mu.Unlock()
	if icmp >= 0 {
		if back != nil {
			back.handle(icmpUnreachable(from, a.Src.Addr(), uint8(icmp), pkt))
		}
		return
	}
	if to != a.Dst {
		pkt = dnat(pkt, to)
	}
	host.handle(pkt)
}

// dnat is a copy of an IPv4 probe with its destination rewritten.
func dnat(pkt []byte, to netip.AddrPort) []byte {
	out := append([]byte(nil), pkt...)
	ip := to.Addr().As4()
	copy(out[16:20], ip[:])
	binary.BigEndian.PutUint16(out[int(out[0]&0x0f)*4+2:], to.Port())
	return out
}

// icmpUnreachable is the ICMP destination-unreachable from from to to
// quoting pkt (at most 548 bytes of it: a 576-byte error, as Linux'
// icmp_send), checksums computed.
func icmpUnreachable(from, to netip.Addr, code uint8, pkt []byte) []byte {
	q := pkt[:min(len(pkt), 548)]
	b := make([]byte, 28+len(q))
	b[0], b[8], b[9] = 0x45, 64, 1
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	f, t := from.As4(), to.As4()
	copy(b[12:16], f[:])
	copy(b[16:20], t[:])
	binary.BigEndian.PutUint16(b[10:], checksum(b[:20]))
	b[20], b[21] = 3, code
	copy(b[28:], q)
	binary.BigEndian.PutUint16(b[22:], checksum(b[20:]))
	return b
}

// checksum is the Internet checksum (RFC 1071).
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// fakeSource hands the FakeNet's packets to its agent synchronously.
type fakeSource struct {
	handle func([]byte)
}

func (s *fakeSource) Run(ctx context.Context, _ func([]byte)) error {
	<-ctx.Done()
	return ctx.Err()
}

func (s *fakeSource) Drops() uint64 { return 0 }

// fakeSink is a probe agent's sender on a FakeNet.
type fakeSink struct{ n *FakeNet }

func (s fakeSink) Send(pkt []byte, _ netip.Addr) error {
	s.n.deliver(append([]byte(nil), pkt...))
	return nil
}

// fakeRoute picks one address for every destination.
type fakeRoute netip.Addr

func (r fakeRoute) Source(dst netip.AddrPort) (netip.Addr, error) {
	if !netip.Addr(r).IsValid() {
		return netip.Addr{}, fmt.Errorf("no route to %s", dst)
	}
	return netip.Addr(r), nil
}

var (
	_ PacketSource = (*fakeSource)(nil)
	_ PacketSink   = fakeSink{}
	_ Router       = fakeRoute{}
)
