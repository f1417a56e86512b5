package conform

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/agent"
	"github.com/kpsim/kpsim/harness/remote"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// RemoteOptions configure a run on a cluster reached through its API (sim
// conform --kubeconfig).
type RemoteOptions struct {
	// Client is the cluster's API (from the kubeconfig).
	Client kubernetes.Interface
	// Nodes maps scenario nodes to cluster nodes (--node-map). Without
	// it a scenario whose node names all exist on the cluster uses them;
	// otherwise the scenario's nodes, sorted, take the cluster's Ready
	// nodes, sorted.
	Nodes map[string]string
	// EchoImage, ProberImage and PullPolicy are the agents' (remote's
	// defaults when empty).
	EchoImage, ProberImage string
	PullPolicy             corev1.PullPolicy
	// Ready bounds the wait for the agent pods (default 3 minutes).
	Ready time.Duration
	// Settle is how long a change is given to reach every node's proxy
	// before probes are sent (default 3 s): after the deploy and after
	// each timeline step.
	Settle time.Duration
	// RejectInterval paces the probes of a check whose every probe should
	// be rejected, one probe per interval, PacedRejectProbes of them
	// (sim conform's default is DefaultRejectInterval). A node answers a
	// client with at most one ICMP error a second after a burst of six
	// (the kernel's per-destination limit, net.ipv4.icmp_ratelimit 1000
	// ms by default): faster, most rejects are never sent, and the check
	// would read the limit's silence as drops. Zero: no pacing and the
	// namespace run's probe count, for nodes whose limit is lifted.
	RejectInterval time.Duration
	// agents replaces the pods/proxy agents (tests).
	agents agentAPI
}

// DefaultRejectInterval is sim conform's --reject-interval: a node's
// ICMP error budget per client refills at one a second by default
// (net.ipv4.icmp_ratelimit 1000 ms), and a twentieth more keeps a probe
// clear of the refill's jiffy rounding.
const DefaultRejectInterval = 1050 * time.Millisecond

// remoteTypes are the check types a cluster run makes: the ones whose
// clients are pods, which count arrivals and rejects, and whose timeline
// changes endpoint conditions. The others are "not run", with why.
var remoteTypes = map[string]bool{
	scenario.CheckDistribution:         true,
	scenario.CheckNoEndpoints:          true,
	scenario.CheckFlapping:             true,
	scenario.CheckTerminating:          true,
	scenario.CheckInternalTrafficLocal: true,
}

// remoteNotRunnable says why a check is not made on a cluster, or "".
func remoteNotRunnable(c *scenario.Check) string {
	if from, _ := scenario.CheckRoute(c); from != cluster.InPod {
		return "on a cluster the clients are prober pods; clients on a node's host or outside the cluster are not placed there yet"
	}
	if !remoteTypes[c.Type] {
		return fmt.Sprintf("not made on a cluster yet: %s checks need what only the namespace run has (several source addresses per client, conntrack, node namespaces or held connections)", c.Type)
	}
	return ""
}

// RunRemote runs every scenario on the cluster of ro.Client, each in
// namespaces of its own that are removed when it ends, with the same plan,
// sizing, looks, Holm and reports as Run. The proxy under test is the
// cluster's own; o.Mode names it (iptables or nftables).
func RunRemote(ctx context.Context, files []string, o Options, ro RemoteOptions) (*report.Run, error) {
	if len(o.Faults) > 0 {
		return nil, errors.New("--fault applies to kpsim's dataplane; on a cluster the node proxy is the cluster's (run sim proxy --fault on its nodes)")
	}
	if o.Mode != cluster.ModeIPTables && o.Mode != cluster.ModeNFTables {
		return nil, fmt.Errorf("--mode %q: a cluster run checks a node proxy in iptables or nftables mode", o.Mode)
	}
	o, _, loaded, err := load(files, o)
	if err != nil {
		return nil, err
	}
	v, err := ro.Client.Discovery().ServerVersion()
	if err != nil {
		return nil, &EnvironmentError{fmt.Errorf("the cluster's API server does not answer: %w", err)}
	}
	if ro.Ready == 0 {
		ro.Ready = 3 * time.Minute
	}
	if ro.Settle == 0 {
		ro.Settle = 3 * time.Second
	}
	if ro.agents == nil {
		ro.agents = podProxyAgents{ro.Client}
	}
	o.SubjectVersion = "the node proxy of a cluster whose API server is " + v.GitVersion
	o.Subject = SubjectCluster
	run := execute(ctx, loaded, o, func(ctx context.Context, l *scenario.Loaded, alphaUnit float64, run *report.Run) *report.Suite {
		return clusterSuite(ctx, l, o, ro, alphaUnit, run)
	})
	run.Kernel = "the cluster's nodes"
	return run, ctx.Err()
}

