// Command kpsim-cluster brings up the local cluster of harness/cluster
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and nodes
// with containerd, runc, CNI, the kubelet and kube-proxy, all in the run's
// namespaces and cgroup), runs one pod of the local pause image through the
// scheduler and the kubelet, waits until it is Running, optionally holds
// the cluster up, and tears everything down. It is the first proof that a kubelet runs
// pods on this machine kind (issue 32, item 1); root.
//
//	kpsim-cluster --bin bin --nodes node-a [--proxy-mode iptables|nftables|none]
//	    [--agent PATH] [--hold 10m] [--keep-logs DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/harness/cluster"
)

func main() {
	bin := flag.String("bin", "bin", "folder of the binaries (make upstream, make cluster-tools)")
	nodes := flag.String("nodes", "node-a", "comma-separated node names")
	hold := flag.Duration("hold", 0, "keep the cluster up this long after the pod runs (SIGINT ends it early); the admin kubeconfig is printed")
	keepLogs := flag.String("keep-logs", "", "copy every log of the run here before its folder is removed")
	proxyMode := flag.String("proxy-mode", cluster.ProxyIPTables, "kube-proxy's mode on every node: iptables, nftables or none (no kube-proxy)")
	agent := flag.String("agent", "", "the agent binary packed into the echo and prober images (default BIN/kpsim-agent; skipped when missing)")
	flag.Parse()
	abs, err := filepath.Abs(*bin)
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, cluster.Config{Bin: abs, Nodes: strings.Split(*nodes, ","), Log: os.Stderr, KeepLogs: *keepLogs,
		ProxyMode: *proxyMode, Agent: *agent}, *hold))
}

func run(ctx context.Context, cfg cluster.Config, hold time.Duration) (code int) {
	start := time.Now()
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kpsim-cluster: %v\n", err)
		return 1
	}
	defer func() {
		t := time.Now()
		if err := c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "kpsim-cluster: teardown: %v\n", err)
			code = 1
		}
		fmt.Fprintf(os.Stderr, "teardown in %s\n", time.Since(t).Round(time.Millisecond))
	}()
	fmt.Fprintf(os.Stderr, "cluster up in %s\n", time.Since(start).Round(time.Millisecond))
	for _, n := range c.Nodes() {
		t := time.Now()
		if err := runPod(ctx, c, n.Spec.Name); err != nil {
			fmt.Fprintf(os.Stderr, "kpsim-cluster: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "pod on %s Running in %s\n", n.Spec.Name, time.Since(t).Round(time.Millisecond))
	}
	fmt.Fprintf(os.Stderr, "memory (RSS): %s\n", c.Memory())
	if hold > 0 {
		fmt.Fprintf(os.Stderr, "holding for %s: ip netns exec %s kubectl --kubeconfig %s get pods -A -o wide\n",
			hold, c.ControlPlane().Namespace().Name, c.ControlPlane().AdminKubeconfig())
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
	}
	return 0
}

// runPod creates a pod of the pause image for node (through the
// scheduler: a node selector, not nodeName) and waits until it is Running.
func runPod(ctx context.Context, c *cluster.Cluster, node string) error {
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pause-" + node, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeSelector:                 map[string]string{"kubernetes.io/hostname": node},
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{
				Name: "pause", Image: cluster.PauseImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	cs := c.ControlPlane().Client()
	deadline := time.Now().Add(120 * time.Second)
	var err error
	for {
		// The default ServiceAccount appears a moment after the controller
		// manager starts; the admission plugin wants it.
		_, err = cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("could not create pod %s: %w", pod.Name, err)
	}
	var last string
	for {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil {
			last = describe(p)
			if p.Status.Phase == corev1.PodRunning {
				fmt.Fprintf(os.Stderr, "pod %s: %s\n", pod.Name, last)
				return nil
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s not Running within 120 s: %s", pod.Name, last)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func describe(p *corev1.Pod) string {
	s := fmt.Sprintf("phase %s node %q IP %s", p.Status.Phase, p.Spec.NodeName, p.Status.PodIP)
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			s += fmt.Sprintf("; %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			s += fmt.Sprintf("; %s terminated: %s %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.Message)
		case cs.State.Running != nil:
			s += fmt.Sprintf("; %s running since %s", cs.Name, cs.State.Running.StartedAt.Format(time.RFC3339))
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Message != "" {
			s += fmt.Sprintf("; %s: %s", cond.Type, cond.Message)
		}
	}
	return s
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kpsim-cluster: %v\n", err)
	os.Exit(2)
}
