package differential

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/backends"
	"github.com/kpsim/kpsim/dataplane/conntrack"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Node is one compared node: the Node object both proxies read.
type Node struct {
	Name string
	// IP is its InternalIP, the upstream node namespace's fabric address
	// (kube-proxy binds its metrics there and lists it in nodeport-ips).
	IP netip.Addr
	// Labels of the Node object (the zone label decides topology hints).
	Labels map[string]string
}

// Config is one comparison environment: a control plane, and per compared
// node an upstream kube-proxy and our backend.
type Config struct {
	Mode  cluster.Mode
	Nodes []Node
	// NodeNetwork is the fabric prefix the node IPs are in (zero: their
	// /16). The control plane and our scratch namespaces take free
	// addresses from its top.
	NodeNetwork netip.Prefix
	// ClusterCIDR is kube-proxy's --cluster-cidr and our ClusterCIDR.
	ClusterCIDR netip.Prefix
	// ServiceCIDR is the apiserver's --service-cluster-ip-range.
	ServiceCIDR   netip.Prefix
	MasqueradeAll bool
	Bin           upstream.Binaries
	// Dir is the run folder (empty: netns.RunDir of the run, which the
	// topology's Close removes).
	Dir string
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// SettleTimeout bounds each wait for either side (0: 60 s).
	SettleTimeout time.Duration
	// MinSyncPeriod is kube-proxy's --iptables-min-sync-period (which
	// nftables mode reads too); 0 syncs on every change, as the comparison
	// wants (kube-proxy's default is 1 s).
	MinSyncPeriod time.Duration
	// SyncPeriod is kube-proxy's --iptables-sync-period and our iptables
	// backend's StaleChainPeriod (0: both defaults, 30 s): in large-cluster
	// mode both delete stale chains at most once per period, so a period
	// longer than the run keeps them (the comparison's large regime).
	SyncPeriod time.Duration
	// Ballast, when above 0, is the number of endpoints of a ballast
	// Service (BallastNamespace) written before either proxy starts, so that
	// both first syncs, and every later one, are in iptables mode's
	// large-cluster mode; 0: none.
	Ballast int
	// Rounds makes RunBatch write each step in rounds that change no
	// Service's rules twice, settling after each (see rounds): iptables
	// mode's large-cluster mode keeps a stale chain with the rules it was
	// last written with, which kube-proxy (a sync per event) and ours (a
	// sync per Write) would otherwise take from different states.
	Rounds bool
	// Seed, when set, writes the initial objects (Node objects included)
	// once the apiserver is ready and before either proxy starts, so that
	// both first syncs hold them; nil: Start writes the compared Nodes.
	Seed func(ctx context.Context, c kubernetes.Interface) error
}

// pair is one compared node's two sides.
type pair struct {
	node    Node
	upNS    *netns.Namespace
	kp      *upstream.KubeProxy
	oursNS  *netns.Namespace
	oursIP  netip.Addr
	health  *dataplane.HealthServer
	backend dataplane.Backend
	tracker *cluster.Tracker
	syncer  *dataplane.Syncer
	// upCT and oursCT are the two sides' conntrack tables (conntrack.go).
	upCT, oursCT *conntrack.NamespaceTable
}

// Env is a running comparison environment. Its methods are not safe for
// concurrent use.
type Env struct {
	cfg     Config
	dir     string
	topo    *netns.Topology
	cp      *upstream.ControlPlane
	api     *apiserver.Cluster
	pairs   []*pair
	version string
	markers int
}

// Start builds the namespaces (a control plane, per node an upstream and a
// scratch namespace), starts etcd and kube-apiserver, writes the Node
// objects, starts one kube-proxy per node and our backend beside it, and
// syncs both once. On error everything started is stopped.
func Start(ctx context.Context, cfg Config) (_ *Env, err error) {
	if cfg.Mode != cluster.ModeIPTables && cfg.Mode != cluster.ModeNFTables {
		return nil, fmt.Errorf("could not start a comparison in %s mode: only iptables and nftables", cfg.Mode)
	}
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("could not start a comparison: no node")
	}
	if cfg.SettleTimeout == 0 {
		cfg.SettleTimeout = 60 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	e := &Env{cfg: cfg, dir: cfg.Dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close())
		}
	}()
	t0 := time.Now()
	if err := e.build(ctx); err != nil {
		return nil, err
	}
	held, err := e.holdZones(ctx)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	if err := e.startUpstream(ctx); err != nil {
		return nil, err
	}
	if err := e.releaseZones(ctx, held); err != nil {
		return nil, err
	}
	t2 := time.Now()
	if err := e.startOurs(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.cfg.Log, "differential: run %s started in %s (namespaces and control plane %s, kube-proxy %s, ours %s)\n",
		e.topo.RunID(), time.Since(t0).Round(time.Millisecond), t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), time.Since(t2).Round(time.Millisecond))
	return e, nil
}