// clusterSuite runs one scenario on the cluster.
func clusterSuite(ctx context.Context, l *scenario.Loaded, o Options, ro RemoteOptions, alphaUnit float64, run *report.Run) *report.Suite {
	start := time.Now()
	out := &report.Suite{Scenario: l.Scenario.Metadata.Name, File: l.File, Figures: map[string]any{}}
	s := &suite{o: o, l: l, alphaUnit: alphaUnit, out: out, start: start, remote: true, rejectGap: ro.RejectInterval}
	defer func() { out.Duration = time.Since(start) }()
	fail := func(err error) *report.Suite {
		out.SetupError = err.Error()
		if env := (*EnvironmentError)(nil); errors.As(err, &env) {
			out.SetupErrorKind = report.KindEnvironment
		}
		return out
	}
	fmt.Fprintf(o.Log, "conform: %s (%s) on the cluster\n", out.Scenario, l.File)
	// A scenario none of whose checks is made on a cluster is not placed
	// there: each check is reported not run, with why.
	if !slices.ContainsFunc(l.Scenario.Checks, func(c scenario.Check) bool { return remoteNotRunnable(&c) == "" }) {
		for i := range l.Scenario.Checks {
			c := &l.Scenario.Checks[i]
			out.Checks = append(out.Checks, &report.Check{Name: c.Name, Type: c.Type, Service: c.Service, Verdict: report.NotRun, Message: remoteNotRunnable(c)})
		}
		return out
	}
	m, _, err := s.configure(ctx, run)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	id, err := netns.NewRunID()
	if err != nil {
		return fail(err)
	}
	nodes, nodeIPs, err := mapNodes(ctx, ro.Client, s.state(), ro.Nodes)
	if err != nil {
		return fail(err)
	}
	out.Figures["nodes"] = nodes
	// The model streamed its objects into its fake API; the plan needs
	// them whole (the same seed expands the same objects).
	exp, err := scenario.Expand(l, &s.seed)
	if err != nil {
		return fail(err)
	}
	plan, err := remote.NewPlan(exp, remote.Options{RunID: id, Nodes: nodes, EchoImage: ro.EchoImage, ProberImage: ro.ProberImage, PullPolicy: ro.PullPolicy})
	if err != nil {
		return fail(err)
	}
	// The run's namespaces go whatever happens, interrupted runs included.
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		fmt.Fprintf(o.Log, "conform: %s: deleting namespaces of run %s\n", out.Scenario, id)
		if err := remote.Delete(dctx, ro.Client, id, 2*time.Minute); err != nil {
			out.SetupError = strings.TrimSpace(out.SetupError + " teardown: " + err.Error())
		}
	}()
	fmt.Fprintf(o.Log, "conform: %s: run %s: %d echo pods, probers on %s\n", out.Scenario, id, len(plan.Echo), strings.Join(plan.ProberNodes(), ", "))
	pl, err := remote.Deploy(ctx, ro.Client, plan, ro.Ready)
	if err != nil {
		return fail(&EnvironmentError{err})
	}
	cfg, err := topology.FromModel(m, id)
	if err != nil {
		return fail(err)
	}
	var cls []*netns.Client
	for _, n := range cfg.Nodes {
		for _, cc := range n.Clients {
			if !cc.Endpoint {
				cls = append(cls, &netns.Client{Config: cc, Where: cluster.InPod, Node: n.Name})
			}
		}
	}
	mc, err := newClusterMachine(s, ro.agents, ro.Client, plan, pl, cls, nodeIPs, ro.Settle)
	if err != nil {
		return fail(err)
	}
	s.mc = mc
	if err := mc.idle(ctx, ro.Settle); err != nil {
		return fail(err)
	}
	fmt.Fprintf(o.Log, "conform: %s: deployed, sampling\n", out.Scenario)
	s.runChecks(ctx)
	if n, d := mc.rate(); n > 0 && d > 0 {
		out.Figures["probes"] = n
		out.Figures["probesPerSecond"] = float64(n) / d.Seconds()
		fmt.Fprintf(o.Log, "conform: %s: %d probes at %.0f probes/s (prober pods, requests through the API server included)\n", out.Scenario, n, float64(n)/d.Seconds())
	}
	return out
}

// mapNodes places the scenario's nodes on the cluster's and returns the
// map and the cluster nodes' addresses.
func mapNodes(ctx context.Context, client kubernetes.Interface, st *cluster.State, given map[string]string) (map[string]string, map[string]netip.Addr, error) {
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, &EnvironmentError{fmt.Errorf("could not list the cluster's nodes: %w", err)}
	}
	ready := map[string]bool{}
	ips := map[string]netip.Addr{}
	for _, n := range list.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready[n.Name] = true
			}
		}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && ip.Is4() {
				ips[n.Name] = ip
			}
		}
	}
	want := st.SortedNodes()
	out := map[string]string{}
	switch {
	case len(given) > 0:
		for _, n := range want {
			to, ok := given[n]
			if !ok {
				return nil, nil, fmt.Errorf("--node-map names no cluster node for the scenario's node %s", n)
			}
			out[n] = to
		}
	case !slices.ContainsFunc(want, func(n string) bool { return !ready[n] }):
		for _, n := range want {
			out[n] = n
		}
	default:
		have := slices.Sorted(maps.Keys(ready))
		if len(have) < len(want) {
			return nil, nil, &EnvironmentError{fmt.Errorf("the scenario has %d nodes and the cluster %d Ready ones (%s); give --node-map", len(want), len(have), strings.Join(have, ", "))}
		}
		for i, n := range want {
			out[n] = have[i]
		}
	}
	for from, to := range out {
		if !ready[to] {
			return nil, nil, &EnvironmentError{fmt.Errorf("cluster node %s (for the scenario's %s) is not Ready or does not exist", to, from)}
		}
	}
	return out, ips, nil
}

// podProxyAgents reaches the agents through the API server's pods/proxy.
type podProxyAgents struct{ client kubernetes.Interface }

func (p podProxyAgents) agent(a remote.Agent) agent.Client {
	return agent.Client{Do: agent.PodProxyDoer(p.client.CoreV1().RESTClient(), a.Namespace, a.Name, agent.Port)}
}

func (p podProxyAgents) send(ctx context.Context, a remote.Agent, req agent.SendRequest) (agent.SendResult, error) {
	return p.agent(a).Send(ctx, req)
}

func (p podProxyAgents) counts(ctx context.Context, a remote.Agent, tag uint32) (agent.Counts, error) {
	return p.agent(a).Counts(ctx, tag)
}
