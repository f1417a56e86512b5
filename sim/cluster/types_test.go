package cluster

import (
	"net/netip"
	"strings"
	"testing"
)

func TestCompareEndpointStringsIsStringOrder(t *testing.T) {
	addrs := []string{"10.0.0.9", "10.0.0.10", "10.0.0.1", "9.1.1.1", "192.168.0.1", "fd00::1", "fd00::a", "::1"}
	var eps []*Endpoint
	for _, a := range addrs {
		for _, port := range []int32{8, 80, 443, 9, 65535} {
			eps = append(eps, &Endpoint{IP: netip.MustParseAddr(a), Port: port})
		}
	}
	for _, a := range eps {
		for _, b := range eps {
			if got, want := CompareEndpointStrings(a, b), strings.Compare(a.String(), b.String()); got != want {
				t.Errorf("CompareEndpointStrings(%s, %s) = %d, want %d", a, b, got, want)
			}
		}
	}
}
