package traffic

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

func TestBuildParseRoundTrip(t *testing.T) {
	b := NewBuilder()
	src := netip.MustParseAddrPort("10.244.0.5:40001")
	dst := netip.MustParseAddrPort("10.96.0.10:80")
	for _, p := range []Proto{TCP, UDP} {
		pkt, err := b.Build(p, src, dst, 0xdeadbeef)
		if err != nil {
			t.Fatal(err)
		}
		// gopacket agrees the packet is well formed with valid checksums.
		g := gopacket.NewPacket(pkt, layers.LayerTypeIPv4, gopacket.Default)
		if g.ErrorLayer() != nil {
			t.Fatalf("%s: %v", p, g.ErrorLayer().Error())
		}
		a, err := ParseArrival(pkt)
		if err != nil || a.Proto != p || a.Src != src || a.Dst != dst || a.ID != 0xdeadbeef {
			t.Errorf("%s: parsed %+v, %v", p, a, err)
		}
	}
}

func TestParseArrivalIgnoresReplies(t *testing.T) {
	ip := layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: []byte{10, 0, 0, 1}, DstIP: []byte{10, 0, 0, 2}}
	tcp := layers.TCP{SrcPort: 80, DstPort: 4000, SYN: true, ACK: true}
	if err := tcp.SetNetworkLayerForChecksum(&ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, &ip, &tcp); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseArrival(buf.Bytes()); err == nil {
		t.Error("a SYN-ACK was counted as a probe")
	}
}

func TestParseUnreachable(t *testing.T) {
	b := NewBuilder()
	probe, _ := b.Build(TCP, netip.MustParseAddrPort("10.244.0.5:40001"), netip.MustParseAddrPort("10.96.0.60:80"), 7)
	quoted := append([]byte(nil), probe[:28]...)
	ip := layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: []byte{198, 18, 0, 1}, DstIP: []byte{10, 244, 0, 5}}
	icmp := layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 3)}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, &ip, &icmp, gopacket.Payload(quoted)); err != nil {
		t.Fatal(err)
	}
	u, err := ParseUnreachable(buf.Bytes())
	if err != nil || u.Code != 3 || u.Proto != TCP || u.Dst.String() != "10.96.0.60:80" || u.Src.Port() != 40001 {
		t.Errorf("parsed %+v, %v", u, err)
	}
}

func BenchmarkBuildTCP(b *testing.B) {
	bl := NewBuilder()
	src := netip.MustParseAddrPort("10.244.0.5:40001")
	dst := netip.MustParseAddrPort("10.96.0.10:80")
	for i := 0; i < b.N; i++ {
		if _, err := bl.Build(TCP, src, dst, uint32(i)); err != nil {
			b.Fatal(err)
		}
	}
}
