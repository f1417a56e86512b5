package differential

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/backends"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Listed loads our ruleset for node (st's state, one full sync of mode's
// backend) into a scratch node namespace of a run of its own, reads it back
// as the comparison does (ReadBack) and removes the namespace. It is `sim
// rules --listed`: what the kernel holds, not what the renderer meant.
func Listed(ctx context.Context, mode cluster.Mode, st *cluster.State, node dataplane.NodeConfig, o backends.Options) (_ string, err error) {
	id, err := netns.NewRunID()
	if err != nil {
		return "", err
	}
	pc := netip.MustParsePrefix("100.64.0.0/24")
	cfg := &netns.Config{RunID: id, Nodes: []netns.NodeConfig{{
		Name: "listed", Addr: netip.MustParsePrefix("100.65.0.1/16"), PodCIDR: pc, Gateway: pc.Addr().Next(),
	}}}
	topo, err := netns.Build(ctx, cfg)
	if err != nil {
		return "", fmt.Errorf("could not build the scratch namespace: %w", err)
	}
	defer func() { err = errors.Join(err, topo.Close()) }()
	n, _ := topo.Node("listed")
	b, err := backends.New(mode, n.NS, node, o)
	if err != nil {
		return "", fmt.Errorf("could not build our %s backend: %w", mode, err)
	}
	if c, ok := b.(io.Closer); ok {
		defer func() { err = errors.Join(err, c.Close()) }()
	}
	if _, err := b.Sync(st, nil, true); err != nil {
		return "", fmt.Errorf("could not load our rules into %s: %w", n.NS.Name, err)
	}
	return ReadBack(n.NS, mode)
}