// build creates the topology and starts the control plane.
func (e *Env) build(ctx context.Context) error {
	tc, cpAddr, err := topologyConfig(e.cfg)
	if err != nil {
		return err
	}
	if e.topo, err = netns.Build(ctx, tc); err != nil {
		return fmt.Errorf("could not build the comparison's namespaces: %w", err)
	}
	if e.dir == "" {
		e.dir = netns.RunDir(tc.RunID)
	}
	if err := os.MkdirAll(e.dir, 0o700); err != nil {
		return fmt.Errorf("could not create the run folder: %w", err)
	}
	for i, n := range e.cfg.Nodes {
		up, ok1 := e.topo.Node(upstreamNodeName(i))
		ours, ok2 := e.topo.Node(oursNodeName(i))
		if !ok1 || !ok2 {
			return fmt.Errorf("could not find the namespaces of node %s", n.Name)
		}
		e.pairs = append(e.pairs, &pair{node: n, upNS: up.NS, oursNS: ours.NS, oursIP: ours.Config.Addr.Addr()})
	}
	fmt.Fprintf(e.cfg.Log, "differential: run %s, %d node(s), %s mode; starting the control plane\n", e.topo.RunID(), len(e.pairs), e.cfg.Mode)
	dir, err := subdir(e.dir, "control-plane")
	if err != nil {
		return err
	}
	e.cp, err = upstream.StartControlPlane(ctx, upstream.ControlPlaneConfig{
		NS: e.topo.ControlPlane(), Addr: cpAddr.Addr(), Dir: dir,
		ServiceCIDR: e.cfg.ServiceCIDR, Bin: e.cfg.Bin, Log: e.cfg.Log,
	})
	if err != nil {
		return fmt.Errorf("could not start the control plane: %w", err)
	}
	if e.cfg.Seed != nil {
		err = e.cfg.Seed(ctx, e.cp.Client())
	} else {
		err = e.writeNodes(ctx)
	}
	if err != nil || e.cfg.Ballast == 0 {
		return err
	}
	return writeBallast(ctx, e.cp.Client(), e.cfg)
}

// holdZones removes the zone label from the compared nodes' Node objects
// before kube-proxy starts, and returns the labels it removed (by node).
// kube-proxy learns its node's zone from a handler of its own on the node
// informer, apart from the Service and EndpointSlice watches the settle
// markers prove: its first syncs may come before that handler ran (under
// load they did: a comparison of topology hints saw kube-proxy use every
// endpoint). releaseZones puts the labels back once kube-proxy runs, when
// the change is sure to reach it as a topology change, and waits for the
// full sync it makes.
func (e *Env) holdZones(ctx context.Context) (map[string]string, error) {
	held := map[string]string{}
	nodes := e.cp.Client().CoreV1().Nodes()
	for _, p := range e.pairs {
		n, err := nodes.Get(ctx, p.node.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("could not read Node %s: %w", p.node.Name, err)
		}
		z, ok := n.Labels[corev1.LabelTopologyZone]
		if !ok {
			continue
		}
		delete(n.Labels, corev1.LabelTopologyZone)
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("could not hold the zone of Node %s: %w", p.node.Name, err)
		}
		held[p.node.Name] = z
	}
	return held, nil
}

