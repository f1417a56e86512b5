// Package remote places a scenario on a cluster reached by a kubeconfig: a
// user's cluster, or the local one of harness/cluster. Nothing here enters a
// namespace or touches a kernel; everything goes through the API.
//
// A plan (NewPlan) turns an expanded scenario into objects of the run:
//
//   - one namespace per scenario namespace, kpsim-<run>-<namespace>, labelled
//     with the run (LabelRun) so that Cleanup finds it, and allowed the
//     privileged Pod Security level (the agents need NET_RAW);
//   - one echo pod per endpoint address of the scenario, pinned to the
//     cluster node its endpoint's node maps to, serving every port the
//     scenario's EndpointSlices give that address;
//   - the scenario's Services without a selector, cluster IP or node ports
//     (the cluster allocates them), and its EndpointSlices owned by the
//     harness (endpointslice.kubernetes.io/managed-by), whose addresses are
//     the echo pods' once they run;
//   - a prober DaemonSet on the nodes the scenario's pod clients stand on.
//
// Deploy writes them and waits, bounded, until every agent pod is Ready; it
// returns the Placement: the model's addresses and names against the
// cluster's, which the conformance run's machine translates at its edge so
// that the checks, the oracle and the reports keep the scenario's own.
package remote

import (
	"cmp"
	_ "embed"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Labels and names of the run's objects.
const (
	// LabelRun holds the run ID on every namespace (and object) of a run.
	LabelRun = "kpsim.dev/run"
	// AnnotationOwner is "host/pid" of the process that made a run's
	// namespace: Cleanup leaves a live run's alone.
	AnnotationOwner = "kpsim.dev/owner"
	// LabelRole is "echo" or "prober" on the agent pods.
	LabelRole = "kpsim.dev/role"
	// ManagedBy is the EndpointSlices' endpointslice.kubernetes.io/managed-by:
	// the EndpointSlice controller leaves them alone.
	ManagedBy = "kpsim.dev"
	// AgentPort is the agents' HTTP port, reached through pods/proxy.
	AgentPort = 9376
	// ProberName is the prober DaemonSet's name.
	ProberName = "kpsim-prober"
)

// Default images: built locally and imported on the local cluster's nodes
// (harness/cluster); --image overrides them for any other cluster.
const (
	DefaultEchoImage   = "kpsim.local/echo:dev"
	DefaultProberImage = "kpsim.local/prober:dev"
)

// Options say how a scenario is placed.
type Options struct {
	// RunID names the run (netns.NewRunID's form).
	RunID string
	// Nodes maps each scenario node to a cluster node. A scenario node
	// missing from it keeps its own name.
	Nodes map[string]string
	// EchoImage and ProberImage are the agents' images (defaults when empty).
	EchoImage, ProberImage string
	// PullPolicy is the agents' imagePullPolicy (IfNotPresent when empty).
	PullPolicy corev1.PullPolicy
}

// Plan is what a run writes to the cluster.
type Plan struct {
	RunID      string
	Namespaces []*corev1.Namespace
	Echo       []*corev1.Pod
	Prober     *appsv1.DaemonSet
	Services   []*corev1.Service
	// Slices carry the scenario's endpoint addresses until Deploy replaces
	// them with the echo pods'.
	Slices []*discoveryv1.EndpointSlice
	// Home is the run's own namespace (agents live there).
	Home string
	// nsOf maps scenario namespaces to the run's; echoOf endpoint
	// addresses to echo pods (namespace/name); nodeOf scenario nodes to
	// cluster nodes.
	nsOf   map[string]string
	echoOf map[netip.Addr]string
	nodeOf map[string]string
	// proberNodes are the cluster nodes a prober runs on, sorted.
	proberNodes []string
}

// Namespace is the run's namespace for a scenario namespace.
func (p *Plan) Namespace(scenarioNS string) string { return p.nsOf[scenarioNS] }

// Node is the cluster node of a scenario node.
func (p *Plan) Node(scenarioNode string) string { return p.nodeOf[scenarioNode] }

// ProberNodes are the cluster nodes the prober DaemonSet runs on.
func (p *Plan) ProberNodes() []string { return slices.Clone(p.proberNodes) }

// HomeNamespace is the run's own namespace.
func HomeNamespace(runID string) string { return "kpsim-" + runID }

// NewPlan places an expanded scenario. Errors name the object and field
// that cannot be placed.
func NewPlan(exp *scenario.Expanded, o Options) (*Plan, error) {
	if o.RunID == "" {
		return nil, fmt.Errorf("no run ID")
	}
	p := &Plan{RunID: o.RunID, Home: HomeNamespace(o.RunID), nsOf: map[string]string{}, echoOf: map[netip.Addr]string{}, nodeOf: map[string]string{}}
	if err := p.mapNodes(exp, o.Nodes); err != nil {
		return nil, err
	}
	echoImage, proberImage, pull := cmp.Or(o.EchoImage, DefaultEchoImage), cmp.Or(o.ProberImage, DefaultProberImage), cmp.Or(o.PullPolicy, corev1.PullIfNotPresent)
	p.Namespaces = append(p.Namespaces, p.namespace(p.Home))
	echoes, err := p.placeSlices(exp)
	if err != nil {
		return nil, err
	}
	for _, s := range exp.Services {
		ns, err := p.addNamespace(s.Namespace)
		if err != nil {
			return nil, err
		}
		p.Services = append(p.Services, serviceForRun(s, ns, o.RunID))
	}
	p.addEchoPods(echoes, echoImage, pull)
	p.proberNodes = p.clientNodes(exp)
	p.Prober = proberDaemonSet(p.Home, o.RunID, proberImage, pull, p.proberNodes)
	return p, nil
}

// mapNodes maps each scenario node to its cluster node: its own name
// unless the node map says otherwise; a map entry for a node the scenario
// lacks is an error.
func (p *Plan) mapNodes(exp *scenario.Expanded, nodeMap map[string]string) error {
	for _, n := range exp.Nodes {
		p.nodeOf[n.Name] = n.Name
		if to, ok := nodeMap[n.Name]; ok {
			p.nodeOf[n.Name] = to
		}
	}
	for from := range nodeMap {
		if _, ok := p.nodeOf[from]; !ok {
			return fmt.Errorf("node map: the scenario has no node %q", from)
		}
	}
	return nil
}

// addNamespace returns the run's namespace for scenario namespace ns,
// adding it to the plan the first time.
func (p *Plan) addNamespace(ns string) (string, error) {
	if to, ok := p.nsOf[ns]; ok {
		return to, nil
	}
	to := p.Home + "-" + ns
	if errs := validation.IsDNS1123Label(to); len(errs) > 0 {
		return "", fmt.Errorf("namespace %q: the run's name for it, %q, is not a valid namespace name: %s", ns, to, strings.Join(errs, "; "))
	}
	p.nsOf[ns] = to
	p.Namespaces = append(p.Namespaces, p.namespace(to))
	return to, nil
}

// echo is an endpoint address to serve: the ports it serves and its node.
type echo struct {
	ports map[corev1.Protocol]map[int32]bool
	node  string
	ns    string // the run namespace of the first slice naming it
	pod   string // the scenario's targetRef name, for the echo pod's name
}

// placeSlices adds the scenario's EndpointSlices to the plan, in the run's
// namespaces, on the mapped nodes, and returns the endpoint addresses
// they name, each with its ports and node.
func (p *Plan) placeSlices(exp *scenario.Expanded) (map[netip.Addr]*echo, error) {
	echoes := map[netip.Addr]*echo{}
	for _, sl := range exp.Slices {
		ns, err := p.addNamespace(sl.Namespace)
		if err != nil {
			return nil, err
		}
		x := sl.DeepCopy()
		forRun(&x.ObjectMeta, ns, p.RunID)
		x.Labels[discoveryv1.LabelManagedBy] = ManagedBy
		for i, ep := range x.Endpoints {
			where := fmt.Sprintf("EndpointSlice %s/%s endpoints[%d]", sl.Namespace, sl.Name, i)
			if ep.NodeName == nil || *ep.NodeName == "" {
				return nil, fmt.Errorf("%s: no nodeName: an echo pod cannot be placed", where)
			}
			node, ok := p.nodeOf[*ep.NodeName]
			if !ok {
				return nil, fmt.Errorf("%s: node %q is not a node of the scenario", where, *ep.NodeName)
			}
			x.Endpoints[i].NodeName = &node
			x.Endpoints[i].TargetRef = nil // set to the echo pod by Deploy
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					return nil, fmt.Errorf("%s: address %q: %w", where, a, err)
				}
				e := echoes[ip]
				if e == nil {
					e = &echo{ports: map[corev1.Protocol]map[int32]bool{}, node: node, ns: ns}
					echoes[ip] = e
				}
				if e.node != node {
					return nil, fmt.Errorf("%s: address %s is on node %s here and on %s in another slice", where, ip, node, e.node)
				}
				if ep.TargetRef != nil && e.pod == "" {
					e.pod = ep.TargetRef.Name
				}
				if err := e.addPorts(sl); err != nil {
					return nil, err
				}
			}
		}
		p.Slices = append(p.Slices, x)
	}
	return echoes, nil
}

