package calibrate

import (
	"net/netip"
	"testing"
)

// TestObjects: n Services of k ready endpoints, addresses inside the
// service range clear of its first address, distinct endpoints; the
// external shape's LoadBalancers reach the tracker's state with every
// external field.
func TestObjects(t *testing.T) {
	for _, shape := range Shapes {
		svcs, slices, err := Objects(300, 10, shape)
		if err != nil {
			t.Fatal(err)
		}
		if len(svcs) != 300 || len(slices) != 300 {
			t.Fatalf("%s: %d services, %d slices", shape, len(svcs), len(slices))
		}
		seen := map[string]bool{}
		for i, s := range svcs {
			ip := netip.MustParseAddr(s.Spec.ClusterIP)
			if !ServiceCIDR.Contains(ip) || ip == ServiceCIDR.Addr().Next() || seen[s.Spec.ClusterIP] {
				t.Fatalf("%s: service %d: cluster IP %s", shape, i, ip)
			}
			seen[s.Spec.ClusterIP] = true
			if len(slices[i].Endpoints) != 10 || *slices[i].Endpoints[0].Conditions.Ready != true {
				t.Fatalf("%s: slice %d: %+v", shape, i, slices[i].Endpoints)
			}
			for _, e := range slices[i].Endpoints {
				if seen[e.Addresses[0]] {
					t.Fatalf("%s: endpoint %s twice", shape, e.Addresses[0])
				}
				seen[e.Addresses[0]] = true
			}
		}
		st := State(svcs, slices)
		if len(st.Services) != 300 || len(st.Nodes) != 1 {
			t.Fatalf("%s: state of %d service ports, %d nodes", shape, len(st.Services), len(st.Nodes))
		}
		lbs, local, ranges := 0, 0, 0
		ports := map[int32]bool{}
		for _, sp := range st.Services {
			if len(st.Endpoints[sp.Name]) != 10 {
				t.Fatalf("%s: %s has %d endpoints", shape, sp.Name, len(st.Endpoints[sp.Name]))
			}
			if sp.NodePort == 0 {
				continue
			}
			lbs++
			if len(sp.ExternalIPs) != 1 || len(sp.LoadBalancerIPs) != 1 {
				t.Errorf("%s: %s: external IPs %v, load-balancer IPs %v", shape, sp.Name, sp.ExternalIPs, sp.LoadBalancerIPs)
			}
			for _, p := range []int32{sp.NodePort, sp.HealthCheckNodePort} {
				if p != 0 && ports[p] {
					t.Errorf("%s: port %d twice", shape, p)
				}
				ports[p] = true
			}
			if sp.ExternalLocal {
				local++
				if sp.HealthCheckNodePort == 0 {
					t.Errorf("%s: %s is Local without a health check node port", shape, sp.Name)
				}
			}
			if len(sp.SourceRanges) > 0 {
				ranges++
			}
		}
		want := map[string][3]int{ShapeClusterIP: {0, 0, 0}, ShapeExternal: {30, 15, 15}}[shape]
		if got := [3]int{lbs, local, ranges}; got != want {
			t.Errorf("%s: %v LoadBalancers, Local, with ranges; want %v", shape, got, want)
		}
	}
	if _, _, err := Objects(20000, 1, ShapeExternal); err == nil {
		t.Error("20,000 Services of the external shape (node ports past the range) must be an error")
	}
	if _, _, err := Objects(1, 1, "nodeport"); err == nil {
		t.Error("an unknown shape must be an error")
	}
}