// releaseZones gives the held zone labels back and waits, for each node,
// until its kube-proxy made the full sync its topology change calls for
// (OnTopologyChange), SettleTimeout at most.
func (e *Env) releaseZones(ctx context.Context, held map[string]string) error {
	nodes := e.cp.Client().CoreV1().Nodes()
	for _, p := range e.pairs {
		z, ok := held[p.node.Name]
		if !ok {
			continue
		}
		before, err := p.kp.Scrape(ctx)
		if err != nil {
			return err
		}
		n, err := nodes.Get(ctx, p.node.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("could not read Node %s: %w", p.node.Name, err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[corev1.LabelTopologyZone] = z
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("could not give Node %s its zone back: %w", p.node.Name, err)
		}
		deadline := time.Now().Add(e.cfg.SettleTimeout)
		for {
			m, err := p.kp.Scrape(ctx)
			if err != nil {
				return err
			}
			if m.FullSyncs > before.FullSyncs {
				fmt.Fprintf(e.cfg.Log, "differential: kube-proxy on %s made its full sync for zone %s\n", p.node.Name, z)
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube-proxy on %s made no full sync within %s of its zone label (%s) coming back (log %s)", p.node.Name, e.cfg.SettleTimeout, z, p.kp.LogPath())
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

// subdir creates dir/name.
func subdir(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(p, 0o700); err != nil {
		return "", fmt.Errorf("could not create %s: %w", p, err)
	}
	return p, nil
}

// topology node names: upstream's namespace of compared node i and ours.
func upstreamNodeName(i int) string { return fmt.Sprintf("up%d", i) }
func oursNodeName(i int) string     { return fmt.Sprintf("ours%d", i) }

// topologyConfig places the compared nodes' two namespaces and the control
// plane on one fabric: upstream's at the node IP, ours and the control
// plane at free addresses from the top of the node network (ours never
// needs its address: its rules come from the API's Node object). Pod blocks
// are /24s of 100.64.0.0/16 (no endpoint lives there: no traffic is sent).
func topologyConfig(cfg Config) (*netns.Config, netip.Prefix, error) {
	id, err := netns.NewRunID()
	if err != nil {
		return nil, netip.Prefix{}, err
	}
	nn := cfg.NodeNetwork
	if !nn.IsValid() {
		nn = netip.PrefixFrom(cfg.Nodes[0].IP, 16).Masked()
	}
	used := map[netip.Addr]bool{}
	for _, n := range cfg.Nodes {
		if !nn.Contains(n.IP) {
			return nil, netip.Prefix{}, fmt.Errorf("could not place node %s: its IP %s is outside the node network %s", n.Name, n.IP, nn)
		}
		used[n.IP] = true
	}
	next := lastHost(nn)
	free := func() (netip.Prefix, error) {
		for used[next] && nn.Contains(next) {
			next = next.Prev()
		}
		if !nn.Contains(next) || next == nn.Masked().Addr() {
			return netip.Prefix{}, fmt.Errorf("could not place the comparison: node network %s is full", nn)
		}
		used[next] = true
		return netip.PrefixFrom(next, nn.Bits()), nil
	}
	tc := &netns.Config{RunID: id, ServiceCIDR: cfg.ServiceCIDR}
	for i, n := range cfg.Nodes {
		ours, err := free()
		if err != nil {
			return nil, netip.Prefix{}, err
		}
		for j, a := range []netip.Prefix{netip.PrefixFrom(n.IP, nn.Bits()), ours} {
			pc := netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64, byte(2*i + j), 0}), 24)
			name := upstreamNodeName(i)
			if j == 1 {
				name = oursNodeName(i)
			}
			tc.Nodes = append(tc.Nodes, netns.NodeConfig{Name: name, Addr: a, PodCIDR: pc, Gateway: pc.Addr().Next()})
		}
	}
	cp, err := free()
	if err != nil {
		return nil, netip.Prefix{}, err
	}
	tc.ControlPlane = cp
	return tc, cp, nil
}

// lastHost is the highest address of p below its broadcast address.
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := be32(a) | (1<<(32-p.Bits()) - 1)
	return from32(v - 1)
}

// writeNodes creates (or updates) the compared nodes' Node objects with
// their labels and InternalIP (through the status subresource).
func (e *Env) writeNodes(ctx context.Context) error {
	c := e.cp.Client()
	for _, p := range e.pairs {
		if err := WriteNode(ctx, c, p.node); err != nil {
			return err
		}
	}
	return nil
}

// WriteNode creates or updates a Node object with n's labels, then sets its
// InternalIP through the status subresource (kube-proxy finds its node IP
// there).
func WriteNode(ctx context.Context, c kubernetes.Interface, n Node) error {
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
	cur, err := c.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		if cur, err = c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err == nil {
			cur.Labels = n.Labels
			cur, err = c.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("could not write Node %s: %w", n.Name, err)
	}
	cur.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP.String()}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("could not set the InternalIP of Node %s: %w", n.Name, err)
	}
	return nil
}

