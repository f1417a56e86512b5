// Package traffic generates probe connections inside client pod namespaces
// and observes what reaches the backends. Probes are single packets built
// with gopacket (a TCP SYN or a UDP datagram) written to a raw socket, each
// with a fresh source port, so every probe is a new connection the dataplane
// must balance; backends count them on a raw socket without answering in
// user space (the kernel's RST or ICMP error ends the conntrack entry or lets
// it expire).
package traffic

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Proto is TCP or UDP.
type Proto uint8

// Protocols.
const (
	TCP Proto = 6
	UDP Proto = 17
)

// String is the protocol's name.
func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// ProbeMagic starts the payload of every UDP probe (and is the TCP SYN's
// sequence number's high half), so observers ignore foreign packets.
const ProbeMagic = 0x6b70 // "kp"

// Builder builds probe packets, reusing its buffers: not safe for concurrent
// use.
type Builder struct {
	buf  gopacket.SerializeBuffer
	opts gopacket.SerializeOptions
	ip   layers.IPv4
	tcp  layers.TCP
	udp  layers.UDP
}

// NewBuilder returns a builder.
func NewBuilder() *Builder {
	return &Builder{buf: gopacket.NewSerializeBuffer(), opts: gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}}
}

// Build returns an IPv4 packet (header included) for a probe from src to dst.
// id is carried in the TCP sequence number or the UDP payload. The returned
// slice is valid until the next call.
func (b *Builder) Build(p Proto, src, dst netip.AddrPort, id uint32) ([]byte, error) {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return nil, errors.New("probes are IPv4 only")
	}
	// The IP ID carries the top 16 bits of id: an ICMP error quotes the IP
	// header, so a reject can be matched to its probe's phase.
	b.ip = layers.IPv4{Version: 4, IHL: 5, TTL: 64, Id: uint16(id >> 16), Flags: layers.IPv4DontFragment,
		SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	var err error
	switch p {
	case TCP:
		b.ip.Protocol = layers.IPProtocolTCP
		b.tcp = layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), Seq: id, SYN: true, Window: 64240}
		if err = b.tcp.SetNetworkLayerForChecksum(&b.ip); err == nil {
			err = gopacket.SerializeLayers(b.buf, b.opts, &b.ip, &b.tcp)
		}
	case UDP:
		b.ip.Protocol = layers.IPProtocolUDP
		b.udp = layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
		payload := gopacket.Payload([]byte{ProbeMagic >> 8, ProbeMagic & 0xff, byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)})
		if err = b.udp.SetNetworkLayerForChecksum(&b.ip); err == nil {
			err = gopacket.SerializeLayers(b.buf, b.opts, &b.ip, &b.udp, payload)
		}
	default:
		return nil, fmt.Errorf("unknown protocol %d", p)
	}
	if err != nil {
		return nil, fmt.Errorf("could not build probe: %w", err)
	}
	return b.buf.Bytes(), nil
}

// Arrival is a probe as a backend saw it: post-DNAT destination and the
// client's source.
type Arrival struct {
	Proto Proto
	Src   netip.AddrPort
	Dst   netip.AddrPort
	ID    uint32
}

// Unreachable is an ICMP destination-unreachable a client received about one
// of its probes (a REJECT).
type Unreachable struct {
	Code     uint8
	Proto    Proto
	Src, Dst netip.AddrPort // of the original probe
	// IPID is the quoted probe's IP ID: the top 16 bits of its id.
	IPID uint16
}

// ICMP destination-unreachable codes.
const (
	CodeNetUnreachable  = 0
	CodeHostUnreachable = 1
	CodePortUnreachable = 3 // what iptables REJECT and nftables reject send by default
)

var errNotProbe = errors.New("not a probe")

// ParseArrival decodes a packet read from a raw IPv4 socket (IP header
// included) as a probe arrival. It returns errNotProbe for anything else:
// replies, retransmissions, other traffic.
func ParseArrival(b []byte) (Arrival, error) {
	var a Arrival
	if len(b) < 20 || b[0]>>4 != 4 {
		return a, errNotProbe
	}
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || len(b) < ihl+8 {
		return a, errNotProbe
	}
	src, _ := netip.AddrFromSlice(b[12:16])
	dst, _ := netip.AddrFromSlice(b[16:20])
	l4 := b[ihl:]
	sport := uint16(l4[0])<<8 | uint16(l4[1])
	dport := uint16(l4[2])<<8 | uint16(l4[3])
	switch b[9] {
	case 6:
		if len(l4) < 20 || l4[13]&0x12 != 0x02 { // SYN without ACK
			return a, errNotProbe
		}
		a.Proto = TCP
		a.ID = uint32(l4[4])<<24 | uint32(l4[5])<<16 | uint32(l4[6])<<8 | uint32(l4[7])
	case 17:
		p := l4[8:]
		if len(p) < 6 || p[0] != ProbeMagic>>8 || p[1] != ProbeMagic&0xff {
			return a, errNotProbe
		}
		a.Proto = UDP
		a.ID = uint32(p[2])<<24 | uint32(p[3])<<16 | uint32(p[4])<<8 | uint32(p[5])
	default:
		return a, errNotProbe
	}
	a.Src = netip.AddrPortFrom(src, sport)
	a.Dst = netip.AddrPortFrom(dst, dport)
	return a, nil
}

// ParseUnreachable decodes an ICMP destination-unreachable (from a raw ICMP
// socket, IP header included) and the probe header it quotes.
func ParseUnreachable(b []byte) (Unreachable, error) {
	var u Unreachable
	if len(b) < 20 || b[0]>>4 != 4 || b[9] != 1 {
		return u, errNotProbe
	}
	// Header lengths come from the packet: check them before slicing (an
	// IHL past the end panicked; FuzzParseUnreachable found it).
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || len(b) < ihl+8+20+8 {
		return u, errNotProbe
	}
	icmp := b[ihl:]
	if icmp[0] != 3 {
		return u, errNotProbe
	}
	u.Code = icmp[1]
	inner := icmp[8:]
	iihl := int(inner[0]&0x0f) * 4
	if iihl < 20 || len(inner) < iihl+4 {
		return u, errNotProbe
	}
	switch inner[9] {
	case 6:
		u.Proto = TCP
	case 17:
		u.Proto = UDP
	default:
		return u, errNotProbe
	}
	u.IPID = uint16(inner[4])<<8 | uint16(inner[5])
	src, _ := netip.AddrFromSlice(inner[12:16])
	dst, _ := netip.AddrFromSlice(inner[16:20])
	l4 := inner[iihl:]
	u.Src = netip.AddrPortFrom(src, uint16(l4[0])<<8|uint16(l4[1]))
	u.Dst = netip.AddrPortFrom(dst, uint16(l4[2])<<8|uint16(l4[3]))
	return u, nil
}
