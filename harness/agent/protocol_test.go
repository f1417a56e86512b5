package agent

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/kpsim/kpsim/harness/traffic"
)

func goodRequest() SendRequest {
	return SendRequest{Tag: 7, Proto: "tcp", VIP: "10.96.0.10:80", First: 100, N: 1000, Start: 5, Step: 7}
}

func TestValidate(t *testing.T) {
	b, err := goodRequest().validate()
	if err != nil {
		t.Fatal(err)
	}
	if b.proto != traffic.TCP || b.vip != netip.MustParseAddrPort("10.96.0.10:80") || b.src.IsValid() || b.n != 1000 {
		t.Errorf("validated %+v", b)
	}
	for _, c := range []struct {
		field string
		edit  func(*SendRequest)
	}{
		{"tag", func(r *SendRequest) { r.Tag = 256 }},
		{"proto", func(r *SendRequest) { r.Proto = "icmp" }},
		{"proto", func(r *SendRequest) { r.Proto = "" }},
		{"vip", func(r *SendRequest) { r.VIP = "nope" }},
		{"vip", func(r *SendRequest) { r.VIP = "10.96.0.10" }},
		{"vip", func(r *SendRequest) { r.VIP = "10.96.0.10:0" }},
		{"vip", func(r *SendRequest) { r.VIP = "[fd00::1]:80" }},
		{"src", func(r *SendRequest) { r.Src = "10.0.0.1:5" }},
		{"src", func(r *SendRequest) { r.Src = "fd00::1" }},
		{"n", func(r *SendRequest) { r.N = 0 }},
		{"n", func(r *SendRequest) { r.N = -1 }},
		{"n", func(r *SendRequest) { r.N = MaxProbes + 1 }},
		{"start", func(r *SendRequest) { r.Start = -1 }},
		{"start", func(r *SendRequest) { r.Start = traffic.PortSpan }},
		{"step", func(r *SendRequest) { r.Step = 0 }},
		{"step", func(r *SendRequest) { r.Step = 2 }},
		{"step", func(r *SendRequest) { r.Step = 9 }},
		{"step", func(r *SendRequest) { r.Step = traffic.PortSpan + 1 }},
	} {
		r := goodRequest()
		c.edit(&r)
		_, err := r.validate()
		var ie *InputError
		if !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("%+v: got %v, want an input error on %s", r, err, c.field)
		}
	}
	r := goodRequest()
	r.Proto, r.Src, r.N, r.Tag = "UDP", "10.244.1.5", MaxProbes, MaxTag
	if _, err := r.validate(); err != nil {
		t.Errorf("%+v: %v", r, err)
	}
	r.Tag = 0
	if _, err := r.validate(); err != nil {
		t.Errorf("%+v: %v", r, err)
	}
}