// startUpstream starts one kube-proxy per compared node.
func (e *Env) startUpstream(ctx context.Context) error {
	for _, p := range e.pairs {
		dir, err := subdir(e.dir, "kube-proxy-"+netns.Label(p.node.Name))
		if err != nil {
			return err
		}
		// --iptables-min-sync-period=0 is passed explicitly: the
		// config's zero leaves kube-proxy's default.
		kp, err := upstream.StartKubeProxy(ctx, e.cp, upstream.KubeProxyConfig{
			Node: p.node.Name, NS: p.upNS, NodeIP: p.node.IP, Mode: e.cfg.Mode,
			ClusterCIDR: e.cfg.ClusterCIDR, MasqueradeAll: e.cfg.MasqueradeAll, SyncPeriod: e.cfg.SyncPeriod,
			Dir: dir, ExtraArgs: []string{"--iptables-min-sync-period=" + e.cfg.MinSyncPeriod.String()},
		})
		if err != nil {
			return fmt.Errorf("could not start kube-proxy for node %s: %w", p.node.Name, err)
		}
		p.kp = kp
		e.version = kp.Version()
	}
	return nil
}

// NodeConfig is our backend's configuration for compared node n: the
// upstream node's name (so the same endpoints are local), the same cluster
// CIDR and masquerade settings, the inputs kube-proxy reads from the API
// besides Services and slices (the service CIDR of the ServiceCIDR object
// the apiserver creates from its --service-cluster-ip-range, and the node
// IP of the Node object, which nftables mode's default
// --nodeport-addresses=primary accepts node ports on), and kube-proxy
// v1.37's feature gates (PreferSameTrafficDistribution is GA and locked
// on).
func (e *Env) NodeConfig(n Node) dataplane.NodeConfig {
	c := dataplane.NodeConfig{
		NodeName: n.Name, ClusterCIDR: e.cfg.ClusterCIDR, MasqueradeAll: e.cfg.MasqueradeAll,
		NodeIPs: []netip.Addr{n.IP}, PreferSameNode: true,
	}
	if e.cfg.ServiceCIDR.IsValid() {
		c.ServiceCIDRs = []netip.Prefix{e.cfg.ServiceCIDR}
	}
	return c
}

// startOurs connects our informers to the apiserver and builds, per node,
// a tracker, our backend in the scratch namespace and a syncer; then syncs
// once (full).
func (e *Env) startOurs(ctx context.Context) error {
	var err error
	if e.api, err = apiserver.Connect(e.cp.Client()); err != nil {
		return fmt.Errorf("could not connect our informers: %w", err)
	}
	if err := e.api.Start(ctx, e.cfg.SettleTimeout); err != nil {
		return fmt.Errorf("could not start our informers: %w", err)
	}
	if err := e.openConntrack(); err != nil {
		return err
	}
	for _, p := range e.pairs {
		if p.tracker, err = e.api.AddTrackerSynced(ctx, e.cfg.SettleTimeout); err != nil {
			return err
		}
		o := backends.Options{StaleChainPeriod: e.cfg.SyncPeriod}
		if p.backend, err = backends.New(e.cfg.Mode, p.oursNS, e.NodeConfig(p.node), o); err != nil {
			return fmt.Errorf("could not build our %s backend for node %s: %w", e.cfg.Mode, p.node.Name, err)
		}
		p.syncer = dataplane.NewSyncer(dataplane.SyncConfig{}, p.backend, p.tracker, nil)
		// kube-proxy's health servers beside our rules, on our scratch
		// namespace's address, answering as upstream's do on its node's
		// (compared by Compare).
		if p.health, err = backends.NewHealth(e.cfg.Mode, p.oursNS, e.NodeConfig(p.node), p.oursIP, time.Hour); err != nil {
			return fmt.Errorf("could not start our health servers for node %s: %w", p.node.Name, err)
		}
		p.syncer.SetHealth(p.health)
		p.syncer.SetConntrack(conntrack.Cleaner{Table: p.oursCT})
		if err := p.syncer.SyncOnce(); err != nil {
			return fmt.Errorf("could not sync our backend for node %s: %w", p.node.Name, err)
		}
	}
	return nil
}

// Client is the admin client of the environment's apiserver.
func (e *Env) Client() kubernetes.Interface { return e.cp.Client() }

// Version is the upstream kube-proxy's version.
func (e *Env) Version() string { return e.version }

// RunID is the run's ID (its namespaces start with netns.RunPrefix of it).
func (e *Env) RunID() string { return e.topo.RunID() }

