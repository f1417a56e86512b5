package traffic

import (
	"testing"
)

// The seed corpora under testdata/fuzz/ are probes as Build makes them (TCP
// and UDP), a SYN-ACK, and ICMP port-unreachables quoting each probe, as
// TestParseUnreachable builds them.

// FuzzParseArrival: any bytes from a backend's raw socket decode without
// panicking; an arrival is TCP or UDP between IPv4 addresses, and the probe
// Build makes of it decodes to the same arrival.
func FuzzParseArrival(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseArrival(b)
		if err != nil {
			return
		}
		if a.Proto != TCP && a.Proto != UDP || !a.Src.Addr().Is4() || !a.Dst.Addr().Is4() {
			t.Fatalf("arrival %+v from %x", a, b)
		}
		pkt, err := NewBuilder().Build(a.Proto, a.Src, a.Dst, a.ID)
		if err != nil {
			t.Fatalf("could not build %+v again: %v", a, err)
		}
		if again, err := ParseArrival(pkt); err != nil || again != a {
			t.Fatalf("%+v built and parsed again gives %+v, %v", a, again, err)
		}
	})
}

// FuzzParseUnreachable: any bytes from a client's raw ICMP socket decode
// without panicking; an unreachable quotes a TCP or UDP probe between IPv4
// addresses.
func FuzzParseUnreachable(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseUnreachable(b)
		if err != nil {
			return
		}
		if u.Proto != TCP && u.Proto != UDP || !u.Src.Addr().Is4() || !u.Dst.Addr().Is4() {
			t.Fatalf("unreachable %+v from %x", u, b)
		}
	})
}
