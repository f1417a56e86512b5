package cluster

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// Memory is the resident memory (VmRSS) of a running cluster's processes
// in kB, by part and program name (/proc/PID/comm).
type Memory struct {
	// ControlPlane: the processes of the control-plane namespace (etcd,
	// kube-apiserver, kube-controller-manager, kube-scheduler).
	ControlPlane map[string]int
	// Nodes: the run's cgroup (launchers, containerd, kubelets, shims,
	// pods).
	Nodes map[string]int
	// KubeProxy: the node proxies (not in the run's cgroup).
	KubeProxy map[string]int
}

// Memory reads the resident memory of the cluster's processes now.
func (c *Cluster) Memory() Memory {
	var cp, proxies []int
	if procs, err := netns.ProcessesIn(c.cp.Namespace().Path()); err == nil {
		for _, p := range procs {
			cp = append(cp, p.PID)
		}
	}
	nodes, _ := c.cg.Procs()
	for _, n := range c.nodes {
		if n.proxy != nil {
			proxies = append(proxies, n.proxy.PID())
		}
	}
	return Memory{ControlPlane: rss(cp), Nodes: rss(nodes), KubeProxy: rss(proxies)}
}

// Total is the sum over every part, in kB.
func (m Memory) Total() int { return sum(m.ControlPlane) + sum(m.Nodes) + sum(m.KubeProxy) }

// String is one line: each part's total and its programs, in MB.
func (m Memory) String() string {
	part := func(name string, by map[string]int) string {
		var progs []string
		for k, v := range by {
			progs = append(progs, fmt.Sprintf("%s %d", k, v/1024))
		}
		slices.Sort(progs)
		return fmt.Sprintf("%s %d MB (%s)", name, sum(by)/1024, strings.Join(progs, ", "))
	}
	return fmt.Sprintf("%d MB: %s; %s; %s", m.Total()/1024, part("control plane", m.ControlPlane),
		part("nodes and pods (run cgroup)", m.Nodes), part("kube-proxy", m.KubeProxy))
}

func sum(by map[string]int) int {
	t := 0
	for _, v := range by {
		t += v
	}
	return t
}

// rss sums VmRSS (kB) per program name; processes gone meanwhile count 0.
func rss(pids []int) map[string]int {
	by := map[string]int{}
	for _, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				by[strings.TrimSpace(string(comm))] += kb
			}
		}
	}
	return by
}