// EnsureNamespaces creates the Kubernetes namespaces that do not exist.
func (e *Env) EnsureNamespaces(ctx context.Context, names ...string) error {
	for _, n := range names {
		_, err := e.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("could not create namespace %s: %w", n, err)
		}
	}
	return nil
}

// Write plants the API's flows in both sides' conntrack tables
// (plantFlows), applies one batch of writes through the one writer
// (apiserver.Upsert and DeleteObjects), waits until both sides have
// programmed it (Settle), and in nftables mode lets both delete the chains
// the batch flushed (settleStale).
func (e *Env) Write(ctx context.Context, svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, delSvcs, delSlices []types.NamespacedName) error {
	if err := e.plantFlows(ctx); err != nil {
		return err
	}
	if err := e.write(ctx, writeSet{svcs: svcs, slices: slices, delSvc: delSvcs, delSl: delSlices}); err != nil {
		return err
	}
	return e.settleStale(ctx)
}

// write applies w (upserts, then deletions) and settles both sides.
func (e *Env) write(ctx context.Context, w writeSet) error {
	before := e.seqs()
	n, err := apiserver.Upsert(ctx, e.Client(), w.svcs, w.slices)
	if err != nil {
		return err
	}
	d, err := apiserver.DeleteObjects(ctx, e.Client(), w.delSvc, w.delSl)
	if err != nil {
		return err
	}
	return e.Settle(ctx, before, n+d)
}

// StaleChainWait is how long, in nftables mode, the comparison waits after
// a batch settled before both sides sync once more: kube-proxy flushes a
// chain it no longer uses and deletes it in the first sync that starts more
// than a second after the flush (pkg/proxy/nftables/proxier.go,
// syncProxyRules, staleChains); ours does the same by its own clock. How
// many of a batch's flushed chains are already gone when it settles
// depends on when each side synced; one sync started more than a second
// after the last flush leaves neither side any.
const StaleChainWait = 1100 * time.Millisecond

// settleStale, in nftables mode, waits StaleChainWait and settles once more
// with no write of its own (Settle's markers program no rule): each side
// then syncs at least once after the wait. Other modes: nothing.
func (e *Env) settleStale(ctx context.Context) error {
	if e.cfg.Mode != cluster.ModeNFTables {
		return nil
	}
	select {
	case <-time.After(StaleChainWait):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := e.Settle(ctx, e.seqs(), 0); err != nil {
		return fmt.Errorf("could not settle the deletion of stale chains: %w", err)
	}
	return nil
}

func (e *Env) seqs() []uint64 {
	out := make([]uint64, len(e.pairs))
	for i, p := range e.pairs {
		out[i] = p.tracker.Seq()
	}
	return out
}

// markerName is the EndpointSlice Settle writes last: it belongs to no
// Service, so neither proxy programs anything for it.
const markerName = "kpsim-differential-marker"

// Settle waits until both sides have programmed writes that produced
// `events` informer events after trackers stood at before (from seqs):
//
//  1. our trackers have received those events (each Service or slice write
//     and each deletion is one event; the generator never writes an
//     unchanged object, and every slice write carries a new trigger time);
//  2. since := now; one more write, the marker slice (no Service), whose
//     event reaches kube-proxy after every earlier slice event of its
//     watch and after the Service events our informers had already seen;
//  3. our trackers have the marker too: each syncer syncs once (partial,
//     or full when a Node changed, as kube-proxy would);
//  4. each kube-proxy completes a sync that started after it queued a
//     change received after since (settleUpstream, upstream's Settle:
//     kube-proxy's own metrics, never the rules under test).
func (e *Env) Settle(ctx context.Context, before []uint64, events int) error {
	if err := e.waitSeqs(ctx, before, uint64(events)); err != nil {
		return err
	}
	for _, p := range e.pairs {
		if err := p.syncer.SyncOnce(); err != nil {
			return fmt.Errorf("our sync of node %s failed: %w", p.node.Name, err)
		}
	}
	for _, p := range e.pairs {
		n, err := e.settleUpstream(ctx, p)
		events += n
		if err != nil {
			return fmt.Errorf("kube-proxy of node %s did not settle: %w; the end of its log:\n%s", p.node.Name, err, logTail(p.kp.LogPath(), 30))
		}
	}
	// Our trackers receive the markers too (no change for a proxy); wait
	// for them so that the next step counts only its own events.
	return e.waitSeqs(ctx, before, uint64(events))
}

// settleUpstream waits until kube-proxy has programmed every change it
// received before the markers, and returns the markers it wrote. kube-proxy
// watches Services and EndpointSlices separately, and under load one watch
// can lag the other: a sync proven after a slice marker can miss a Service
// write that our informers had already seen (the differential showed it as
// kube-proxy "behind" on Service updates, load-balancer status included,
// with both modes compared at once). So it settles twice, once per watch:
// a marker Service (a port that changes each time, no endpoints: both sides
// program the same REJECT for it), then the marker slice. Each is a
// scrape, since := now, the marker, then upstream's Settle with a Nudge
// that writes another (kube-proxy queues the marker after every earlier
// change of that watch; with --iptables-min-sync-period=0 it syncs once per
// change and its periodic sync is hourly, so the sync that proves the
// marker programmed may have to be asked for).
func (e *Env) settleUpstream(ctx context.Context, p *pair) (int, error) {
	written := 0
	for _, write := range []func(context.Context) error{e.writeServiceMarker, e.writeMarker} {
		before, err := p.kp.Scrape(ctx)
		if err != nil {
			return written, err
		}
		since := time.Now()
		marker := func(ctx context.Context) error {
			if err := write(ctx); err != nil {
				return err
			}
			written++
			return nil
		}
		if err := marker(ctx); err != nil {
			return written, err
		}
		if _, err := p.kp.Settle(ctx, upstream.Change{Since: since, Before: &before, Nudge: marker}, e.cfg.SettleTimeout); err != nil {
			return written, err
		}
	}
	return written, nil
}

// serviceMarkerName is the Service settleUpstream writes: no selector, no
// slice, one port whose number changes with every write.
const serviceMarkerName = "kpsim-differential-service-marker"

// writeServiceMarker writes the marker Service with a new port.
func (e *Env) writeServiceMarker(ctx context.Context) error {
	e.markers++
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: serviceMarkerName},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "marker", Protocol: corev1.ProtocolTCP, Port: int32(e.markers%60000 + 1)}}},
	}
	if _, err := apiserver.Upsert(ctx, e.Client(), []*corev1.Service{svc}, nil); err != nil {
		return fmt.Errorf("could not write the settle marker Service: %w", err)
	}
	return nil
}

