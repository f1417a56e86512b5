package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/upstream"
	simcluster "github.com/kpsim/kpsim/sim/cluster"
)

// Addresses of the local cluster.
var (
	controlPlaneAddr = netip.MustParsePrefix("198.18.255.254/16")
	serviceCIDR      = netip.MustParsePrefix("10.96.0.0/16")
	clusterCIDR      = netip.MustParsePrefix("10.244.0.0/16")
)

// Node proxies for Config.ProxyMode.
const (
	// ProxyIPTables and ProxyNFTables run the unmodified kube-proxy
	// (Bin/kube-proxy) in that mode on every node.
	ProxyIPTables = "iptables"
	ProxyNFTables = "nftables"
	// ProxyNone runs no kube-proxy: the nodes are left to a user's own
	// node proxy.
	ProxyNone = "none"
)

// ProxyModes are the values Config.ProxyMode takes ("" is iptables).
var ProxyModes = []string{ProxyIPTables, ProxyNFTables, ProxyNone}

// AgentName is the agent's binary in bin/ (harness/agent/cmd/kpsim-agent),
// which EchoImage and ProberImage pack.
const AgentName = "kpsim-agent"

// Config is what Up starts.
type Config struct {
	// Bin is the folder of every binary (bin/: make upstream and make
	// cluster-tools); the CNI plugins are in Bin/cni.
	Bin string
	// Nodes are the node names (node-a, ...); node i gets 198.18.0.(i+1)
	// and the pod CIDR 10.244.i.0/24.
	Nodes []string
	// RunID names the run (netns.NewRunID); "" draws one.
	RunID string
	// ProxyMode is the node proxy: ProxyIPTables ("" too), ProxyNFTables
	// or ProxyNone.
	ProxyMode string
	// NodeProxy, when set, runs in kube-proxy's place on every node, with
	// kube-proxy's command line after it (upstream.KubeProxyConfig.Command):
	// kpsim's dataplane is ["/path/sim", "proxy", "--own-netns", "--fault=..."].
	NodeProxy []string
	// Agent is the agent binary packed into EchoImage and ProberImage on
	// every node; "" is Bin/kpsim-agent. When the file does not exist the
	// images are skipped (a log line says so).
	Agent string
	// Log gets progress lines.
	Log io.Writer
	// KeepLogs, when set, is a folder Close copies every *.log of the run's
	// folder into (the folder itself is removed), for a look afterwards.
	KeepLogs string
}

// Cluster is a running local cluster.
type Cluster struct {
	cfg    Config
	topo   *netns.Topology
	dir    string
	cp     *upstream.ControlPlane
	kcm    *upstream.Process
	sched  *upstream.Process
	cg     *netns.RunCgroup
	nodes  []*Node
	agent  bool // the agent's images were imported
	Timing []Step
}

// Node is one running node.
type Node struct {
	Spec  NodeSpec
	Files NodeFiles
	// PodCIDR is the node's pod CIDR, which the harness gives it (the
	// Node's spec.podCIDR, its CNI range, the routes of the other nodes
	// and of the control plane).
	PodCIDR  netip.Prefix
	launcher *upstream.Process
	proxy    *upstream.KubeProxy
}

// Step is one measured step of Up.
type Step struct {
	Name string
	Took time.Duration
}

func (c *Cluster) logf(format string, args ...any) {
	if c.cfg.Log != nil {
		fmt.Fprintf(c.cfg.Log, format+"\n", args...)
	}
}

func (c *Cluster) step(name string, start time.Time) {
	d := time.Since(start)
	c.Timing = append(c.Timing, Step{name, d})
	c.logf("%s in %s", name, d.Round(time.Millisecond))
}

