package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Topology is a run's set of namespaces and links (see README.md for the
// diagram):
//
//   - a fabric namespace with a bridge that joins the nodes;
//   - per node, a node namespace (where proxy rules go) whose uplink sits on
//     the bridge with the node's address, and routes to every other node's
//     pod CIDR via that node's address, as a CNI installs;
//   - per node, one backend namespace holding every endpoint address of the
//     node as a /32, behind a veth whose node side holds the pod CIDR's .1
//     gateway;
//   - per client pod, a namespace with the pod's address(es) and a default
//     route via its node's gateway.
//
// Nothing is created in the root network namespace: veth pairs are created
// from inside a namespace with their peer placed directly in another.
//
// The accessors (Nodes, Node, Clients, BackendFor, Namespaces) describe the
// built topology: call them after Build has returned.
type Topology struct {
	cfg *Config

	// mu serialises Build, SyncEndpoints and Close.
	mu       sync.Mutex
	stop     chan struct{} // closed by Close to interrupt Build
	stopOnce sync.Once
	built    bool
	closed   bool
	closeErr error

	marker *marker
	all    []*Namespace // creation order
	fabric *Namespace
	cp     *Namespace
	nodes  []*Node
	byName map[string]*Node
	// router and outside are the world outside the cluster (Config.Outside).
	router  *Namespace
	outside []*Client
}

// Node is one node's namespaces, as built.
type Node struct {
	Config NodeConfig
	// NS is the node namespace: proxy rules, ip_forward on.
	NS *Namespace
	// Backends holds every endpoint address of the node.
	Backends *Namespace
	// Clients are the node's client pods.
	Clients []*Client

	index int // 1-based, in the fabric port's name
}

// Client is one client's namespace, as built: a pod, a node's own
// namespace (a host-network client) or a machine outside the cluster.
type Client struct {
	Config ClientConfig
	// Where says which of the three it is.
	Where cluster.Where
	// Node is the name of the node the pod runs on, or whose namespace a
	// host client is; "" for a client outside the cluster.
	Node string
	NS   *Namespace
}

// New validates cfg and returns a topology with nothing created yet: call
// Build. Creating it first lets WithSignalCleanup cover the build itself.
func New(cfg *Config) (*Topology, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Topology{cfg: cfg, stop: make(chan struct{}), byName: map[string]*Node{}}, nil
}

