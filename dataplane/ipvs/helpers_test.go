package ipvs

import (
	"net/netip"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Fixtures and the golden helper from the backends' test kit.
const (
	thisNode  = dataplanetest.ThisNode
	otherNode = dataplanetest.OtherNode
)

var (
	podCIDR = dataplanetest.PodCIDR
	nodeIP  = dataplanetest.NodeIP

	name          = dataplanetest.Name
	clusterIPPort = dataplanetest.ClusterIPPort
	ep            = dataplanetest.EP
	newState      = dataplanetest.NewState
	add           = dataplanetest.Add
	golden        = dataplanetest.Golden
)

func testConfig(faults ...proxy.Fault) Config {
	fs := proxy.Faults{}
	for _, f := range faults {
		fs[f] = true
	}
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: thisNode, ClusterCIDR: podCIDR, Faults: fs}, NodeIPs: []netip.Addr{nodeIP}, GracefulCheckPeriod: -1}
}

// fakes is a backend over a Fake table and a FakeSystem.
type fakes struct {
	ipvs *Fake
	sys  *FakeSystem
	b    *Backend
}

func newFakes(t *testing.T, cfg Config) *fakes {
	t.Helper()
	f := NewFake()
	sys := NewFakeSystem(f)
	b, err := New(cfg, f, sys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &fakes{ipvs: f, sys: sys, b: b}
}

func (f *fakes) sync(t *testing.T, st *cluster.State, full bool) dataplane.SyncResult {
	t.Helper()
	res, err := f.b.Sync(st, nil, full)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return res
}

func (f *fakes) dump(t *testing.T) string {
	t.Helper()
	d, err := f.b.Dump()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func key(proto, addrPort string) Key {
	ap := netip.MustParseAddrPort(addrPort)
	return Key{Proto: proto, Addr: ap.Addr(), Port: ap.Port()}
}