// Up builds the run's namespaces, starts etcd, kube-apiserver (Node and
// RBAC authorization), kube-controller-manager and kube-scheduler in the
// control-plane namespace, and each node (containerd, the kubelet, CNI) in
// its own network and mount namespace, under the run's cgroup; gives each
// registered node its pod CIDR; waits until every node is Ready; then
// starts kube-proxy on every node (unless ProxyMode is none) and waits for
// its first sync. On error it tears down what it started.
func Up(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg}
	if err := c.up(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// maxNodes bounds the nodes: node i's pod CIDR is 10.244.i.0/24 and its
// address 198.18.0.(i+1).
const maxNodes = 200

func (cfg *Config) validate() error {
	if cfg.ProxyMode == "" {
		cfg.ProxyMode = ProxyIPTables
	}
	switch {
	case !slices.Contains(ProxyModes, cfg.ProxyMode):
		return fmt.Errorf("could not start the cluster: proxy mode %q is none of %s", cfg.ProxyMode, strings.Join(ProxyModes, ", "))
	case len(cfg.Nodes) == 0:
		return errors.New("could not start the cluster: no node")
	case len(cfg.Nodes) > maxNodes:
		return fmt.Errorf("could not start the cluster: %d nodes, at most %d", len(cfg.Nodes), maxNodes)
	case cfg.RunID != "" && !netns.ValidRunID(cfg.RunID):
		return fmt.Errorf("could not start the cluster: run ID %q is not 6 lower-case hex characters", cfg.RunID)
	}
	if cfg.Agent == "" {
		cfg.Agent = filepath.Join(cfg.Bin, AgentName)
	}
	return nil
}

// PodCIDR is the pod CIDR the harness gives node i (0-based) of a run:
// 10.244.i.0/24, inside the cluster CIDR 10.244.0.0/16.
func PodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}

// ClusterCIDR is kube-proxy's --cluster-cidr, which every PodCIDR is in.
func ClusterCIDR() netip.Prefix { return clusterCIDR }

func (c *Cluster) up(ctx context.Context) error {
	start := time.Now()
	id := c.cfg.RunID
	if id == "" {
		var err error
		if id, err = netns.NewRunID(); err != nil {
			return err
		}
	}
	ncfg, err := c.buildNamespaces(ctx, id)
	if err != nil {
		return err
	}
	c.step("namespaces", start)
	t := time.Now()
	cpDir := filepath.Join(c.dir, "cp")
	if err := c.startControlPlane(ctx, cpDir); err != nil {
		return err
	}
	c.step("etcd and kube-apiserver", t)
	t = time.Now()
	if err := c.startControllers(cpDir); err != nil {
		return err
	}
	c.step("kube-controller-manager and kube-scheduler started", t)

	t = time.Now()
	if c.cg, err = netns.NewRunCgroup(id); err != nil {
		return err
	}
	c.logf("run cgroup %s in %d hierarchies", c.cg.Path, len(c.cg.Hierarchies))
	images, err := c.images()
	if err != nil {
		return err
	}
	for i := range c.cfg.Nodes {
		if err := c.launchNode(ncfg.Nodes[i], images); err != nil {
			return err
		}
	}
	c.step("nodes launched", t)
	t = time.Now()
	for _, n := range c.nodes {
		if err := c.waitNode(ctx, n, 120*time.Second); err != nil {
			return err
		}
	}
	c.step("nodes Ready", t)
	if c.cfg.ProxyMode == ProxyNone {
		c.logf("proxy mode none: no kube-proxy on the nodes")
		return nil
	}
	// The nodes keep the kernel's ICMP rate limits, as a user's cluster
	// does: sim conform --kubeconfig paces its rejects under them
	// (--reject-interval).
	t = time.Now()
	if err := c.startKubeProxies(ctx); err != nil {
		return err
	}
	c.step("kube-proxy ("+c.cfg.ProxyMode+") synced on every node", t)
	return nil
}

// buildNamespaces builds run id's namespaces (the control plane and a node
// namespace per node, each with its address and pod CIDR) and the control
// plane's routes to the pods, and returns their configuration.
func (c *Cluster) buildNamespaces(ctx context.Context, id string) (*netns.Config, error) {
	ncfg := &netns.Config{RunID: id, ServiceCIDR: serviceCIDR, ControlPlane: controlPlaneAddr}
	for i, n := range c.cfg.Nodes {
		pod := PodCIDR(i)
		ncfg.Nodes = append(ncfg.Nodes, netns.NodeConfig{Name: n,
			Addr:    netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(i + 1)}), 16),
			PodCIDR: pod, Gateway: pod.Addr().Next()})
	}
	var err error
	if c.topo, err = netns.Build(ctx, ncfg); err != nil {
		return nil, fmt.Errorf("could not build the namespaces: %w", err)
	}
	c.dir = netns.RunDir(id)
	c.logf("run %s: namespaces %s*, folder %s", id, netns.RunPrefix(id), c.dir)
	if err := c.controlPlanePodRoutes(ncfg); err != nil {
		return nil, err
	}
	return ncfg, nil
}

