package conform

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
)

// KubeProxyCalibration configures CalibrateKubeProxy.
type KubeProxyCalibration struct {
	Mode cluster.Mode
	// Variant is the iptables backend (nft or legacy) in iptables mode.
	Variant   string
	Bin       upstream.Binaries
	Sizes     []int
	Endpoints int
	Runs      int
	// Shape is the Services' shape (calibrate.Shapes; "" is ClusterIP).
	Shape string
	Log   io.Writer
}

// Calibration layout: one node namespace per run (a fresh kube-proxy in a
// fresh namespace each time), the control plane beside them, the
// Services' addresses inside calibServiceCIDR clear of the range's first
// address (default/kubernetes), the endpoints where calibrate.Synthetic
// puts ours.
var (
	calibServiceCIDR = calibrate.ServiceCIDR
	calibPodCIDR     = calibrate.PodCIDR
	calibCP          = netip.MustParsePrefix("198.18.255.254/16")
)

// calibTimeout bounds one settle of a calibration sync (a full iptables-nft
// sync at 5,000 Services takes minutes here).
const calibTimeout = 15 * time.Minute

// CalibrateKubeProxy measures upstream kube-proxy's sync time at each size
// (o.Sizes x o.Endpoints ClusterIP Services, as calibrate.Synthetic builds
// for ours): per size, the objects are written into a fresh API once, then
// each run moves every endpoint to its own node (all local, as ours are to
// the node we measure) and starts a fresh kube-proxy in that fresh node
// namespace; its first
// sync is a full sync at that size (the full-sync histogram's sum, or the
// sync histogram's when the release has no full one), then one endpoint
// turns not ready and the partial sync that follows is read the same way.
// Nothing is read from the rules.
func CalibrateKubeProxy(ctx context.Context, o KubeProxyCalibration) (*calibrate.UpstreamCalibration, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	version, err := o.Bin.Version()
	if err != nil {
		return nil, &EnvironmentError{err}
	}
	t := calibrate.UpstreamTarget{Mode: o.Mode, Variant: o.Variant, Version: version,
		Prepare: func(ctx context.Context, n, k, runs int) (func(context.Context, int) (calibrate.UpstreamSample, error), func(), error) {
			return prepareKubeProxy(ctx, o, n, k, runs)
		}}
	logf := func(format string, a ...any) { fmt.Fprintf(o.Log, format, a...) }
	cal, err := calibrate.RunUpstream(ctx, t, o.Sizes, o.Endpoints, o.Runs, logf)
	if err != nil {
		return nil, err
	}
	cal.Kernel = kernelRelease()
	return cal, nil
}

// calibRun is one size's namespaces, control plane and objects.
type calibRun struct {
	o    KubeProxyCalibration
	topo *netns.Topology
	cp   *upstream.ControlPlane
	dir  string
	// slices are the Services' slices, first the first Service's, whose
	// endpoint changes; their endpoints are on node (every one local to
	// the node measured, as calibrate.Synthetic's are to ours).
	slices []*discoveryv1.EndpointSlice
	first  *discoveryv1.EndpointSlice
	node   string
}

func prepareKubeProxy(ctx context.Context, o KubeProxyCalibration, n, k, runs int) (func(context.Context, int) (calibrate.UpstreamSample, error), func(), error) {
	id, err := netns.NewRunID()
	if err != nil {
		return nil, nil, err
	}
	cfg := &netns.Config{RunID: id, ServiceCIDR: calibServiceCIDR, ControlPlane: calibCP}
	for r := 0; r < runs; r++ {
		pc := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(r), 0}), 24)
		cfg.Nodes = append(cfg.Nodes, netns.NodeConfig{Name: fmt.Sprintf("node-%d", r+1), Addr: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(r + 1)}), 16),
			PodCIDR: pc, Gateway: pc.Addr().Next()})
	}
	topo, err := netns.Build(ctx, cfg)
	if err != nil {
		return nil, nil, &EnvironmentError{fmt.Errorf("could not build the namespaces: %w", err)}
	}
	c := &calibRun{o: o, topo: topo, dir: netns.RunDir(id)}
	if err := c.load(ctx, n, k); err != nil {
		c.done()
		return nil, nil, err
	}
	return c.measure, c.done, nil
}

// load starts the control plane and writes the nodes and n x k objects.
func (c *calibRun) load(ctx context.Context, n, k int) error {
	if err := os.MkdirAll(filepath.Join(c.dir, "cp"), 0o700); err != nil {
		return err
	}
	cp, err := upstream.StartControlPlane(ctx, upstream.ControlPlaneConfig{NS: c.topo.ControlPlane(), Addr: calibCP.Addr(), Dir: filepath.Join(c.dir, "cp"),
		ServiceCIDR: calibServiceCIDR, Bin: c.o.Bin, Log: c.o.Log})
	if err != nil {
		return &EnvironmentError{fmt.Errorf("could not start the control plane: %w", err)}
	}
	c.cp = cp
	cs := cp.Client()
	for _, nd := range c.topo.Nodes() {
		if _, err := upstream.RegisterNode(ctx, cs, nd.Config.Name, nd.Config.Addr.Addr(), nd.Config.PodCIDR); err != nil {
			return err
		}
	}
	svcs, slices, err := calibrate.Objects(n, k, c.o.Shape)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := apiserver.Upsert(ctx, cs, svcs, slices); err != nil {
		return fmt.Errorf("could not load %d services: %w", n, err)
	}
	fmt.Fprintf(c.o.Log, "calibrate: %d services x %d endpoints written in %.1f s\n", n, k, time.Since(start).Seconds())
	c.slices, c.first, c.node = slices, slices[0], "node-1"
	return nil
}