// TestProbeID: probe j's ID is conform's tag<<24 | (First+j)&0xffffff,
// wrapping inside the low 24 bits.
func TestProbeID(t *testing.T) {
	b := block{tag: 9, first: 0xfffffe}
	for j, want := range []uint32{0x09fffffe, 0x09ffffff, 0x09000000, 0x09000001} {
		if got := b.id(j); got != want {
			t.Errorf("id(%d) = %#x, want %#x", j, got, want)
		}
	}
}

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts("tcp:8080, UDP:8080,udp:53")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]PortSpec{{traffic.TCP, 8080}, {traffic.UDP, 8080}, {traffic.UDP, 53}}, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	for _, bad := range []string{"", "tcp", "tcp:", "sctp:80", "tcp:0", "tcp:65536", "tcp:80,tcp:80", "tcp:http"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestTally: per-tag counts, Foreign, eviction past the bound and forget.
func TestTally(t *testing.T) {
	tl := newTally(3)
	ep := netip.MustParseAddrPort("10.244.1.5:8080")
	c1, c2 := netip.MustParseAddr("10.244.0.2"), netip.MustParseAddr("10.244.0.3")
	tl.arrival(1, ep, c2)
	tl.arrival(1, ep, c1)
	tl.arrival(1, ep, c1)
	tl.icmp(2, true)
	tl.icmp(2, false)
	want := Counts{Tag: 1, Arrivals: []Arrival{{"10.244.1.5:8080", "10.244.0.2", 2}, {"10.244.1.5:8080", "10.244.0.3", 1}}, Foreign: 2}
	if diff := cmp.Diff(want, tl.counts(1)); diff != "" {
		t.Errorf("tag 1 (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff(Counts{Tag: 2, Arrivals: []Arrival{}, Rejects: 1, OtherICMP: 1, Foreign: 3}, tl.counts(2)); diff != "" {
		t.Errorf("tag 2 (-want +got)\n%s", diff)
	}
	// Tags 3 and 4 push tag 1 out (the bound is 3).
	tl.arrival(3, ep, c1)
	tl.arrival(4, ep, c1)
	if c := tl.counts(1); !c.Evicted || len(c.Arrivals) != 0 {
		t.Errorf("tag 1 after eviction: %+v", c)
	}
	if c := tl.counts(4); c.Evicted || c.Total() != 1 || c.Foreign != 6 {
		t.Errorf("tag 4: %+v", c)
	}
	tl.forget(4)
	for tag := range uint8(4) {
		if c := tl.counts(tag); c.Evicted || len(c.Arrivals) != 0 || c.Rejects != 0 {
			t.Errorf("tag %d after forget: %+v", tag, c)
		}
	}
	if c := tl.counts(4); c.Total() != 1 {
		t.Errorf("tag 4 after forget below 4: %+v", c)
	}
	// Forgetting frees the slots: three new tags evict nothing kept.
	tl.arrival(5, ep, c1)
	tl.arrival(6, ep, c1)
	if c := tl.counts(4); c.Evicted || c.Total() != 1 {
		t.Errorf("tag 4 after two new tags: %+v", c)
	}
}

// TestQuotedProbe: an ICMP error quoting a probe names the probe's tag;
// one quoting anything else is ignored.
func TestQuotedProbe(t *testing.T) {
	bd := traffic.NewBuilder()
	src, dst := netip.MustParseAddrPort("10.244.0.5:40001"), netip.MustParseAddrPort("10.96.0.60:80")
	router := netip.MustParseAddr("198.18.0.1")
	for _, p := range []traffic.Proto{traffic.TCP, traffic.UDP} {
		pkt, _ := bd.Build(p, src, dst, 42<<24|0x123456)
		// Linux quotes the whole probe (icmp_send: up to 576 bytes); the
		// TCP ID also survives a quote of 8 bytes past the IP header.
		for _, quoted := range [][]byte{pkt, pkt[:28]} {
			if p == traffic.UDP && len(quoted) == 28 {
				continue // the payload with the ID is cut off
			}
			u, tag, ok := quotedProbe(icmpUnreachable(router, src.Addr(), traffic.CodePortUnreachable, quoted))
			if !ok || tag != 42 || u.Code != traffic.CodePortUnreachable || u.Src != src || u.Dst != dst {
				t.Errorf("%s, %d bytes quoted: %+v tag %d ok %v", p, len(quoted), u, tag, ok)
			}
		}
	}
	// A UDP quote cut before the payload names no probe.
	pkt, _ := bd.Build(traffic.UDP, src, dst, 42<<24)
	if _, _, ok := quotedProbe(icmpUnreachable(router, src.Addr(), 3, pkt[:28])); ok {
		t.Error("a UDP quote without the payload was taken for a probe")
	}
	// A packet whose IP ID does not match its ID's top half is not a probe
	// (a kernel's own SYN, a rewritten IP ID).
	pkt, _ = bd.Build(traffic.TCP, src, dst, 42<<24)
	pkt = append([]byte(nil), pkt...)
	pkt[4] ^= 0x01
	if _, _, ok := quotedProbe(icmpUnreachable(router, src.Addr(), 3, pkt)); ok {
		t.Error("a quote with a foreign IP ID was taken for a probe")
	}
	if _, _, ok := quotedProbe(pkt); ok {
		t.Error("a probe was taken for an ICMP error")
	}
}

// TestIsProbeArrival: a kernel's SYN (with options) reaching a served port
// is not a probe.
func TestIsProbeArrival(t *testing.T) {
	bd := traffic.NewBuilder()
	pkt, _ := bd.Build(traffic.TCP, netip.MustParseAddrPort("10.244.0.5:40001"), netip.MustParseAddrPort("10.244.1.5:8080"), 1<<24)
	if !isProbeArrival(pkt, traffic.TCP) {
		t.Error("a probe SYN was not taken for a probe")
	}
	ip := layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: []byte{10, 244, 0, 5}, DstIP: []byte{10, 244, 1, 5}}
	tcp := layers.TCP{SrcPort: 40001, DstPort: 8080, Seq: 1 << 24, SYN: true, Window: 64240,
		Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{5, 180}}}}
	if err := tcp.SetNetworkLayerForChecksum(&ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, &ip, &tcp); err != nil {
		t.Fatal(err)
	}
	if _, err := traffic.ParseArrival(buf.Bytes()); err != nil {
		t.Fatalf("the kernel-like SYN does not parse: %v", err)
	}
	if isProbeArrival(buf.Bytes(), traffic.TCP) {
		t.Error("a SYN with options was taken for a probe")
	}
}

func TestErrorMessage(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":"n: 0 is out of range"}`: "n: 0 is out of range",
		`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"x\" not found","code":404}`: `pods "x" not found`,
		"404 page not found\n": "404 page not found",
		"":                     "(no body)",
	} {
		if got := errorMessage([]byte(body)); got != want {
			t.Errorf("%q: %q, want %q", body, got, want)
		}
	}
	if got := errorMessage([]byte(strings.Repeat("x", 600))); len(got) != 515 {
		t.Errorf("a long body gives %d characters, want 512 and an ellipsis", len(got))
	}
}