// Build creates a topology from cfg (New then Build). On failure nothing it
// created is left behind.
func Build(ctx context.Context, cfg *Config) (*Topology, error) {
	t, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := t.Build(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// RunID is the topology's run ID.
func (t *Topology) RunID() string { return t.cfg.RunID }

// Config is the configuration the topology was built from.
func (t *Topology) Config() *Config { return t.cfg }

// Fabric is the namespace of the bridge.
func (t *Topology) Fabric() *Namespace { return t.fabric }

// ControlPlane is the control-plane namespace (Config.ControlPlane), nil
// when the config asks for none.
func (t *Topology) ControlPlane() *Namespace { return t.cp }

// Nodes lists the nodes in name order.
func (t *Topology) Nodes() []*Node { return t.nodes }

// Node returns a node by its Kubernetes name.
func (t *Topology) Node(name string) (*Node, bool) {
	n, ok := t.byName[name]
	return n, ok
}

// Clients lists every client pod, node by node.
func (t *Topology) Clients() []*Client {
	var out []*Client
	for _, n := range t.nodes {
		out = append(out, n.Clients...)
	}
	return out
}

// Outside lists the clients outside the cluster (Config.Outside).
func (t *Topology) Outside() []*Client { return t.outside }

// Router is the router namespace (Config.Outside), nil without one.
func (t *Topology) Router() *Namespace { return t.router }

// Hosts lists one host-network client per node: the node's own namespace,
// sending from the node's address.
func (t *Topology) Hosts() []*Client {
	out := make([]*Client, 0, len(t.nodes))
	for _, n := range t.nodes {
		out = append(out, &Client{Config: ClientConfig{Group: "host", Addrs: []netip.Addr{n.Config.Addr.Addr()}}, Where: cluster.OnHost, Node: n.Config.Name, NS: n.NS})
	}
	return out
}

// BackendFor returns the namespace that holds endpoint address a: its
// node's backend namespace, or its own pod namespace (ClientConfig.Endpoint).
func (t *Topology) BackendFor(a netip.Addr) (*Namespace, bool) {
	for _, n := range t.nodes {
		if _, found := slices.BinarySearchFunc(n.Config.Endpoints, a, netip.Addr.Compare); found {
			return n.Backends, true
		}
		for _, c := range n.Clients {
			if c.Config.Endpoint && c.Config.Addrs[0] == a {
				return c.NS, true
			}
		}
	}
	return nil, false
}

// Namespaces lists every namespace of the topology in creation order.
func (t *Topology) Namespaces() []*Namespace { return slices.Clone(t.all) }

// Build creates the namespaces and links. It checks ctx (and Close) between
// steps; when interrupted or failing it removes what it created and returns
// the error. Build runs once.
func (t *Topology) Build(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return errors.New("could not build the topology: it is closed")
	case t.built:
		return errors.New("could not build the topology: it is already built")
	}
	t.built = true
	if hostNSErr != nil {
		return fmt.Errorf("could not open the process's network namespace: %w", hostNSErr)
	}
	check := func() error {
		select {
		case <-ctx.Done():
			return fmt.Errorf("topology build interrupted: %w", context.Cause(ctx))
		case <-t.stop:
			return errors.New("topology build interrupted: the topology was closed")
		default:
			return nil
		}
	}
	if err := t.build(check); err != nil {
		return errors.Join(err, t.teardown())
	}
	return nil
}

func (t *Topology) build(check func() error) error {
	if err := check(); err != nil {
		return err
	}
	// The marker comes first: a namespace of ours never exists without it
	// while the run lives, so a cleanup never takes a live run for dead.
	m, err := acquireMarker(t.cfg.RunID)
	if err != nil {
		return err
	}
	t.marker = m
	id := t.cfg.RunID
	fab, err := t.newNamespace(FabricName(id), RoleFabric)
	if err != nil {
		return err
	}
	t.fabric = fab
	fh, err := fab.Netlink()
	if err != nil {
		return err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeLink(id), Flags: net.FlagUp}}
	if err := fh.LinkAdd(br); err != nil {
		return fmt.Errorf("could not add bridge %s in %s: %w", br.Name, fab.Name, err)
	}
	if err := addAltName(fh, br, RunPrefix(id)+"fabric-br"); err != nil {
		return err
	}
	if t.cfg.ControlPlane.IsValid() {
		if err := t.buildControlPlane(br.Index); err != nil {
			return err
		}
	}
	for i := range t.cfg.Nodes {
		if err := check(); err != nil {
			return err
		}
		n := &Node{Config: t.cfg.Nodes[i], index: i + 1}
		t.nodes = append(t.nodes, n)
		t.byName[n.Config.Name] = n
		if err := t.buildNode(n, br.Index); err != nil {
			return err
		}
		for j := range n.Config.Clients {
			if err := check(); err != nil {
				return err
			}
			if err := t.buildClient(n, j); err != nil {
				return err
			}
		}
	}
	for _, n := range t.nodes {
		if err := check(); err != nil {
			return err
		}
		if err := t.nodeRoutes(n); err != nil {
			return err
		}
	}
	if err := t.controlPlaneRoutes(); err != nil {
		return err
	}
	if t.cfg.Outside != nil {
		if err := check(); err != nil {
			return err
		}
		if err := t.buildOutside(br.Index); err != nil {
			return err
		}
	}
	// Pod namespaces need no netlink socket once built; node namespaces keep
	// theirs for the backends, the router for Route.
	for _, ns := range t.all {
		if ns.Role == RoleBackend || ns.Role == RoleClient || ns.Role == RoleOutside {
			ns.closeNetlink()
		}
	}
	return nil
}

// common sysctls: no IPv6 (scenarios are IPv4; no router solicitations or
// DAD on the bridge), no reverse-path filter (a client's extra source
// addresses and asymmetric paths through DNAT must not be dropped). Keys
// that do not exist on this kernel are skipped when optional.
type sysctl struct {
	key, value string
	optional   bool
}