// moveEndpoints puts every endpoint on node, the node of the next run, so
// that each run measures a kube-proxy whose endpoints are all local (in
// nftables mode a local endpoint adds a hairpin-connections element: the
// ruleset of a node without them is much smaller).
func (c *calibRun) moveEndpoints(ctx context.Context, node string) error {
	if c.node == node {
		return nil
	}
	start := time.Now()
	for _, sl := range c.slices {
		for i := range sl.Endpoints {
			sl.Endpoints[i].NodeName = ptr.To(node)
		}
	}
	if _, err := apiserver.Upsert(ctx, c.cp.Client(), nil, c.slices); err != nil {
		return fmt.Errorf("could not move the endpoints to %s: %w", node, err)
	}
	c.node = node
	fmt.Fprintf(c.o.Log, "calibrate: %d slices moved to %s in %.1f s\n", len(c.slices), node, time.Since(start).Seconds())
	return nil
}

// measure starts a fresh kube-proxy on node r+1, reads its first (full)
// sync, turns the first endpoint not ready and reads the partial sync that
// follows; it stops kube-proxy and restores the endpoint.
func (c *calibRun) measure(ctx context.Context, r int) (calibrate.UpstreamSample, error) {
	var m calibrate.UpstreamSample
	nd := c.topo.Nodes()[r]
	if err := c.moveEndpoints(ctx, nd.Config.Name); err != nil {
		return m, err
	}
	d := filepath.Join(c.dir, "kube-proxy-"+nd.Config.Name)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return m, err
	}
	kp, err := upstream.StartKubeProxy(ctx, c.cp, upstream.KubeProxyConfig{Node: nd.Config.Name, NS: nd.NS, NodeIP: nd.Config.Addr.Addr(),
		Mode: c.o.Mode, ClusterCIDR: calibPodCIDR, IPTablesBackend: c.o.Variant, Dir: d})
	if err != nil {
		return m, err
	}
	defer kp.Close()
	// StartKubeProxy returns once the first sync set its timestamp; its
	// duration is observed just after.
	m1, err := scrapeUntil(ctx, kp, func(m upstream.Metrics) bool { return m.Syncs > 0 })
	if err != nil {
		return m, err
	}
	m.Full = firstFull(m1)
	t0 := time.Now()
	if err := c.setFirstReady(ctx, false); err != nil {
		return m, err
	}
	if _, err := kp.Settle(ctx, upstream.Change{Since: t0, Before: &m1, Programmed: 1}, calibTimeout); err != nil {
		return m, fmt.Errorf("the partial sync: %w", err)
	}
	// The programming latency is observed before the sync's duration:
	// wait for the duration too.
	m2, err := scrapeUntil(ctx, kp, func(m2 upstream.Metrics) bool { return m2.Syncs > m1.Syncs })
	if err != nil {
		return m, err
	}
	m.Partial = partialOf(m1, m2)
	_ = kp.Close()
	return m, c.setFirstReady(ctx, true)
}

// firstFull is the first sync's duration: the full-sync histogram's mean
// (one observation after the first sync, unless a second full sync was
// quick to follow), else the sync histogram's.
func firstFull(m upstream.Metrics) float64 {
	if m.FullSyncs > 0 {
		return m.FullSyncSeconds / float64(m.FullSyncs)
	}
	return m.SyncSeconds / float64(max(m.Syncs, 1))
}

// partialOf is the duration of the syncs between two scrapes: the partial
// histogram's delta when the release has it, else the sync histogram's,
// per sync.
func partialOf(a, b upstream.Metrics) float64 {
	if d := b.PartialSyncs - a.PartialSyncs; d > 0 {
		return (b.PartialSyncSeconds - a.PartialSyncSeconds) / float64(d)
	}
	return (b.SyncSeconds - a.SyncSeconds) / float64(max(b.Syncs-a.Syncs, 1))
}

// scrapeUntil scrapes kube-proxy until ok (calibTimeout at most).
func scrapeUntil(ctx context.Context, kp *upstream.KubeProxy, ok func(upstream.Metrics) bool) (upstream.Metrics, error) {
	deadline := time.Now().Add(calibTimeout)
	for {
		m, err := kp.Scrape(ctx)
		if err != nil || ok(m) {
			return m, err
		}
		if time.Now().After(deadline) {
			return m, fmt.Errorf("kube-proxy on %s: no sync observed within %s (log %s)", kp.Node(), calibTimeout, kp.LogPath())
		}
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (c *calibRun) setFirstReady(ctx context.Context, ready bool) error {
	sl := c.first.DeepCopy()
	sl.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready), Terminating: ptr.To(false)}
	_, err := apiserver.Upsert(ctx, c.cp.Client(), nil, []*discoveryv1.EndpointSlice{sl})
	return err
}

func (c *calibRun) done() {
	if c.cp != nil {
		_ = c.cp.Close()
	}
	if c.topo != nil {
		_ = c.topo.Close()
	}
}
