package conform

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/apiserver"
)

// Subjects: the proxy a conformance run checks.
const (
	// SubjectKPSim is this repository's dataplane (the default).
	SubjectKPSim = "kpsim"
	// SubjectKubeProxy is the unmodified upstream kube-proxy binary,
	// watching a real kube-apiserver in the run's control-plane namespace.
	SubjectKubeProxy = "kube-proxy"
	// SubjectCluster is the node proxy of a cluster reached through its
	// API (RunRemote), whatever it is.
	SubjectCluster = "cluster"
)

// proxies is the subject: the proxy under test on every node of a suite.
// The kpsim subject (subject_kpsim.go) is our backend, tracker and sync
// loop per node over the suite's model; the kube-proxy subject
// (subject_kubeproxy.go) is a real control plane and one kube-proxy process
// per node. The checks reach it only through the kernel machine (counters,
// apply), and the oracle's expectations come from the suite's model
// whichever the subject: a subject cannot change what is expected of it.
type proxies interface {
	// start starts the proxy on every node of topo and waits for each
	// node's first sync.
	start(ctx context.Context, topo *netns.Topology) error
	// nodes is the number of nodes started.
	nodes() int
	// counters are a node's rule counters, nil when unavailable (unknown
	// node, no rules yet, or a subject that keeps none).
	counters(node string) []dataplane.Counter
	// apply writes one timeline step through the API and waits until every
	// node has programmed it, returning how long each node took.
	apply(ctx context.Context, step apiserver.Step) (map[string]time.Duration, error)
	// stop stops every node's proxy and waits until none runs.
	stop()
	// close releases what the subject holds in the namespaces (sockets,
	// processes, a control plane); after stop, before the namespaces go.
	close()
}

// liftICMPLimits lets rejects reach the clients one per probe: it lifts the
// ICMP rate limits of a node namespace (per-namespace sysctls).
func (s *suite) liftICMPLimits(n *netns.Node) {
	for k, v := range map[string]string{"net.ipv4.icmp_ratelimit": "0", "net.ipv4.icmp_msgs_per_sec": "1000000", "net.ipv4.icmp_msgs_burst": "1000000"} {
		if err := n.NS.Sysctl(k, v); err != nil {
			fmt.Fprintf(s.o.Log, "conform: %s: could not set %s (rejects may be rate-limited): %v\n", n.Config.Name, k, err)
		}
	}
}

// newProxies is the options' subject for this suite, not started.
func (s *suite) newProxies(variant string, faults proxy.Faults) (proxies, error) {
	podCIDR, err := netip.ParsePrefix(s.l.Scenario.Cluster.PodCIDR)
	if err != nil {
		return nil, err
	}
	switch s.o.Subject {
	case "", SubjectKPSim:
		return &kpsimProxies{s: s, podCIDR: podCIDR, variant: variant, faults: faults}, nil
	case SubjectKubeProxy:
		return s.newKubeProxies(podCIDR, variant)
	}
	return nil, fmt.Errorf("unknown subject %q (valid: %s, %s)", s.o.Subject, SubjectKPSim, SubjectKubeProxy)
}

// subjectName is the report's name of a subject option.
func subjectName(s string) string {
	if s == "" {
		return SubjectKPSim
	}
	return s
}