var (
	commonSysctls = []sysctl{
		{"net/ipv6/conf/all/disable_ipv6", "1", true},
		{"net/ipv6/conf/default/disable_ipv6", "1", true},
		{"net/ipv4/conf/all/rp_filter", "0", false},
		{"net/ipv4/conf/default/rp_filter", "0", false},
	}
	nodeSysctls = []sysctl{
		{"net/ipv4/ip_forward", "1", false},
	}
	// The router spreads a multipath route's connections by their layer-4
	// hash (addresses, protocol and ports), as an ECMP balancer does.
	routerSysctls = []sysctl{
		{"net/ipv4/ip_forward", "1", false},
		{"net/ipv4/fib_multipath_hash_policy", "1", false},
	}
	// With br_netfilter loaded, bridged frames would cross the fabric's
	// (empty) iptables and conntrack; keep the fabric a plain wire.
	fabricSysctls = []sysctl{
		{"net/bridge/bridge-nf-call-iptables", "0", true},
		{"net/bridge/bridge-nf-call-ip6tables", "0", true},
		{"net/bridge/bridge-nf-call-arptables", "0", true},
	}
)

// newNamespace creates a namespace, records it for teardown, applies the
// sysctls of its role and brings lo up.
func (t *Topology) newNamespace(name string, role Role) (*Namespace, error) {
	ns, err := create(name, role)
	if err != nil {
		return nil, err
	}
	t.all = append(t.all, ns)
	sysctls := slices.Clone(commonSysctls)
	switch role {
	case RoleNode:
		sysctls = append(sysctls, nodeSysctls...)
	case RoleRouter:
		sysctls = append(sysctls, routerSysctls...)
	case RoleFabric:
		sysctls = append(sysctls, fabricSysctls...)
	}
	err = ns.Do(func() error {
		for _, s := range sysctls {
			err := os.WriteFile("/proc/sys/"+s.key, []byte(s.value), 0o644)
			if err != nil && !(s.optional && errors.Is(err, os.ErrNotExist)) {
				return fmt.Errorf("could not set %s to %s: %w", s.key, s.value, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	h, err := ns.Netlink()
	if err != nil {
		return nil, err
	}
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("could not bring lo up in %s: %w", name, err)
	}
	return ns, nil
}

func addAltName(h *netlink.Handle, l netlink.Link, alt string) error {
	if err := h.LinkAddAltName(l, alt); err != nil {
		return fmt.Errorf("could not add alternative name %s to link %s: %w", alt, l.Attrs().Name, err)
	}
	return nil
}

// vethPair creates a veth pair from inside a (its end named name, with
// alternative name alt, addresses and up) with its peer created directly in
// b (named peer, alternative name peerAlt, up). The pair never exists in the
// root namespace. It returns the two ends as seen from a and b.
func vethPair(a *Namespace, name, alt string, b *Namespace, peer, peerAlt string) (netlink.Link, netlink.Link, error) {
	ah, err := a.Netlink()
	if err != nil {
		return nil, nil, err
	}
	bh, err := b.Netlink()
	if err != nil {
		return nil, nil, err
	}
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      peer,
		PeerNamespace: netlink.NsFd(b.Handle()),
	}
	if err := ah.LinkAdd(v); err != nil {
		return nil, nil, fmt.Errorf("could not add veth %s (in %s) / %s (in %s): %w", name, a.Name, peer, b.Name, err)
	}
	al, err := ah.LinkByName(name)
	if err != nil {
		return nil, nil, fmt.Errorf("could not find link %s in %s: %w", name, a.Name, err)
	}
	bl, err := bh.LinkByName(peer)
	if err != nil {
		return nil, nil, fmt.Errorf("could not find link %s in %s: %w", peer, b.Name, err)
	}
	if err := addAltName(ah, al, alt); err != nil {
		return nil, nil, err
	}
	if err := addAltName(bh, bl, peerAlt); err != nil {
		return nil, nil, err
	}
	for _, end := range []struct {
		ns   *Namespace
		name string
	}{{a, name}, {b, peer}} {
		if err := end.ns.Sysctl("net/ipv4/neigh/"+end.name+"/unres_qlen_bytes", unresolvedQueue); err != nil {
			return nil, nil, fmt.Errorf("in %s: %w", end.ns.Name, err)
		}
	}
	return al, bl, nil
}

// unresolvedQueue is the bytes of packets a link queues for a neighbour
// still being resolved (the kernel's default is 212,992, a few hundred
// probes). A prober's second sending thread keeps queueing behind the ARP
// exchange the first one started; when that thread is preempted on a busy
// machine the default queue overflows and the probes vanish before any NAT
// decision (seen in CI: 43 of 2,445 probes, arp_cache unresolved_discards
// 43). The per-device value is set because a network namespace other than
// the host's has no neigh/default of its own; the host's is never written.
const unresolvedQueue = "33554432"

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 32)}
}

