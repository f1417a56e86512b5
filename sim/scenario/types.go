// Package scenario reads, validates and expands kpsim scenario files
// (apiVersion kpsim.dev/v1alpha1, kind Scenario). The format's reference is
// scenarios/README.md; every field below is documented there with an example.
package scenario

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kpsim/kpsim/sim/cluster"
)

// APIVersion and Kind identify a scenario document.
const (
	APIVersion = "kpsim.dev/v1alpha1"
	Kind       = "Scenario"
)

// Scenario is one scenario file as written by the user.
type Scenario struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   Metadata `json:"metadata"`
	Seed       *uint64  `json:"seed,omitempty"`
	Cluster    Cluster  `json:"cluster"`
	// Objects are the Kubernetes manifests of the objects section, in file
	// order, with the List wrappers removed. The loader fills it.
	Objects  []Object  `json:"-"`
	Generate *Generate `json:"generate,omitempty"`
	Proxy    Proxy     `json:"proxy"`
	Traffic  *Traffic  `json:"traffic,omitempty"`
	Events   []Event   `json:"events,omitempty"`
	Checks   []Check   `json:"checks,omitempty"`
}

// Metadata names and describes a scenario.
type Metadata struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// Cluster describes the nodes and address ranges.
type Cluster struct {
	// ServiceCIDR holds every ClusterIP (default 10.96.0.0/16).
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// PodCIDR is the cluster's pod range, split into one block per node
	// (default 10.244.0.0/16).
	PodCIDR string `json:"podCIDR,omitempty"`
	// NodeCIDRMaskSize is the prefix length of each node's block (default 24).
	NodeCIDRMaskSize int `json:"nodeCIDRMaskSize,omitempty"`
	// NodeNetwork holds the nodes' own addresses (default 198.18.0.0/16, the
	// range RFC 2544 reserves for benchmarking).
	NodeNetwork string `json:"nodeNetwork,omitempty"`
	// ExternalNetwork holds the addresses of clients outside the cluster
	// (traffic.clients with where: external; default 203.0.113.0/24,
	// TEST-NET-3).
	ExternalNetwork string `json:"externalNetwork,omitempty"`
	// Nodes lists nodes by name; NodeCount generates them instead.
	Nodes []NodeSpec `json:"nodes,omitempty"`
	// NodeCount generates that many nodes named by NodeNamePattern.
	NodeCount int `json:"nodeCount,omitempty"`
	// NodeNamePattern names generated nodes; "{i}" is replaced by the
	// 1-based index (default "node-{i}").
	NodeNamePattern string `json:"nodeNamePattern,omitempty"`
	// Zones are given to generated nodes round-robin.
	Zones []string `json:"zones,omitempty"`
}

