package conform

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/backends"
	"github.com/kpsim/kpsim/dataplane/conntrack"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
)

// kpsimProxies is the kpsim subject: on every node, the mode's backend on a
// tracker of the suite's model, driven by its own sync loop.
type kpsimProxies struct {
	s       *suite
	podCIDR netip.Prefix
	variant string
	faults  proxy.Faults
	list    []*node
	// stopSyncers cancels the nodes' sync loops; syncers counts the loops
	// still running. stop waits for them before a backend or a namespace
	// is closed: a loop that outlived its suite would sync through a
	// closed namespace handle, whose descriptor number the next suite may
	// already have reused for another namespace.
	stopSyncers context.CancelFunc
	syncers     sync.WaitGroup
}

var _ proxies = (*kpsimProxies)(nil)

// node is one node's proxy: its backend, tracker and sync loop.
type node struct {
	name    string
	ns      *netns.Namespace
	backend dataplane.Backend
	tracker *cluster.Tracker
	syncer  *dataplane.Syncer
	// health is kube-proxy's health servers of the node (health check node
	// ports, /healthz).
	health *dataplane.HealthServer
	// conntrack is the node's conntrack table, cleaned after the syncs.
	conntrack *conntrack.NamespaceTable
}

func (k *kpsimProxies) start(ctx context.Context, topo *netns.Topology) error {
	syncCtx, stop := context.WithCancel(ctx)
	k.stopSyncers = stop
	for _, n := range topo.Nodes() {
		if err := k.startNode(ctx, syncCtx, n); err != nil {
			return err
		}
	}
	return nil
}

func (k *kpsimProxies) nodes() int { return len(k.list) }

// startNode starts one node's proxy: it lifts the namespace's ICMP rate
// limits, opens the mode's backend on a synced tracker of the cluster
// model, runs its sync loop until syncCtx ends and waits for the first
// sync (at most settleTimeout).
func (k *kpsimProxies) startNode(ctx, syncCtx context.Context, n *netns.Node) error {
	px := k.s.l.Scenario.Proxy
	k.s.liftICMPLimits(n)
	tr, err := k.s.m.Cluster.AddTrackerSynced(ctx, settleTimeout)
	if err != nil {
		return err
	}
	b, err := k.newBackend(n)
	if err != nil {
		return err
	}
	sy := dataplane.NewSyncer(dataplane.SyncConfig{MinSyncPeriod: px.MinSyncPeriod.Duration, SyncPeriod: px.SyncPeriod.Duration,
		RetryPeriod: time.Second}, b, tr, nil)
	h, err := backends.NewHealth(k.s.o.Mode, n.NS, dataplane.NodeConfig{NodeName: n.Config.Name, Faults: k.faults}, n.Config.Addr.Addr(), 2*px.SyncPeriod.Duration)
	if err != nil {
		if c, ok := b.(io.Closer); ok {
			_ = c.Close()
		}
		return err
	}
	sy.SetHealth(h)
	ct, err := conntrack.NewNamespaceTable(n.NS)
	if err != nil {
		_ = h.Close()
		if c, ok := b.(io.Closer); ok {
			_ = c.Close()
		}
		return err
	}
	sy.SetConntrack(conntrack.Cleaner{Table: ct, Faults: k.faults})
	k.list = append(k.list, &node{name: n.Config.Name, ns: n.NS, backend: b, tracker: tr, syncer: sy, health: h, conntrack: ct})
	first := sy.Synced()
	k.syncers.Add(1)
	go func() {
		defer k.syncers.Done()
		_ = sy.Run(syncCtx)
	}()
	select {
	case <-first:
	case <-time.After(settleTimeout):
		_, _, last := sy.Stats()
		return fmt.Errorf("node %s: the first sync did not complete within %s: %v", n.Config.Name, settleTimeout, last)
	}
	return nil
}

// newBackend opens the run's mode's backend in a node's namespace, with
// the scenario's proxy settings and the injected faults.
func (k *kpsimProxies) newBackend(n *netns.Node) (dataplane.Backend, error) {
	s := k.s
	px := s.l.Scenario.Proxy
	affinity := "recent"
	if s.ipset {
		affinity = "ipset"
	}
	var serviceCIDRs []netip.Prefix
	if p, err := netip.ParsePrefix(s.l.Scenario.Cluster.ServiceCIDR); err == nil {
		serviceCIDRs = []netip.Prefix{p}
	}
	return backends.New(s.o.Mode, n.NS,
		dataplane.NodeConfig{NodeName: n.Config.Name, ClusterCIDR: k.podCIDR, ServiceCIDRs: serviceCIDRs,
			NodeIPs: []netip.Addr{n.Config.Addr.Addr()}, MasqueradeAll: px.MasqueradeAll, Faults: k.faults},
		backends.Options{IPTablesVariant: k.variant, Affinity: iptables.AffinityMode(affinity), Layout: nftables.Layout(s.layout),
			NFTTimeout: s.o.NFTTimeout, Scheduler: px.IPVSScheduler, NodeIPs: []netip.Addr{n.Config.Addr.Addr()}})
}

func (k *kpsimProxies) node(name string) *node {
	for _, n := range k.list {
		if n.name == name {
			return n
		}
	}
	return nil
}

func (k *kpsimProxies) counters(name string) []dataplane.Counter {
	n := k.node(name)
	if n == nil {
		return nil
	}
	cs, err := n.backend.Counters()
	if err != nil {
		return nil
	}
	return cs
}

func (k *kpsimProxies) apply(ctx context.Context, step apiserver.Step) (map[string]time.Duration, error) {
	before := map[*node]uint64{}
	for _, n := range k.list {
		before[n] = n.tracker.Seq()
	}
	t0 := time.Now()
	writes, err := k.s.m.Cluster.Apply(ctx, step)
	if err != nil {
		return nil, &applyError{err}
	}
	return k.settle(before, writes, t0)
}

// settle waits until every node has programmed the API writes made so far
// (writes events per tracker since before), and returns how long each node
// took from since.
func (k *kpsimProxies) settle(before map[*node]uint64, writes int, since time.Time) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	deadline := time.Now().Add(settleTimeout)
	for _, n := range k.list {
		target := before[n] + uint64(writes)
		for n.tracker.Seq() < target {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("node %s: the API change did not reach its proxy within %s", n.name, settleTimeout)
			}
			time.Sleep(2 * time.Millisecond)
		}
		for {
			applied, at := n.syncer.Applied()
			if applied >= target {
				out[n.name] = at.Sub(since)
				break
			}
			if time.Now().After(deadline) {
				_, _, last := n.syncer.Stats()
				return nil, fmt.Errorf("node %s: rules not programmed within %s (last sync error: %v)", n.name, settleTimeout, last)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return out, nil
}

func (k *kpsimProxies) stop() {
	if k.stopSyncers != nil {
		k.stopSyncers()
	}
	k.syncers.Wait()
}

func (k *kpsimProxies) close() {
	for _, n := range k.list {
		if n.health != nil {
			_ = n.health.Close()
		}
		if n.conntrack != nil {
			_ = n.conntrack.Close()
		}
		// A backend holding sockets in its namespace (IPVS) keeps the
		// namespace alive until they are closed.
		if c, ok := n.backend.(io.Closer); ok {
			_ = c.Close()
		}
	}
}