func addAddr(h *netlink.Handle, ns *Namespace, l netlink.Link, p netip.Prefix) error {
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(p)}); err != nil {
		return fmt.Errorf("could not add address %s to %s in %s: %w", p, l.Attrs().Name, ns.Name, err)
	}
	return nil
}

func setUp(h *netlink.Handle, ns *Namespace, l netlink.Link) error {
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("could not bring %s up in %s: %w", l.Attrs().Name, ns.Name, err)
	}
	return nil
}

// linkRoute adds "dst dev l scope link". Equivalent to
// `ip route add dst dev l scope link`.
func linkRoute(h *netlink.Handle, ns *Namespace, l netlink.Link, dst netip.Prefix) error {
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(dst), Scope: netlink.SCOPE_LINK}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("could not add route %s dev %s in %s: %w", dst, l.Attrs().Name, ns.Name, err)
	}
	return nil
}

// viaRoute adds "dst via gw dev l" (dst invalid: the default route).
func viaRoute(h *netlink.Handle, ns *Namespace, l netlink.Link, dst netip.Prefix, gw, src netip.Addr) error {
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(gw.AsSlice())}
	if dst.IsValid() {
		r.Dst = ipNet(dst)
	}
	if src.IsValid() {
		r.Src = net.IP(src.AsSlice())
	}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("could not add route %v via %s dev %s in %s: %w", dst, gw, l.Attrs().Name, ns.Name, err)
	}
	return nil
}

func (t *Topology) buildNode(n *Node, bridgeIndex int) error {
	id, c := t.cfg.RunID, n.Config
	label := Label(c.Name)
	ns, err := t.newNamespace(NodeName(id, c.Name), RoleNode)
	if err != nil {
		return err
	}
	n.NS = ns
	nh, _ := ns.Netlink()
	fh, _ := t.fabric.Netlink()
	up, port, err := vethPair(ns, uplinkLink(id), RunPrefix(id)+label+"-eth0",
		t.fabric, fabricPortLink(id, n.index), RunPrefix(id)+"fabric-"+label)
	if err != nil {
		return err
	}
	if err := fh.LinkSetMasterByIndex(port, bridgeIndex); err != nil {
		return fmt.Errorf("could not attach %s to the bridge in %s: %w", port.Attrs().Name, t.fabric.Name, err)
	}
	if err := setUp(fh, t.fabric, port); err != nil {
		return err
	}
	if err := addAddr(nh, ns, up, c.Addr); err != nil {
		return err
	}
	if err := setUp(nh, ns, up); err != nil {
		return err
	}
	if sc := t.cfg.ServiceCIDR; sc.IsValid() {
		if err := linkRoute(nh, ns, up, sc); err != nil {
			return err
		}
	}

	be, err := t.newNamespace(BackendName(id, c.Name), RoleBackend)
	if err != nil {
		return err
	}
	n.Backends = be
	bh, _ := be.Netlink()
	gwLink, eth, err := vethPair(ns, backendPortLink(id), RunPrefix(id)+label+"-be",
		be, podLink(id), RunPrefix(id)+label+"_be-eth0")
	if err != nil {
		return err
	}
	if err := addAddr(nh, ns, gwLink, netip.PrefixFrom(c.Gateway, 32)); err != nil {
		return err
	}
	if err := setUp(nh, ns, gwLink); err != nil {
		return err
	}
	for _, a := range c.Endpoints {
		if err := addAddr(bh, be, eth, netip.PrefixFrom(a, 32)); err != nil {
			return err
		}
	}
	if err := setUp(bh, be, eth); err != nil {
		return err
	}
	if err := podRoutes(bh, be, eth, c.Gateway, netip.Addr{}); err != nil {
		return err
	}
	for _, a := range c.Endpoints {
		if err := linkRoute(nh, ns, gwLink, netip.PrefixFrom(a, 32)); err != nil {
			return err
		}
	}
	return nil
}

// podRoutes gives a pod namespace "gw dev eth scope link" and
// "default via gw dev eth [src src]", as the ptp CNI plugin does: pod
// addresses are /32s, so every packet goes through the node.
func podRoutes(h *netlink.Handle, ns *Namespace, eth netlink.Link, gw, src netip.Addr) error {
	if err := linkRoute(h, ns, eth, netip.PrefixFrom(gw, 32)); err != nil {
		return err
	}
	return viaRoute(h, ns, eth, netip.Prefix{}, gw, src)
}