// addPorts adds the ports of slice sl to those e serves.
func (e *echo) addPorts(sl *discoveryv1.EndpointSlice) error {
	for j, port := range sl.Ports {
		if port.Port == nil {
			continue
		}
		if *port.Port == AgentPort {
			return fmt.Errorf("EndpointSlice %s/%s ports[%d]: port %d is the agents' own", sl.Namespace, sl.Name, j, AgentPort)
		}
		proto := corev1.ProtocolTCP
		if port.Protocol != nil {
			proto = *port.Protocol
		}
		if e.ports[proto] == nil {
			e.ports[proto] = map[int32]bool{}
		}
		e.ports[proto][*port.Port] = true
	}
	return nil
}

// addEchoPods adds an echo pod per endpoint address, in address order. An
// echo pod has the name of the scenario's pod (the endpoints' targetRef)
// in the run's namespace for the scenario's: a timeline step that names a
// pod names it here too.
func (p *Plan) addEchoPods(echoes map[netip.Addr]*echo, image string, pull corev1.PullPolicy) {
	used := map[string]bool{}
	for _, ip := range slices.SortedFunc(maps.Keys(echoes), netip.Addr.Compare) {
		e := echoes[ip]
		name := "ep-" + strings.ReplaceAll(ip.String(), ".", "-")
		if e.pod != "" && len(validation.IsDNS1123Subdomain(e.pod)) == 0 && !used[e.ns+"/"+e.pod] {
			name = e.pod
		}
		used[e.ns+"/"+name] = true
		p.echoOf[ip] = e.ns + "/" + name
		var args []string
		var ports []corev1.ContainerPort
		for _, proto := range slices.Sorted(maps.Keys(e.ports)) {
			if proto != corev1.ProtocolTCP && proto != corev1.ProtocolUDP {
				continue // SCTP: the checks do not probe it
			}
			for _, port := range slices.Sorted(maps.Keys(e.ports[proto])) {
				args = append(args, strings.ToLower(string(proto))+":"+strconv.Itoa(int(port)))
				ports = append(ports, corev1.ContainerPort{ContainerPort: port, Protocol: proto})
			}
		}
		pod := agentPod(name, e.ns, p.RunID, "echo", image, pull, []string{"--ports", strings.Join(args, ",")}, ports)
		pod.Spec.NodeName = e.node
		pod.Labels["kpsim.dev/address"] = strings.ReplaceAll(ip.String(), ".", "-")
		p.Echo = append(p.Echo, pod)
	}
}