// startControlPlane starts etcd and kube-apiserver in the control-plane
// namespace, with Node and RBAC authorization and a token user for the
// controller manager, the scheduler and each node's kubelet.
func (c *Cluster) startControlPlane(ctx context.Context, cpDir string) error {
	if err := os.MkdirAll(cpDir, 0o700); err != nil {
		return err
	}
	bin := upstream.Binaries{Etcd: filepath.Join(c.cfg.Bin, "etcd"), APIServer: filepath.Join(c.cfg.Bin, "kube-apiserver"), KubeProxy: filepath.Join(c.cfg.Bin, "kube-proxy")}
	users := []upstream.User{{Name: "system:kube-controller-manager"}, {Name: "system:kube-scheduler"}}
	for _, n := range c.cfg.Nodes {
		users = append(users, upstream.User{Name: "system:node:" + n, Groups: []string{"system:nodes"}})
	}
	var err error
	c.cp, err = upstream.StartControlPlane(ctx, upstream.ControlPlaneConfig{NS: c.topo.ControlPlane(), Addr: controlPlaneAddr.Addr(), Dir: cpDir,
		ServiceCIDR: serviceCIDR, Bin: bin, Log: c.cfg.Log, Users: users, NodeAuthorization: true})
	return err
}

// launchNode writes a node's files and image archives, makes its cgroups
// and starts its launcher (containerd and the kubelet) in its namespace.
func (c *Cluster) launchNode(nc netns.NodeConfig, images map[string][]byte) error {
	name := nc.Name
	n := &Node{
		Spec: NodeSpec{Name: name, IP: nc.Addr.Addr(), CgroupRoot: filepath.Join(c.cg.Path, name, "pods"),
			Bin: c.cfg.Bin, CNIBin: filepath.Join(c.cfg.Bin, "cni")},
		Files:   NodeFiles{Dir: filepath.Join(c.dir, name)},
		PodCIDR: nc.PodCIDR,
	}
	c.nodes = append(c.nodes, n)
	kc, err := c.cp.UserKubeconfig("system:node:" + name)
	if err != nil {
		return err
	}
	if err := WriteNodeFiles(n.Files, n.Spec, kc); err != nil {
		return err
	}
	for file, data := range images {
		if err := os.WriteFile(filepath.Join(n.Files.ImagesDir(), file), data, 0o644); err != nil {
			return fmt.Errorf("could not write node %s's image archive: %w", name, err)
		}
	}
	for _, sub := range []string{filepath.Join(name, "daemons"), filepath.Join(name, "pods")} {
		if err := c.cg.Mkdir(sub); err != nil {
			return err
		}
	}
	nodeNS, ok := c.topo.Node(name)
	if !ok {
		return fmt.Errorf("no namespace for node %s", name)
	}
	n.launcher, err = upstream.StartProcess(nodeNS.NS, n.Files.Dir, "launcher", LauncherArgs(),
		LauncherEnv(n.Files, n.Spec, c.cg.ProcsFiles(filepath.Join(name, "daemons")))...)
	return err
}

// images are the OCI archives every node imports, by file name: the pause
// image, and the agent's echo and prober images when the agent's binary
// exists.
func (c *Cluster) images() (map[string][]byte, error) {
	pause, err := os.ReadFile(filepath.Join(c.cfg.Bin, "pause"))
	if err != nil {
		return nil, fmt.Errorf("could not read the pause binary: %w", err)
	}
	imgs := map[string]Image{"pause.tar": {Name: PauseImage,
		Files: []ImageFile{{Path: "/pause", Mode: 0o755, Data: pause}}, Entrypoint: []string{"/pause"}}}
	agent, err := os.ReadFile(c.cfg.Agent)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.logf("no agent at %s: the images %s and %s are not imported", c.cfg.Agent, EchoImage, ProberImage)
	case err != nil:
		return nil, fmt.Errorf("could not read the agent binary: %w", err)
	default:
		maps.Copy(imgs, AgentImages(agent))
		c.agent = true
		c.logf("agent %s (%d bytes): images %s and %s", c.cfg.Agent, len(agent), EchoImage, ProberImage)
	}
	out := map[string][]byte{}
	for file, img := range imgs {
		var b bytes.Buffer
		if err := WriteImage(&b, img); err != nil {
			return nil, err
		}
		out[file] = b.Bytes()
	}
	return out, nil
}