func (t *Topology) buildClient(n *Node, j int) error {
	id, c := t.cfg.RunID, n.Config.Clients[j]
	name := ClientName(id, n.Config.Name, c.Group, c.Index)
	ns, err := t.newNamespace(name, RoleClient)
	if err != nil {
		return err
	}
	cl := &Client{Config: c, Where: cluster.InPod, Node: n.Config.Name, NS: ns}
	n.Clients = append(n.Clients, cl)
	rest := name[len(RunPrefix(id)):]
	nl, eth, err := vethPair(n.NS, clientPortLink(id, j), RunPrefix(id)+rest+"-port",
		ns, podLink(id), RunPrefix(id)+rest+"-eth0")
	if err != nil {
		return err
	}
	nh, _ := n.NS.Netlink()
	ch, _ := ns.Netlink()
	for _, a := range c.Addrs {
		if err := addAddr(ch, ns, eth, netip.PrefixFrom(a, 32)); err != nil {
			return err
		}
	}
	if err := setUp(ch, ns, eth); err != nil {
		return err
	}
	if err := podRoutes(ch, ns, eth, n.Config.Gateway, c.Addrs[0]); err != nil {
		return err
	}
	// The node side holds the gateway, as the ptp CNI plugin gives it to
	// every pod's link: a connection masqueraded toward the pod (hairpin)
	// leaves from it.
	if err := addAddr(nh, n.NS, nl, netip.PrefixFrom(n.Config.Gateway, 32)); err != nil {
		return err
	}
	if err := setUp(nh, n.NS, nl); err != nil {
		return err
	}
	for _, a := range c.Addrs {
		if err := linkRoute(nh, n.NS, nl, netip.PrefixFrom(a, 32)); err != nil {
			return err
		}
	}
	return nil
}

// buildControlPlane creates the control-plane namespace with its uplink
// (fabric port f0, the nodes have f1...) on the bridge, addressed
// Config.ControlPlane.
func (t *Topology) buildControlPlane(bridgeIndex int) error {
	id := t.cfg.RunID
	ns, err := t.newNamespace(ControlPlaneName(id), RoleControlPlane)
	if err != nil {
		return err
	}
	t.cp = ns
	up, port, err := vethPair(ns, uplinkLink(id), RunPrefix(id)+"cp-eth0",
		t.fabric, fabricPortLink(id, 0), RunPrefix(id)+"fabric-cp")
	if err != nil {
		return err
	}
	fh, _ := t.fabric.Netlink()
	if err := fh.LinkSetMasterByIndex(port, bridgeIndex); err != nil {
		return fmt.Errorf("could not attach %s to the bridge in %s: %w", port.Attrs().Name, t.fabric.Name, err)
	}
	if err := setUp(fh, t.fabric, port); err != nil {
		return err
	}
	h, _ := ns.Netlink()
	if err := addAddr(h, ns, up, t.cfg.ControlPlane); err != nil {
		return err
	}
	return setUp(h, ns, up)
}

// controlPlaneRoutes adds /32 link routes between the control plane and
// each node whose address lies outside the other's prefix (either way).
func (t *Topology) controlPlaneRoutes() error {
	if t.cp == nil {
		return nil
	}
	id, cp := t.cfg.RunID, t.cfg.ControlPlane
	ch, _ := t.cp.Netlink()
	cup, err := ch.LinkByName(uplinkLink(id))
	if err != nil {
		return fmt.Errorf("could not find the uplink in %s: %w", t.cp.Name, err)
	}
	for _, n := range t.nodes {
		naddr := n.Config.Addr
		if !cp.Masked().Contains(naddr.Addr()) {
			if err := linkRoute(ch, t.cp, cup, netip.PrefixFrom(naddr.Addr(), 32)); err != nil {
				return err
			}
		}
		if naddr.Masked().Contains(cp.Addr()) {
			continue
		}
		nh, err := n.NS.Netlink()
		if err != nil {
			return err
		}
		nup, err := nh.LinkByName(uplinkLink(id))
		if err != nil {
			return fmt.Errorf("could not find the uplink in %s: %w", n.NS.Name, err)
		}
		if err := linkRoute(nh, n.NS, nup, netip.PrefixFrom(cp.Addr(), 32)); err != nil {
			return err
		}
	}
	return nil
}