// NodeSpec is one named node.
type NodeSpec struct {
	Name    string            `json:"name"`
	Zone    string            `json:"zone,omitempty"`
	PodCIDR string            `json:"podCIDR,omitempty"`
	IP      string            `json:"ip,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// Generate produces ordinary Services and EndpointSlices at scale.
type Generate struct {
	Services            int          `json:"services"`
	Namespaces          int          `json:"namespaces,omitempty"`
	NamePrefix          string       `json:"namePrefix,omitempty"`
	EndpointsPerService Distribution `json:"endpointsPerService"`
	// Placement puts each Service's endpoints on nodes: spread (round
	// robin from a random node, the default), random (each on a node drawn
	// uniformly), skewed (each on a node drawn with Zipf weights of
	// exponent PlacementSkew over the nodes in an order drawn per Service),
	// or weighted (in proportion to NodeWeights, by smooth weighted round
	// robin: 6 endpoints over weights 1, 2, 3 land 1, 2, 3).
	Placement string `json:"placement,omitempty"`
	// PlacementSkew is the Zipf exponent of skewed placement (default 1).
	PlacementSkew float64 `json:"placementSkew,omitempty"`
	// NodeWeights are the per-node weights of weighted placement, by node
	// name; a node not listed gets no endpoint.
	NodeWeights     map[string]float64 `json:"nodeWeights,omitempty"`
	Ports           PortGenerator      `json:"ports,omitempty"`
	SessionAffinity AffinityGen        `json:"sessionAffinity,omitempty"`
	// InternalTrafficPolicyLocal is the fraction of Services with
	// internalTrafficPolicy: Local.
	InternalTrafficPolicyLocal float64 `json:"internalTrafficPolicyLocal,omitempty"`
	// ExternalTrafficPolicyLocal is the fraction of Services of type NodePort
	// with externalTrafficPolicy: Local.
	ExternalTrafficPolicyLocal float64 `json:"externalTrafficPolicyLocal,omitempty"`
	// NotReady and Terminating are fractions of endpoints generated in that
	// condition.
	NotReady    float64 `json:"notReady,omitempty"`
	Terminating float64 `json:"terminating,omitempty"`
}

// Distribution is an integer distribution for a generator.
type Distribution struct {
	// Kind is fixed, uniform, zipf or lognormal.
	Kind  string  `json:"kind"`
	Value int     `json:"value,omitempty"`
	Min   int     `json:"min,omitempty"`
	Max   int     `json:"max,omitempty"`
	S     float64 `json:"s,omitempty"`
	Mu    float64 `json:"mu,omitempty"`
	Sigma float64 `json:"sigma,omitempty"`
}

// PortGenerator shapes generated service ports.
type PortGenerator struct {
	PerService int     `json:"perService,omitempty"`
	Named      float64 `json:"named,omitempty"`
	UDP        float64 `json:"udp,omitempty"`
	Port       int32   `json:"port,omitempty"`
	TargetPort int32   `json:"targetPort,omitempty"`
}

// AffinityGen gives a fraction of generated Services sessionAffinity ClientIP.
type AffinityGen struct {
	Fraction       float64 `json:"fraction,omitempty"`
	TimeoutSeconds int32   `json:"timeoutSeconds,omitempty"`
}

// Proxy configures the kube-proxy modes to model or program.
type Proxy struct {
	Modes            []cluster.Mode   `json:"modes,omitempty"`
	IPVSScheduler    string           `json:"ipvsScheduler,omitempty"`
	MinSyncPeriod    *metav1.Duration `json:"minSyncPeriod,omitempty"`
	SyncPeriod       *metav1.Duration `json:"syncPeriod,omitempty"`
	MasqueradeAll    bool             `json:"masqueradeAll,omitempty"`
	IPTablesBackend  string           `json:"iptablesBackend,omitempty"`
	IPTablesAffinity string           `json:"iptablesAffinity,omitempty"`
	NFTablesLayout   string           `json:"nftablesLayout,omitempty"`
}

// Traffic describes the clients and the connections they open.
type Traffic struct {
	Clients []Client `json:"clients"`
	// Connections is the total number of new connections over all clients.
	Connections int64 `json:"connections,omitempty"`
	// Rate (connections per second over all clients) and Duration are the
	// alternative to Connections.
	Rate     float64          `json:"rate,omitempty"`
	Duration *metav1.Duration `json:"duration,omitempty"`
	// ConnectionDuration is how long each connection stays open.
	ConnectionDuration *DurationDist `json:"connectionDuration,omitempty"`
}

// DurationDist is a distribution of durations: fixed or exponential
// (connectionDuration), or also pareto and lognormal (requests.duration),
// each given by its mean.
type DurationDist struct {
	Kind string          `json:"kind"`
	Mean metav1.Duration `json:"mean"`
	// Alpha is a pareto distribution's shape (above 1; default
	// DefaultParetoAlpha), Sigma a lognormal one's sigma of the log
	// (default DefaultLognormalSigma).
	Alpha float64 `json:"alpha,omitempty"`
	Sigma float64 `json:"sigma,omitempty"`
}

// Client is a group of clients: pods (the default), host-network processes
// of nodes, or machines outside the cluster.
type Client struct {
	Name string `json:"name"`
	// Where the clients stand: pod (default), host or external.
	Where cluster.Where `json:"where,omitempty"`
	// Nodes the client pods (or host clients) run on; empty means every
	// node. For external clients: the nodes their connections enter at
	// (node ports and external IPs); empty means every node.
	Nodes []string `json:"nodes,omitempty"`
	// PodsPerNode is the number of client pods on each of those nodes.
	PodsPerNode int `json:"podsPerNode,omitempty"`
	// SourceIPs is the number of distinct source addresses per client pod
	// (per outside client: from cluster.externalNetwork).
	SourceIPs int `json:"sourceIPs,omitempty"`
	// SourcePorts is random (default), sequential or fixed.
	SourcePorts string `json:"sourcePorts,omitempty"`
	// Protocol restricts the targets to TCP or UDP service ports.
	Protocol string `json:"protocol,omitempty"`
	// Services are the targets, "namespace/name" or "namespace/name:port";
	// empty means every Service.
	Services []string `json:"services,omitempty"`
	// Weight is this client's share of the connections (default 1).
	Weight float64 `json:"weight,omitempty"`
	// Requests, when set, makes the client send requests at a rate of its
	// own (sim run): over Pool's long-lived connections, or without a pool
	// one new connection per request.
	Requests *Requests `json:"requests,omitempty"`
	// Pool is the client's pool of long-lived connections (requests.go).
	Pool *Pool `json:"pool,omitempty"`
	// Via is the destination external clients connect to (external.go):
	// load-balancer (the default: a balancer spreads connections evenly
	// over Nodes, following each node's health check; they arrive at the
	// Service's load-balancer IP, or at its node port when it has none),
	// node-port (spread evenly over Nodes) or external-ip (routed to Nodes
	// evenly). Pod and host clients connect to the cluster IP.
	Via cluster.Via `json:"via,omitempty"`
	// HealthCheck is how the load balancer probes each node's health
	// check node port (via load-balancer only).
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`
}

