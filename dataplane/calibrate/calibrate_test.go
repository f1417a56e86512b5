package calibrate

import (
	"net/netip"
	"testing"
)

func TestMedian(t *testing.T) {
	v := []float64{3, 1, 2, 4}
	if got := Median(v); got != 3 {
		t.Errorf("Median(%v) = %v, want the upper middle 3", v, got)
	}
	if v[0] != 3 {
		t.Errorf("Median sorted its argument in place: %v", v)
	}
	if got := Median([]float64{5, 1, 9}); got != 5 {
		t.Errorf("Median of three = %v, want 5", got)
	}
}

func TestSynthetic(t *testing.T) {
	st := Synthetic(300, 4)
	if len(st.Services) != 300 || len(st.Endpoints) != 300 || len(st.Nodes) != 1 {
		t.Fatalf("%d services, %d endpoint sets, %d nodes; want 300, 300, 1", len(st.Services), len(st.Endpoints), len(st.Nodes))
	}
	vips, eps := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	pods := st.Nodes["node-1"].PodCIDR
	for spn, sp := range st.Services {
		vips[sp.ClusterIP] = true
		if len(st.Endpoints[spn]) != 4 {
			t.Fatalf("%s has %d endpoints, want 4", spn, len(st.Endpoints[spn]))
		}
		for _, ep := range st.Endpoints[spn] {
			if !ep.Ready || ep.NodeName != "node-1" || !pods.Contains(ep.IP) {
				t.Fatalf("endpoint %+v: want ready, on node-1, in %s", ep, pods)
			}
			eps[ep.IP] = true
		}
	}
	if len(vips) != 300 || len(eps) != 1200 {
		t.Errorf("%d distinct cluster IPs and %d distinct endpoint IPs, want 300 and 1200", len(vips), len(eps))
	}
}
