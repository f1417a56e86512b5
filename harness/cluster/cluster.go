package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/upstream"
)

// Addresses of the local cluster.
var (
	controlPlaneAddr = netip.MustParsePrefix("198.18.255.254/16")
	serviceCIDR      = netip.MustParsePrefix("10.96.0.0/16")
	clusterCIDR      = netip.MustParsePrefix("10.244.0.0/16")
)

// Config is what Up starts.
type Config struct {
	// Bin is the folder of every binary (bin/: make upstream and make
	// cluster-tools); the CNI plugins are in Bin/cni.
	Bin string
	// Nodes are the node names (node-a, ...); node i gets 198.18.0.(i+1).
	Nodes []string
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
	Timing []Step
}

// Node is one running node.
type Node struct {
	Spec     NodeSpec
	Files    NodeFiles
	launcher *upstream.Process
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
// its own network and mount namespace, under the run's cgroup, and waits
// until every node is Ready. On error it tears down what it started.
func Up(ctx context.Context, cfg Config) (*Cluster, error) {
	c := &Cluster{cfg: cfg}
	if err := c.up(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Cluster) up(ctx context.Context) error {
	start := time.Now()
	id, err := netns.NewRunID()
	if err != nil {
		return err
	}
	ncfg := &netns.Config{RunID: id, ServiceCIDR: serviceCIDR, ControlPlane: controlPlaneAddr}
	for i, n := range c.cfg.Nodes {
		pod := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
		ncfg.Nodes = append(ncfg.Nodes, netns.NodeConfig{Name: n,
			Addr:    netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(i + 1)}), 16),
			PodCIDR: pod, Gateway: pod.Addr().Next()})
	}
	if c.topo, err = netns.Build(ctx, ncfg); err != nil {
		return fmt.Errorf("could not build the namespaces: %w", err)
	}
	c.dir = netns.RunDir(id)
	c.logf("run %s: namespaces %s*, folder %s", id, netns.RunPrefix(id), c.dir)
	cpDir := filepath.Join(c.dir, "cp")
	if err := os.MkdirAll(cpDir, 0o700); err != nil {
		return err
	}
	bin := upstream.Binaries{Etcd: filepath.Join(c.cfg.Bin, "etcd"), APIServer: filepath.Join(c.cfg.Bin, "kube-apiserver"), KubeProxy: filepath.Join(c.cfg.Bin, "kube-proxy")}
	users := []upstream.User{{Name: "system:kube-controller-manager"}, {Name: "system:kube-scheduler"}}
	for _, n := range c.cfg.Nodes {
		users = append(users, upstream.User{Name: "system:node:" + n, Groups: []string{"system:nodes"}})
	}
	c.step("namespaces", start)
	t := time.Now()
	c.cp, err = upstream.StartControlPlane(ctx, upstream.ControlPlaneConfig{NS: c.topo.ControlPlane(), Addr: controlPlaneAddr.Addr(), Dir: cpDir,
		ServiceCIDR: serviceCIDR, Bin: bin, Log: c.cfg.Log, Users: users, NodeAuthorization: true})
	if err != nil {
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
	pause, err := os.ReadFile(filepath.Join(c.cfg.Bin, "pause"))
	if err != nil {
		return fmt.Errorf("could not read the pause binary: %w", err)
	}
	for i, name := range c.cfg.Nodes {
		n := &Node{
			Spec: NodeSpec{Name: name, IP: ncfg.Nodes[i].Addr.Addr(), CgroupRoot: filepath.Join(c.cg.Path, name, "pods"),
				Bin: c.cfg.Bin, CNIBin: filepath.Join(c.cfg.Bin, "cni")},
			Files: NodeFiles{Dir: filepath.Join(c.dir, name)},
		}
		c.nodes = append(c.nodes, n)
		kc, err := c.cp.UserKubeconfig("system:node:" + name)
		if err != nil {
			return err
		}
		if err := WriteNodeFiles(n.Files, n.Spec, kc); err != nil {
			return err
		}
		if err := WriteImageFile(filepath.Join(n.Files.ImagesDir(), "pause.tar"), Image{Name: PauseImage,
			Files: []ImageFile{{Path: "/pause", Mode: 0o755, Data: pause}}, Entrypoint: []string{"/pause"}}); err != nil {
			return err
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
		if err != nil {
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
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + clusterCIDR.String(),
		"--node-cidr-mask-size=24",
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

// waitNode waits until the node is registered, writes its CNI
// configuration once it has a pod CIDR, and waits until it is Ready.
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
			last = "registered, no pod CIDR yet"
		default:
			if !cniWritten {
				p, err := netip.ParsePrefix(node.Spec.PodCIDR)
				if err != nil {
					return fmt.Errorf("node %s: pod CIDR %q: %w", n.Spec.Name, node.Spec.PodCIDR, err)
				}
				if err := WriteCNIConfig(n.Files, p); err != nil {
					return err
				}
				cniWritten = true
				c.logf("node %s: pod CIDR %s, CNI configuration written", n.Spec.Name, p)
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

// ControlPlane is the running control plane (its admin client).
func (c *Cluster) ControlPlane() *upstream.ControlPlane { return c.cp }

// Dir is the run's folder.
func (c *Cluster) Dir() string { return c.dir }

// Nodes are the running nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Cgroup is the run's cgroup.
func (c *Cluster) Cgroup() *netns.RunCgroup { return c.cg }

// Close stops the nodes (SIGTERM to each launcher's process group, then
// SIGKILL to whatever is left in the run's cgroup: shims and containers
// left their process groups), removes the run's cgroups, stops the
// controllers and the control plane and removes the namespaces and the
// run's folder. Safe after a failed Up.
func (c *Cluster) Close() error {
	var errs []error
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