// HealthCheck is a load balancer's probe of the nodes: every Interval, a
// node is taken out after UnhealthyThreshold failed probes in a row and put
// back after HealthyThreshold passed ones. The defaults are the GCE cloud
// provider's for a Service's nodes (8 s, 3 and 1).
type HealthCheck struct {
	Interval           *metav1.Duration `json:"interval,omitempty"`
	UnhealthyThreshold int              `json:"unhealthyThreshold,omitempty"`
	HealthyThreshold   int              `json:"healthyThreshold,omitempty"`
}

// Event types.
const (
	EventReadiness     = "readiness"
	EventFlap          = "flap"
	EventDeletePod     = "delete-pod"
	EventScale         = "scale"
	EventServiceUpdate = "service-update"
)

// Event is one entry of the timeline, applied through the API at time At.
type Event struct {
	At   metav1.Duration `json:"at"`
	Type string          `json:"type"`
	// Service is "namespace/name".
	Service string `json:"service"`
	// Pod names the endpoint (its targetRef); Endpoint may name it by IP
	// instead; Endpoints picks that many endpoints of the Service.
	Pod       string `json:"pod,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
	Endpoints int    `json:"endpoints,omitempty"`
	// Ready is the new readiness (readiness).
	Ready *bool `json:"ready,omitempty"`
	// Period, Duty and Count shape a flap: not ready for Duty*Period of every
	// Period, Count times.
	Period *metav1.Duration `json:"period,omitempty"`
	Duty   float64          `json:"duty,omitempty"`
	Count  int              `json:"count,omitempty"`
	// GracePeriod is how long a deleted pod stays terminating (delete-pod).
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`
	// Replicas is the new number of endpoints (scale).
	Replicas *int `json:"replicas,omitempty"`
	// Service changes (service-update).
	SessionAffinity       string `json:"sessionAffinity,omitempty"`
	AffinityTimeout       *int32 `json:"affinityTimeoutSeconds,omitempty"`
	InternalTrafficPolicy string `json:"internalTrafficPolicy,omitempty"`
	ExternalTrafficPolicy string `json:"externalTrafficPolicy,omitempty"`
}