// writeMarker writes the marker slice with a new port.
func (e *Env) writeMarker(ctx context.Context) error {
	e.markers++
	marker := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: markerName, Labels: map[string]string{
			discoveryv1.LabelServiceName: markerName, discoveryv1.LabelManagedBy: "kpsim-differential"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To(int32(e.markers%60000 + 1))}},
	}
	if _, err := apiserver.Upsert(ctx, e.Client(), nil, []*discoveryv1.EndpointSlice{marker}); err != nil {
		return fmt.Errorf("could not write the settle marker: %w", err)
	}
	return nil
}

// logTail returns the last n lines of a log file (or why not).
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitSeqs waits, bounded by SettleTimeout, until every tracker has received
// n events more than before.
func (e *Env) waitSeqs(ctx context.Context, before []uint64, n uint64) error {
	deadline := time.NewTimer(e.cfg.SettleTimeout)
	defer deadline.Stop()
	for i, p := range e.pairs {
		for p.tracker.Seq() < before[i]+n {
			select {
			case <-p.tracker.Changed():
			case <-time.After(10 * time.Millisecond):
			case <-deadline.C:
				return fmt.Errorf("our informers received %d of %d events within %s", p.tracker.Seq()-before[i], n, e.cfg.SettleTimeout)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// Close stops the proxies and the control plane and removes the
// namespaces (and with them netns.RunDir).
func (e *Env) Close() error {
	var errs []error
	for _, p := range e.pairs {
		if p.kp != nil {
			errs = append(errs, p.kp.Close())
		}
		if p.backend != nil {
			if c, ok := p.backend.(io.Closer); ok {
				errs = append(errs, c.Close())
			}
		}
		if p.health != nil {
			errs = append(errs, p.health.Close())
		}
		for _, t := range []*conntrack.NamespaceTable{p.upCT, p.oursCT} {
			if t != nil {
				errs = append(errs, t.Close())
			}
		}
	}
	if e.api != nil {
		e.api.Stop()
	}
	if e.cp != nil {
		errs = append(errs, e.cp.Close())
	}
	if e.topo != nil {
		errs = append(errs, e.topo.Close())
	}
	return errors.Join(errs...)
}