// clientNodes are the cluster nodes of the scenario's pod clients, sorted:
// where the probers run. Without a client named, every node probes, as
// the namespace run's default client does.
func (p *Plan) clientNodes(exp *scenario.Expanded) []string {
	nodes := map[string]bool{}
	for _, c := range exp.Scenario.Traffic.Clients {
		if c.Where != "" && c.Where != cluster.InPod {
			continue
		}
		for _, n := range c.Nodes {
			if to, ok := p.nodeOf[n]; ok {
				nodes[to] = true
			}
		}
	}
	if len(nodes) == 0 {
		for _, n := range p.nodeOf {
			nodes[n] = true
		}
	}
	return slices.Sorted(maps.Keys(nodes))
}

func (p *Plan) namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotationOwner: owner()}, Labels: map[string]string{
		LabelRun: p.RunID,
		// NET_RAW is beyond the baseline level.
		"pod-security.kubernetes.io/enforce": "privileged",
		"pod-security.kubernetes.io/warn":    "privileged",
	}}}
}

// forRun moves an object's metadata into the run: its namespace, the run
// label, nothing the server owns.
func forRun(m *metav1.ObjectMeta, ns, runID string) {
	*m = metav1.ObjectMeta{Name: m.Name, Namespace: ns, Labels: maps.Clone(m.Labels), Annotations: maps.Clone(m.Annotations)}
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels[LabelRun] = runID
}