// nodeRoutes gives node n a route to every other node's pod CIDR via that
// node's address, as a CNI does, plus /32 routes to the other nodes'
// endpoints outside their pod CIDR, and a link route to any other node
// address outside n's own node network.
func (t *Topology) nodeRoutes(n *Node) error {
	h, err := n.NS.Netlink()
	if err != nil {
		return err
	}
	up, err := h.LinkByName(uplinkLink(t.cfg.RunID))
	if err != nil {
		return fmt.Errorf("could not find the uplink in %s: %w", n.NS.Name, err)
	}
	own := n.Config.Addr.Masked()
	for _, o := range t.nodes {
		if o == n {
			continue
		}
		oip := o.Config.Addr.Addr()
		if !own.Contains(oip) {
			if err := linkRoute(h, n.NS, up, netip.PrefixFrom(oip, 32)); err != nil {
				return err
			}
		}
		if err := viaRoute(h, n.NS, up, o.Config.PodCIDR, oip, netip.Addr{}); err != nil {
			return err
		}
		for _, a := range o.Config.Endpoints {
			if !o.Config.PodCIDR.Contains(a) {
				if err := viaRoute(h, n.NS, up, netip.PrefixFrom(a, 32), oip, netip.Addr{}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// buildOutside creates the router (fabric port after the nodes'), every
// outside client behind it, and each node's default route via the router.
func (t *Topology) buildOutside(bridgeIndex int) error {
	id, o := t.cfg.RunID, t.cfg.Outside
	r, err := t.newNamespace(RouterName(id), RoleRouter)
	if err != nil {
		return err
	}
	t.router = r
	up, port, err := vethPair(r, uplinkLink(id), RunPrefix(id)+"router-eth0",
		t.fabric, fabricPortLink(id, len(t.nodes)+1), RunPrefix(id)+"fabric-router")
	if err != nil {
		return err
	}
	fh, _ := t.fabric.Netlink()
	if err := fh.LinkSetMasterByIndex(port, bridgeIndex); err != nil {
		return fmt.Errorf("could not attach %s to the bridge in %s: %w", port.Attrs().Name, t.fabric.Name, err)
	}
	if err := setUp(fh, t.fabric, port); err != nil {
		return err
	}
	rh, _ := r.Netlink()
	if err := addAddr(rh, r, up, o.Router); err != nil {
		return err
	}
	if err := setUp(rh, r, up); err != nil {
		return err
	}
	for _, n := range t.nodes {
		if !o.Router.Masked().Contains(n.Config.Addr.Addr()) {
			if err := linkRoute(rh, r, up, netip.PrefixFrom(n.Config.Addr.Addr(), 32)); err != nil {
				return err
			}
		}
	}
	for j, c := range o.Clients {
		if err := t.buildOutsideClient(r, j, c); err != nil {
			return err
		}
	}
	for _, n := range t.nodes {
		h, err := n.NS.Netlink()
		if err != nil {
			return err
		}
		nup, err := h.LinkByName(uplinkLink(id))
		if err != nil {
			return fmt.Errorf("could not find the uplink in %s: %w", n.NS.Name, err)
		}
		if !n.Config.Addr.Masked().Contains(o.Router.Addr()) {
			if err := linkRoute(h, n.NS, nup, netip.PrefixFrom(o.Router.Addr(), 32)); err != nil {
				return err
			}
		}
		if err := viaRoute(h, n.NS, nup, netip.Prefix{}, o.Router.Addr(), netip.Addr{}); err != nil {
			return err
		}
	}
	return nil
}

// buildOutsideClient creates outside client j: its addresses as /32s, a
// link to the router (whose side holds the gateway) and a default route
// via it, the router's /32 routes back.
func (t *Topology) buildOutsideClient(r *Namespace, j int, c ClientConfig) error {
	id, o := t.cfg.RunID, t.cfg.Outside
	name := OutsideName(id, c.Group, c.Index)
	ns, err := t.newNamespace(name, RoleOutside)
	if err != nil {
		return err
	}
	t.outside = append(t.outside, &Client{Config: c, Where: cluster.Outside, NS: ns})
	rest := name[len(RunPrefix(id)):]
	rl, eth, err := vethPair(r, outsidePortLink(id, j), RunPrefix(id)+rest+"-port",
		ns, podLink(id), RunPrefix(id)+rest+"-eth0")
	if err != nil {
		return err
	}
	rh, _ := r.Netlink()
	ch, _ := ns.Netlink()
	for _, a := range c.Addrs {
		if err := addAddr(ch, ns, eth, netip.PrefixFrom(a, 32)); err != nil {
			return err
		}
	}
	if err := setUp(ch, ns, eth); err != nil {
		return err
	}
	if err := podRoutes(ch, ns, eth, o.Gateway, c.Addrs[0]); err != nil {
		return err
	}
	if err := addAddr(rh, r, rl, netip.PrefixFrom(o.Gateway, 32)); err != nil {
		return err
	}
	if err := setUp(rh, r, rl); err != nil {
		return err
	}
	for _, a := range c.Addrs {
		if err := linkRoute(rh, r, rl, netip.PrefixFrom(a, 32)); err != nil {
			return err
		}
	}
	return nil
}

// Route makes the router send dst to the nodes at the given addresses: one
// next hop, or a multipath route whose connections the router spreads by
// their layer-4 hash, as an ECMP load balancer does (MetalLB's BGP mode,
// a cloud balancer in front of the nodes). No address removes the route.
// Equivalent to `ip route replace dst nexthop via a1 nexthop via a2 ...` in
// the router namespace.
func (t *Topology) Route(dst netip.Prefix, via []netip.Addr) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.router == nil || t.closed {
		return errors.New("could not route: the topology has no router")
	}
	h, err := t.router.Netlink()
	if err != nil {
		return err
	}
	up, err := h.LinkByName(uplinkLink(t.cfg.RunID))
	if err != nil {
		return fmt.Errorf("could not find the uplink in %s: %w", t.router.Name, err)
	}
	r := &netlink.Route{Dst: ipNet(dst)}
	if len(via) == 0 {
		if err := h.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("could not delete the route to %s in %s: %w", dst, t.router.Name, err)
		}
		return nil
	}
	if len(via) == 1 {
		r.LinkIndex, r.Gw = up.Attrs().Index, net.IP(via[0].AsSlice())
	} else {
		for _, a := range via {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{LinkIndex: up.Attrs().Index, Gw: net.IP(a.AsSlice()), Hops: 0})
		}
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("could not route %s via %v in %s: %w", dst, via, t.router.Name, err)
	}
	return nil
}

// SyncEndpoints makes the backend namespaces hold exactly the endpoint
// addresses given per node name (a node the map does not name holds none;
// harness/topology.Endpoints places a cluster state's), adding and removing
// /32 addresses and their routes, for Services that scale during a run. It
// refuses an unknown node and addresses that clash with a node, gateway or
// client address.
func (t *Topology) SyncEndpoints(endpoints map[string][]netip.Addr) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.fabric == nil {
		return errors.New("could not sync endpoints: the topology is not built")
	}
	want := &Config{RunID: t.cfg.RunID}
	for _, n := range t.nodes {
		c := n.Config
		c.Endpoints = slices.Clone(endpoints[c.Name])
		slices.SortFunc(c.Endpoints, netip.Addr.Compare)
		want.Nodes = append(want.Nodes, c)
	}
	for name := range endpoints {
		if _, ok := t.byName[name]; !ok {
			return fmt.Errorf("could not sync endpoints: the topology has no node %s", name)
		}
	}
	if err := want.Validate(); err != nil {
		return fmt.Errorf("could not sync endpoints: %w", err)
	}
	for i, n := range t.nodes {
		add, del := diffAddrs(n.Config.Endpoints, want.Nodes[i].Endpoints)
		if err := t.moveEndpoints(n, add, del); err != nil {
			return err
		}
		n.Config.Endpoints = want.Nodes[i].Endpoints
		t.cfg.Nodes[i].Endpoints = want.Nodes[i].Endpoints
	}
	return nil
}

func diffAddrs(have, want []netip.Addr) (add, del []netip.Addr) {
	for _, a := range want {
		if _, ok := slices.BinarySearchFunc(have, a, netip.Addr.Compare); !ok {
			add = append(add, a)
		}
	}
	for _, a := range have {
		if _, ok := slices.BinarySearchFunc(want, a, netip.Addr.Compare); !ok {
			del = append(del, a)
		}
	}
	return add, del
}

func (t *Topology) moveEndpoints(n *Node, add, del []netip.Addr) error {
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	id := t.cfg.RunID
	bh, err := n.Backends.Netlink()
	if err != nil {
		return err
	}
	defer n.Backends.closeNetlink()
	nh, err := n.NS.Netlink()
	if err != nil {
		return err
	}
	eth, err := bh.LinkByName(podLink(id))
	if err != nil {
		return fmt.Errorf("could not find %s in %s: %w", podLink(id), n.Backends.Name, err)
	}
	gwLink, err := nh.LinkByName(backendPortLink(id))
	if err != nil {
		return fmt.Errorf("could not find %s in %s: %w", backendPortLink(id), n.NS.Name, err)
	}
	outside := func(a netip.Addr) bool { return !n.Config.PodCIDR.Contains(a) }
	for _, a := range del {
		p := netip.PrefixFrom(a, 32)
		r := &netlink.Route{LinkIndex: gwLink.Attrs().Index, Dst: ipNet(p), Scope: netlink.SCOPE_LINK}
		if err := nh.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("could not delete route %s in %s: %w", p, n.NS.Name, err)
		}
		if err := bh.AddrDel(eth, &netlink.Addr{IPNet: ipNet(p)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("could not delete address %s in %s: %w", p, n.Backends.Name, err)
		}
		if outside(a) {
			if err := t.otherNodeRoutes(n, p, false); err != nil {
				return err
			}
		}
	}
	for _, a := range add {
		p := netip.PrefixFrom(a, 32)
		if err := addAddr(bh, n.Backends, eth, p); err != nil {
			return err
		}
		if err := linkRoute(nh, n.NS, gwLink, p); err != nil {
			return err
		}
		if outside(a) {
			if err := t.otherNodeRoutes(n, p, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// otherNodeRoutes adds (or deletes) "p via n's address" in every other node.
func (t *Topology) otherNodeRoutes(n *Node, p netip.Prefix, add bool) error {
	for _, o := range t.nodes {
		if o == n {
			continue
		}
		h, err := o.NS.Netlink()
		if err != nil {
			return err
		}
		up, err := h.LinkByName(uplinkLink(t.cfg.RunID))
		if err != nil {
			return fmt.Errorf("could not find the uplink in %s: %w", o.NS.Name, err)
		}
		if add {
			if err := viaRoute(h, o.NS, up, p, n.Config.Addr.Addr(), netip.Addr{}); err != nil {
				return err
			}
			continue
		}
		r := &netlink.Route{LinkIndex: up.Attrs().Index, Dst: ipNet(p), Gw: net.IP(n.Config.Addr.Addr().AsSlice())}
		if err := h.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("could not delete route %s in %s: %w", p, o.NS.Name, err)
		}
	}
	return nil
}

// Close removes everything the topology created: its namespaces (and with
// them every link and route in them) and its run marker. It interrupts a
// Build in progress, is safe to call more than once and from several
// goroutines (a signal handler and a deferred call), and returns the first
// call's result.
func (t *Topology) Close() error {
	t.stopOnce.Do(func() { close(t.stop) })
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.closeErr
	}
	t.closed = true
	t.closeErr = t.teardown()
	return t.closeErr
}

// teardown kills any process left inside each namespace and deletes the
// namespaces, pods first and the fabric last, removes RunDir, then releases
// the marker. Callers hold mu.
func (t *Topology) teardown() error {
	var errs []error
	for i := len(t.all) - 1; i >= 0; i-- {
		// A process left inside (a kube-proxy whose Close failed) would
		// keep the namespace alive after its name goes.
		if _, err := killInside(t.all[i].Path()); err != nil {
			errs = append(errs, err)
		}
		if err := t.all[i].Delete(); err != nil {
			errs = append(errs, err)
		}
	}
	t.all = nil
	if err := os.RemoveAll(RunDir(t.cfg.RunID)); err != nil {
		errs = append(errs, fmt.Errorf("could not remove %s: %w", RunDir(t.cfg.RunID), err))
	}
	if len(errs) == 0 {
		// Keep the marker when a namespace could not be removed: the run
		// then looks dead with leftovers, which `sim cleanup` removes.
		if err := t.marker.release(); err != nil {
			errs = append(errs, err)
		}
	} else if t.marker != nil && t.marker.f != nil {
		t.marker.f.Close()
		t.marker.f = nil
	}
	if len(errs) > 0 {
		return fmt.Errorf("could not remove the topology of run %s: %w", t.cfg.RunID, errors.Join(errs...))
	}
	return nil
}
