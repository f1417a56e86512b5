package iptables

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"

	"github.com/kpsim/kpsim/dataplane"
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
	podIP   = dataplanetest.PodIP
	extIP   = dataplanetest.ExtIP

	name          = dataplanetest.Name
	clusterIPPort = dataplanetest.ClusterIPPort
	ep            = dataplanetest.EP
	newState      = dataplanetest.NewState
	add           = dataplanetest.Add
	golden        = dataplanetest.Golden
	lineDiff      = dataplanetest.Diff
)

func testConfig(faults ...proxy.Fault) Config {
	fs := proxy.Faults{}
	for _, f := range faults {
		fs[f] = true
	}
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: thisNode, ClusterCIDR: podCIDR, Faults: fs}}
}

func mustRenderer(t *testing.T, cfg Config) *Renderer {
	t.Helper()
	r, err := NewRenderer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newBackend returns a Backend on FakeCommands with a fresh fake.
func newBackend(t *testing.T, cfg Config) (*Backend, *FakeCommands) {
	t.Helper()
	c := NewFakeCommands(nodeIP)
	b, err := NewBackendWithCommands(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b, c
}

// apply syncs st through the Backend, fully or partially, and returns the
// ruleset it applied.
func apply(t *testing.T, b *Backend, st *cluster.State, changed []cluster.ServicePortName, full bool) *Ruleset {
	t.Helper()
	if _, err := b.Sync(st, changed, full); err != nil {
		t.Fatalf("sync: %v\n%s", err, numbered(b.LastText))
	}
	return b.LastRuleset
}

// load syncs st fully through a new Backend on a fresh fake.
func load(t *testing.T, cfg Config, st *cluster.State) (*Fake, *Backend, *Ruleset) {
	t.Helper()
	b, c := newBackend(t, cfg)
	rs := apply(t, b, st, nil, true)
	return c.Fake, b, rs
}

func numbered(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		fmt.Fprintf(&b, "%4d %s\n", i+1, l)
	}
	return b.String()
}