// serviceForRun is the scenario's Service without what the cluster
// allocates (cluster IPs, node ports, the health check node port) or
// selects (the selector: the harness owns the slices).
func serviceForRun(s *corev1.Service, ns, runID string) *corev1.Service {
	x := s.DeepCopy()
	forRun(&x.ObjectMeta, ns, runID)
	x.Status = corev1.ServiceStatus{}
	x.Spec.Selector = nil
	if x.Spec.ClusterIP != corev1.ClusterIPNone {
		x.Spec.ClusterIP, x.Spec.ClusterIPs = "", nil
	}
	x.Spec.HealthCheckNodePort = 0
	for i := range x.Spec.Ports {
		x.Spec.Ports[i].NodePort = 0
	}
	return x
}

func agentPod(name, ns, runID, role, image string, pull corev1.PullPolicy, args []string, ports []corev1.ContainerPort) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelRun: runID, LabelRole: role}},
		Spec:       agentSpec(role, image, pull, args, ports),
	}
}

// agentSpec is an agent's pod: NET_RAW (raw probe sockets),
// NET_BIND_SERVICE (an echo's ports below 1024) and NET_ADMIN (in the pod's
// own network namespace: SO_RCVBUFFORCE sizes the observer's receive buffer
// past the node's net.core.rmem_max, which would drop a block's burst) and
// nothing else, no API token, a readiness probe on the agent's /healthz,
// and every toleration (a node the scenario names is used whatever its
// taints).
func agentSpec(role, image string, pull corev1.PullPolicy, args []string, ports []corev1.ContainerPort) corev1.PodSpec {
	no, yes := false, true
	root := int64(0)
	grace := int64(5)
	ports = append(slices.Clone(ports), corev1.ContainerPort{Name: "agent", ContainerPort: AgentPort, Protocol: corev1.ProtocolTCP})
	return corev1.PodSpec{
		AutomountServiceAccountToken:  &no,
		EnableServiceLinks:            &no,
		TerminationGracePeriodSeconds: &grace,
		Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		Containers: []corev1.Container{{
			Name:            role,
			Image:           image,
			ImagePullPolicy: pull,
			Args:            args,
			Ports:           ports,
			Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(AgentPort)}},
				PeriodSeconds: 1, FailureThreshold: 3},
			SecurityContext: &corev1.SecurityContext{
				RunAsUser:                &root,
				AllowPrivilegeEscalation: &no,
				ReadOnlyRootFilesystem:   &yes,
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"},
					Add: []corev1.Capability{"NET_RAW", "NET_BIND_SERVICE", "NET_ADMIN"}},
			},
		}},
	}
}

func proberDaemonSet(ns, runID, image string, pull corev1.PullPolicy, nodes []string) *appsv1.DaemonSet {
	labels := map[string]string{LabelRun: runID, LabelRole: "prober"}
	spec := agentSpec("prober", image, pull, nil, nil)
	// One term per node (terms are ORed): the API takes a single value in
	// a metadata.name field selector.
	var terms []corev1.NodeSelectorTerm
	for _, n := range nodes {
		terms = append(terms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}})
	}
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: terms}}}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: ProberName, Namespace: ns, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
}

// RBAC is the ClusterRole a run needs (rbac.yaml, shipped with the
// binary: sim conform --print-rbac).
//
//go:embed rbac.yaml
var RBAC string