// Check types.
const (
	CheckDistribution         = "distribution"
	CheckAffinity             = "affinity"
	CheckInternalTrafficLocal = "internal-traffic-local"
	CheckNoEndpoints          = "no-endpoints"
	CheckFlapping             = "flapping"
	CheckTerminating          = "terminating"
	// CheckExternalDistribution: new connections from outside through a
	// node port, external IP or load-balancer IP entering at each node:
	// the shares of the endpoints that node sends to.
	CheckExternalDistribution = "external-distribution"
	// CheckExternalLocalBalance: connections from outside to a
	// load-balancer IP spread evenly over the nodes by the load balancer
	// (following health checks): each pod's share under
	// externalTrafficPolicy Local, nothing lost.
	CheckExternalLocalBalance = "external-local-balance"
	// CheckExternalAffinity: ClientIP affinity through a node port or
	// load-balancer IP, per entry node and across entry nodes.
	CheckExternalAffinity = "external-affinity"
	// CheckSourceAddress: the source address each backend sees.
	CheckSourceAddress = "source-address"
	// CheckHealthCheck: each node's healthCheckNodePort answer, following
	// readiness changes.
	CheckHealthCheck = "health-check"
	// CheckSourceRanges: loadBalancerSourceRanges let allowed sources in
	// and drop the others.
	CheckSourceRanges = "source-ranges"
	// CheckHairpin: a backend pod reaching its own Service.
	CheckHairpin = "hairpin"
	// CheckServiceCIDR: an unknown port of a cluster IP is rejected and an
	// unallocated address of the service range dropped (nftables mode).
	CheckServiceCIDR = "service-cidr"
	// CheckUDPFlow: a UDP flow on one 5-tuple whose endpoint is deleted,
	// made not ready or replaced reaches a live endpoint within one sync;
	// one rejected while the Service had no serving endpoint reaches one
	// once it has (kube-proxy's conntrack cleanup).
	CheckUDPFlow = "udp-flow"
	// CheckTCPEstablished: established TCP connections keep their endpoint
	// through unrelated syncs, while it terminates, and in the fallback to
	// terminating endpoints; new ones go to a terminating endpoint only
	// when no ready one is left.
	CheckTCPEstablished = "tcp-established"
	// CheckAffinityMoves: a ClientIP-affine client whose endpoint is
	// deleted moves to a live endpoint and sticks there.
	CheckAffinityMoves = "affinity-moves"
)

// Check defaults, documented in scenarios/README.md.
const (
	DefaultAlpha = 0.001 // family-wise, split by Holm across a run's checks
	DefaultMDE   = 0.10  // one endpoint off by 10 % of its share
	DefaultPower = 0.99
)

// Check is one behaviour to verify.
type Check struct {
	Name    string `json:"name,omitempty"`
	Type    string `json:"type"`
	Service string `json:"service"`
	Port    string `json:"port,omitempty"`
	// ClientNodes restricts the check to clients on these nodes (for
	// clients outside the cluster: the nodes their connections enter at).
	ClientNodes []string `json:"clientNodes,omitempty"`
	// From is where the check's clients stand: pod, host or external (the
	// check type's default when empty).
	From cluster.Where `json:"from,omitempty"`
	// Via is the destination the clients connect to: cluster-ip,
	// node-port, external-ip or load-balancer (the check type's default
	// when empty).
	Via   cluster.Via `json:"via,omitempty"`
	Alpha float64     `json:"alpha,omitempty"`
	MDE   float64     `json:"mde,omitempty"`
	Power float64     `json:"power,omitempty"`
}

// Object is one Kubernetes object of the objects section and the field path it
// came from (for example "objects[3].items[1]").
type Object struct {
	Path   string
	Object runtime.Object
}