// controlPlanePodRoutes routes each node's pod CIDR via the node's address
// in the control-plane namespace, as a CNI's routes would on a real
// control-plane host: kube-apiserver reaches pods (the pods/proxy
// subresource, webhooks), and answers pods that call it through the
// kubernetes Service without masquerading. Equivalent to
// `ip route add 10.244.i.0/24 via 198.18.0.(i+1)` there.
func (c *Cluster) controlPlanePodRoutes(ncfg *netns.Config) error {
	cp := c.topo.ControlPlane()
	h, err := cp.Netlink()
	if err != nil {
		return err
	}
	for _, n := range ncfg.Nodes {
		gw := n.Addr.Addr()
		r := &netlink.Route{Dst: &net.IPNet{IP: net.IP(n.PodCIDR.Masked().Addr().AsSlice()), Mask: net.CIDRMask(n.PodCIDR.Bits(), 32)},
			Gw: net.IP(gw.AsSlice())}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("could not route pod CIDR %s via %s in %s: %w", n.PodCIDR, gw, cp.Name, err)
		}
	}
	return nil
}

// startKubeProxies starts the unmodified kube-proxy on every node at once
// (inside the node's network namespace and its mount namespace, so it
// shares /run and the xtables lock with the kubelet), each with the node's
// name and address and the cluster CIDR, and waits for every first sync.
func (c *Cluster) startKubeProxies(ctx context.Context) error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		nodeNS, _ := c.topo.Node(n.Spec.Name)
		dir := filepath.Join(n.Files.Dir, "kube-proxy")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		wg.Go(func() {
			n.proxy, errs[i] = upstream.StartKubeProxy(ctx, c.cp, upstream.KubeProxyConfig{
				Node: n.Spec.Name, NS: nodeNS.NS, NodeIP: n.Spec.IP, Mode: simcluster.Mode(c.cfg.ProxyMode),
				ClusterCIDR: clusterCIDR, Dir: dir, Command: c.cfg.NodeProxy,
				MountNS: fmt.Sprintf("/proc/%d/ns/mnt", n.launcher.Pid()),
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, n := range c.nodes {
		c.logf("node %s: kube-proxy %s (%s), log %s", n.Spec.Name, n.proxy.Version(), c.cfg.ProxyMode, n.proxy.LogPath())
	}
	return nil
}

func (c *Cluster) startControllers(cpDir string) error {
	write := func(user, file string) (string, error) {
		kc, err := c.cp.UserKubeconfig(user)
		if err != nil {
			return "", err
		}
		p := filepath.Join(cpDir, file)
		return p, os.WriteFile(p, []byte(kc), 0o600)
	}
	kcmKC, err := write("system:kube-controller-manager", "kube-controller-manager.kubeconfig")
	if err != nil {
		return err
	}
	schedKC, err := write("system:kube-scheduler", "kube-scheduler.kubeconfig")
	if err != nil {
		return err
	}
	addr := controlPlaneAddr.Addr().String()
	c.kcm, err = upstream.StartProcess(c.topo.ControlPlane(), cpDir, "kube-controller-manager", []string{
		filepath.Join(c.cfg.Bin, "kube-controller-manager"),
		"--kubeconfig=" + kcmKC,
		"--authentication-kubeconfig=" + kcmKC,
		"--authorization-kubeconfig=" + kcmKC,
		"--bind-address=" + addr,
		"--cert-dir=" + filepath.Join(cpDir, "kcm-certs"),
		// Its default, /usr/libexec/kubernetes/..., is created on the host
		// when missing (seen in the first run): keep it in the run.
		"--flex-volume-plugin-dir=" + filepath.Join(cpDir, "flexvolume"),
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + c.cp.ServiceAccountKeyFile(),
		"--root-ca-file=" + c.cp.CAFile(),
		// The harness gives each node its pod CIDR (waitNode), the one the
		// topology routes to it: no node IPAM here.
		"--allocate-node-cidrs=false",
		"--service-cluster-ip-range=" + serviceCIDR.String(),
		"--v=2",
	})
	if err != nil {
		return err
	}
	c.sched, err = upstream.StartProcess(c.topo.ControlPlane(), cpDir, "kube-scheduler", []string{
		filepath.Join(c.cfg.Bin, "kube-scheduler"),
		"--kubeconfig=" + schedKC,
		"--authentication-kubeconfig=" + schedKC,
		"--authorization-kubeconfig=" + schedKC,
		"--bind-address=" + addr,
		"--cert-dir=" + filepath.Join(cpDir, "scheduler-certs"),
		"--leader-elect=false",
		"--v=2",
	})
	return err
}

// waitNode waits until the node is registered, gives it its pod CIDR
// (spec.podCIDR and podCIDRs, which nothing else sets: the controller
// manager allocates none), writes its CNI configuration, and waits until it
// is Ready.
func (c *Cluster) waitNode(ctx context.Context, n *Node, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cniWritten := false
	var last string
	for {
		if n.launcher.Exited() {
			return fmt.Errorf("node %s: %w", n.Spec.Name, n.launcher.ExitError())
		}
		node, err := c.cp.Client().CoreV1().Nodes().Get(ctx, n.Spec.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			last = "not registered: " + err.Error()
		case node.Spec.PodCIDR == "":
			if err := c.setPodCIDR(ctx, n); err != nil {
				return err
			}
			last = "registered, pod CIDR being set"
			continue
		case !podCIDRsAre(node, n.PodCIDR):
			return fmt.Errorf("node %s has pod CIDRs %q, not %s, which the run's routes lead to it (something else allocates node CIDRs)",
				n.Spec.Name, node.Spec.PodCIDRs, n.PodCIDR)
		default:
			if !cniWritten {
				if err := WriteCNIConfig(n.Files, n.PodCIDR); err != nil {
					return err
				}
				cniWritten = true
				c.logf("node %s: pod CIDR %s, CNI configuration written", n.Spec.Name, n.PodCIDR)
			}
			last = "not Ready"
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					if cond.Status == corev1.ConditionTrue {
						c.logf("node %s Ready", n.Spec.Name)
						return nil
					}
					last = fmt.Sprintf("Ready=%s: %s: %s", cond.Status, cond.Reason, cond.Message)
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s was not Ready within %s: %s (logs: %s)", n.Spec.Name, timeout, last, n.Files.Dir)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// setPodCIDR sets the registered node's spec.podCIDR and podCIDRs to the
// topology's pod CIDR (a merge patch of the spec only, by the admin: the
// kubelet may not change its own, and the fields can be set once).
func (c *Cluster) setPodCIDR(ctx context.Context, n *Node) error {
	patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, n.PodCIDR, n.PodCIDR)
	_, err := c.cp.Client().CoreV1().Nodes().Patch(ctx, n.Spec.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("could not set node %s's pod CIDR to %s: %w", n.Spec.Name, n.PodCIDR, err)
	}
	return nil
}

// podCIDRsAre reports whether the node's pod CIDRs are exactly p.
func podCIDRsAre(node *corev1.Node, p netip.Prefix) bool {
	return node.Spec.PodCIDR == p.String() && len(node.Spec.PodCIDRs) == 1 && node.Spec.PodCIDRs[0] == p.String()
}

// RunID is the run's ID (its names start with kpsim-<id>-).
func (c *Cluster) RunID() string { return c.topo.RunID() }

// ProxyMode is the node proxy the cluster runs (ProxyIPTables,
// ProxyNFTables or ProxyNone).
func (c *Cluster) ProxyMode() string { return c.cfg.ProxyMode }

// AgentImages reports whether EchoImage and ProberImage were imported on
// the nodes.
func (c *Cluster) AgentImages() bool { return c.agent }

// ControlPlane is the running control plane (its admin client).
func (c *Cluster) ControlPlane() *upstream.ControlPlane { return c.cp }

// Dir is the run's folder.
func (c *Cluster) Dir() string { return c.dir }

// Nodes are the running nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Cgroup is the run's cgroup.
func (c *Cluster) Cgroup() *netns.RunCgroup { return c.cg }

// Close stops the kube-proxies, then the nodes (SIGTERM to each launcher's
// process group, then SIGKILL to whatever is left in the run's cgroup:
// shims and containers left their process groups), removes the run's
// cgroups, stops the controllers and the control plane and removes the
// namespaces and the run's folder. Safe after a failed Up.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.nodes {
		if n.proxy != nil {
			errs = append(errs, n.proxy.Close())
		}
	}
	for _, n := range c.nodes {
		errs = append(errs, n.launcher.Stop())
	}
	if c.cg != nil {
		if err := c.cg.Kill(30 * time.Second); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, c.cg.Remove())
		}
	}
	errs = append(errs, c.sched.Stop(), c.kcm.Stop())
	if c.cp != nil {
		errs = append(errs, c.cp.Close())
	}
	if c.cfg.KeepLogs != "" && c.dir != "" {
		errs = append(errs, copyLogs(c.dir, c.cfg.KeepLogs))
	}
	if c.topo != nil {
		errs = append(errs, c.topo.Close())
	}
	return errors.Join(errs...)
}

// newToken16 is 16 random bytes in hex: a machine ID.
func newToken16() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("could not draw a machine ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// copyLogs copies every *.log file under dir (the containers' logs under
// var-log included; containerd's and the kubelet's state under var-lib
// skipped) to the same relative path under to.
func copyLogs(dir, to string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && d.Name() == "var-lib" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".log") || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	})
}
