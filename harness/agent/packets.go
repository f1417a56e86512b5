package agent

import (
	"github.com/kpsim/kpsim/harness/traffic"
)

// A pod sees more than probes: the API server's connections to the agent's
// own port, a kubelet's health checks, whatever else reaches the pod. In
// conform's namespaces only probes arrive, so traffic.ParseArrival takes any
// TCP SYN for one (its ID is the sequence number); here a packet must also
// look like what traffic.Builder writes before it is counted.

// isProbeArrival reports whether pkt, which traffic.ParseArrival accepted,
// is a probe as traffic.Builder builds it: a UDP probe carries
// traffic.ProbeMagic (ParseArrival checked it); a TCP probe is a SYN with a
// bare 20-byte header and window 64240, where every SYN of a Linux socket
// carries options (MSS at least).
func isProbeArrival(pkt []byte, proto traffic.Proto) bool {
	if proto != traffic.TCP {
		return true
	}
	ihl := int(pkt[0]&0x0f) * 4
	tcp := pkt[ihl:] // ParseArrival checked 20 bytes
	return tcp[12]>>4 == 5 && tcp[14] == 64240>>8 && tcp[15] == 64240&0xff
}

// quotedProbe decodes an ICMP destination-unreachable (IP header included)
// whose quoted packet is a probe: the quoted probe ID's top 16 bits must
// equal the quoted IP ID (traffic.Builder puts id>>16 there), which a
// random packet matches one time in 65,536. The tag is the ID's top 8 bits.
func quotedProbe(pkt []byte) (u traffic.Unreachable, tag uint8, ok bool) {
	u, err := traffic.ParseUnreachable(pkt)
	if err != nil {
		return u, 0, false
	}
	// ParseUnreachable checked the outer header, the ICMP header and the
	// quoted IP header's length.
	inner := pkt[int(pkt[0]&0x0f)*4+8:]
	l4 := inner[int(inner[0]&0x0f)*4:]
	var id uint32
	switch u.Proto {
	case traffic.TCP:
		if len(l4) < 8 {
			return u, 0, false
		}
		id = uint32(l4[4])<<24 | uint32(l4[5])<<16 | uint32(l4[6])<<8 | uint32(l4[7])
	case traffic.UDP:
		p := l4[min(len(l4), 8):]
		if len(p) < 6 || p[0] != traffic.ProbeMagic>>8 || p[1] != traffic.ProbeMagic&0xff {
			return u, 0, false
		}
		id = uint32(p[2])<<24 | uint32(p[3])<<16 | uint32(p[4])<<8 | uint32(p[5])
	default:
		return u, 0, false
	}
	if uint16(id>>16) != u.IPID {
		return u, 0, false
	}
	return u, uint8(id >> 24), true
}
