package ipvs

import (
	"net/netip"
	"testing"

	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

// The syncs Calibrate measures, on the fakes: the synthetic Services become
// one virtual server each with all their real servers, kube-proxy's full
// resync after one endpoint leaves takes it out, and the incremental sync
// brings it back. The object counts are the cost model's (cost.Count).
func TestCalibrationSyncs(t *testing.T) {
	const n, k = 50, 4
	f := newFakes(t, calibrationConfig("legacy"))
	st := calibrate.Synthetic(n, k)
	f.sync(t, st, true)
	vs, rs := f.counts(t)
	want := cost.Count(cluster.ModeIPVS, inputs(n, k), true)
	if vs != want.VirtualServers || rs != want.RealServers || vs != n || rs != n*k {
		t.Fatalf("full sync: %d virtual, %d real servers; want %d, %d (cost.Count %d, %d)", vs, rs, n, n*k, want.VirtualServers, want.RealServers)
	}
	first := st.SortedServicePorts()[0]
	e := st.Endpoints[first][0]
	e.Ready, e.Serving = false, false
	if _, err := f.b.Sync(st, []cluster.ServicePortName{first}, true); err != nil {
		t.Fatal(err)
	}
	// A leaving TCP real server without connections is deleted at once.
	if _, rs := f.counts(t); rs != n*k-1 {
		t.Errorf("after the resync: %d real servers, want %d", rs, n*k-1)
	}
	e.Ready, e.Serving = true, true
	res, err := f.b.Sync(st, []cluster.ServicePortName{first}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, rs := f.counts(t); rs != n*k || res.Full {
		t.Errorf("after the incremental sync: %d real servers (full %v), want %d, not full", rs, res.Full, n*k)
	}
}

// The calibrated node hosts none of the synthetic endpoints, so the
// KUBE-LOOP-BACK ipset stays empty at any size: 10,000 x 10 local endpoints
// would overflow its 65,536 entries.
func TestCalibrationNodeIsRemote(t *testing.T) {
	r, err := NewRenderer(calibrationConfig("legacy"))
	if err != nil {
		t.Fatal(err)
	}
	p := r.Render(calibrate.Synthetic(20, 3))
	if n := len(p.Sets[SetLoopBack]); n != 0 {
		t.Errorf("%d KUBE-LOOP-BACK entries on the calibrated node, want 0 (its endpoints are on node-1)", n)
	}
	if len(p.Servers) != 20 || len(p.Servers[0].Dests) != 3 {
		t.Errorf("%d virtual servers (first with %d real servers), want 20 with 3", len(p.Servers), len(p.Servers[0].Dests))
	}
}

func inputs(n, k int) []cost.ServicePortInput {
	in := make([]cost.ServicePortInput, n)
	for i := range in {
		in[i] = cost.ServicePortInput{Endpoints: k, Reachable: k}
	}
	return in
}

func (f *fakes) counts(t *testing.T) (vs, rs int) {
	t.Helper()
	svcs, err := f.ipvs.GetServices()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		d, err := f.ipvs.GetDestinations(s)
		if err != nil {
			t.Fatal(err)
		}
		vs, rs = vs+1, rs+len(d)
	}
	return vs, rs
}

// cost.Locals and cost.CountOn count KUBE-LOOP-BACK as the renderer writes
// it: one entry per IPv4 endpoint on the node, whatever its readiness, so
// a node's ipset entries are its service ports plus its own endpoints, not
// every endpoint in the cluster.
func TestLoopBackEntriesMatchCost(t *testing.T) {
	const n, k = 12, 5
	st := calibrate.Synthetic(n, k)
	nodes := []string{"node-0", "node-1", "node-2"}
	ports := st.SortedServicePorts()
	eps := make([][]*cluster.Endpoint, len(ports))
	for i, spn := range ports {
		for j, e := range st.Endpoints[spn] {
			e.NodeName = nodes[(i+j)%len(nodes)]
			e.Ready = j%3 != 0 // not-ready local endpoints hairpin too
			e.Serving = e.Ready
		}
		if i == 0 {
			st.Endpoints[spn][1].IP = netip.MustParseAddr("fd00::1") // IPv6: no entry
		}
		eps[i] = st.Endpoints[spn]
	}
	locals := cost.Locals(nodes, eps)
	in := inputs(n, k)
	for ni, node := range nodes {
		cfg := calibrationConfig("legacy")
		cfg.NodeName = node
		r, err := NewRenderer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := r.Render(st)
		c := cost.CountOn(cluster.ModeIPVS, in, locals[ni], true)
		got, want := c.IPSetEntries, len(p.Sets[SetClusterIP])+len(p.Sets[SetLoopBack])
		if got != want || len(p.Sets[SetLoopBack]) == 0 {
			t.Errorf("%s: cost counts %d ipset entries, the renderer writes %d (%d KUBE-CLUSTER-IP, %d KUBE-LOOP-BACK)",
				node, got, want, len(p.Sets[SetClusterIP]), len(p.Sets[SetLoopBack]))
		}
	}
	for i := range in {
		if in[i].Local != 0 {
			t.Fatalf("CountOn left Local %d on input %d", in[i].Local, i)
		}
	}
}
