package scenario

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Defaults, documented in scenarios/README.md.
const (
	DefaultServiceCIDR      = "10.96.0.0/16"
	DefaultPodCIDR          = "10.244.0.0/16"
	DefaultNodeNetwork      = "198.18.0.0/16"
	DefaultExternalNetwork  = "203.0.113.0/24"
	DefaultNodeCIDRMaskSize = 24
	DefaultNodeNamePattern  = "node-{i}"
	DefaultSeed             = 1
	DefaultAffinityTimeout  = 10800
	DefaultIPVSScheduler    = "rr"
	// MaxEndpointsPerSlice is where the EndpointSlice controller splits.
	MaxEndpointsPerSlice = 100
	// apiMaxEndpointsPerSlice is the API server's limit for one slice.
	apiMaxEndpointsPerSlice = 1000
)

var (
	DefaultMinSyncPeriod = metav1.Duration{Duration: time.Second}
	DefaultSyncPeriod    = metav1.Duration{Duration: 30 * time.Second}
)

// Enumerations.
var (
	IPVSSchedulers   = []string{"rr", "wrr", "lc", "wlc", "sed", "nq", "sh", "dh", "mh"}
	IPTablesBackends = []string{"nft", "legacy"}
	IPTablesAffinity = []string{"recent", "ipset"}
	NFTablesLayouts  = []string{"kube-proxy", "fast"}
	Placements       = []string{"spread", "random", "skewed", "weighted"}
	DistKinds        = []string{"fixed", "uniform", "zipf", "lognormal"}
	SourcePortModes  = []string{"random", "sequential", "fixed"}
	EventTypes       = []string{EventReadiness, EventFlap, EventDeletePod, EventScale, EventServiceUpdate}
	CheckTypes       = []string{CheckDistribution, CheckAffinity, CheckInternalTrafficLocal, CheckNoEndpoints, CheckFlapping, CheckTerminating,
		CheckExternalDistribution, CheckExternalLocalBalance, CheckExternalAffinity, CheckSourceAddress, CheckHealthCheck, CheckSourceRanges,
		CheckHairpin, CheckServiceCIDR, CheckUDPFlow, CheckTCPEstablished, CheckAffinityMoves}
)

func oneOf(v string, set []string) bool {
	for _, s := range set {
		if v == s {
			return true
		}
	}
	return false
}

func choices(set []string) string { return strings.Join(set, ", ") }

// validate checks a decoded scenario and fills its defaults. It reports every
// problem it finds, each located by position and field path.
func validate(l *Loaded) ErrorList {
	v := &validator{r: reporter{file: l.File, pos: l.pos}, sc: l.Scenario, warns: &l.Warnings}
	v.header()
	v.cluster()
	v.proxy()
	v.objects()
	v.generate()
	v.nodePortDemand()
	v.traffic()
	v.events()
	v.checks()
	return v.r.errs
}

type validator struct {
	r     reporter
	sc    *Scenario
	warns *ErrorList
	// ignored are the objects accepted and not modelled (IPv6 and FQDN
	// EndpointSlices, IPv6-only Services and their slices), by path; they
	// are dropped from the scenario's objects after validation.
	ignored map[string]bool

	serviceCIDR, podCIDR, nodeNet, extNet netip.Prefix
	nodes                                 map[string]*nodeRef
	services                              map[string]*svcRef // "ns/name"
	clusterIPs                            map[netip.Addr]string
	nodePorts                             map[int32]nodePortOwner
}

// nodePortOwner is the service port that requested a node port.
type nodePortOwner struct {
	service string // "ns/name"
	port    int32  // -1: the Service's health check node port
	path    string
}

type nodeRef struct {
	podCIDR netip.Prefix
	ip      netip.Addr // the node's IPv4 InternalIP, when the scenario gives it
}

// warn records a warning for path, located as an error would be.
func (v *validator) warn(path string, format string, args ...any) {
	*v.warns = append(*v.warns, &FieldError{File: v.r.file, Pos: v.r.lookup(path), Field: path, Message: fmt.Sprintf(format, args...)})
}

type svcRef struct {
	// ports are the port names in spec order; "" is the unnamed port of a
	// single-port Service.
	ports []string
	// seedNamed is the name the generator gives a generated Service's one
	// port when the seed chooses it as named (0 < generate.ports.named < 1):
	// the port is named so in some runs and unnamed in others.
	seedNamed string
	headless  bool // clusterIP: None: kube-proxy programs nothing for it
	// noRules says why kube-proxy programs nothing for a Service that is not
	// headless (ExternalName; IPv6 only); "" when it does.
	noRules   string
	pods      map[string]bool // endpoint targetRef names (objects only)
	addrs     map[string]bool // endpoint addresses (objects only)
	generated bool
	endpoints int // objects only
	typ       corev1.ServiceType
	// externalIPs: the Service has spec.externalIPs.
	externalIPs bool
	// What the external checks need of it: node ports (given or to be
	// allocated), a load-balancer ingress address in ipMode VIP, source
	// ranges, a health check node port, ClientIP affinity.
	nodePorts, lbIP, ranges, healthCheck, affinity bool
	// protocols are the ports' protocols by port name (objects only).
	protocols map[string]corev1.Protocol
}

func (r *svcRef) hasPort(name string) bool { return slices.Contains(r.ports, name) }

// portList names a Service's ports for a message: "http, metrics", or
// "an unnamed port".
func (r *svcRef) portList() string {
	if len(r.ports) == 1 && r.ports[0] == "" {
		if r.seedNamed != "" {
			return fmt.Sprintf("one port, unnamed or named %q depending on the seed", r.seedNamed)
		}
		return "one unnamed port"
	}
	if len(r.ports) == 1 {
		return "port " + r.ports[0]
	}
	return "ports " + strings.Join(r.ports, ", ")
}

func (v *validator) header() {
	if v.sc.APIVersion != APIVersion {
		v.r.at("apiVersion", "must be %q, got %q", APIVersion, v.sc.APIVersion)
	}
	if v.sc.Kind != Kind {
		v.r.at("kind", "must be %q, got %q", Kind, v.sc.Kind)
	}
	if v.sc.Metadata.Name == "" {
		v.r.at("metadata.name", "required: name the scenario (it names the results folder)")
	} else if errs := validation.IsDNS1123Subdomain(v.sc.Metadata.Name); len(errs) > 0 {
		v.r.at("metadata.name", "%q is not a valid name: %s", v.sc.Metadata.Name, errs[0])
	}
	if v.sc.Seed == nil {
		s := uint64(DefaultSeed)
		v.sc.Seed = &s
	}
}

func (v *validator) prefix(path, s, def string) netip.Prefix {
	if s == "" {
		s = def
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		v.r.at(path, "%q is not a CIDR such as 10.96.0.0/16", s)
		return netip.Prefix{}
	}
	if !p.Addr().Is4() {
		v.r.at(path, "%q: only IPv4 is supported", s)
		return netip.Prefix{}
	}
	if p.Masked() != p {
		v.r.at(path, "%q has host bits set; the network is %s", s, p.Masked())
		return netip.Prefix{}
	}
	return p
}

func (v *validator) cluster() {
	c := &v.sc.Cluster
	v.serviceCIDR = v.prefix("cluster.serviceCIDR", c.ServiceCIDR, DefaultServiceCIDR)
	v.podCIDR = v.prefix("cluster.podCIDR", c.PodCIDR, DefaultPodCIDR)
	v.nodeNet = v.prefix("cluster.nodeNetwork", c.NodeNetwork, DefaultNodeNetwork)
	v.extNet = v.prefix("cluster.externalNetwork", c.ExternalNetwork, DefaultExternalNetwork)
	if c.ExternalNetwork == "" {
		c.ExternalNetwork = DefaultExternalNetwork
	}
	if c.ServiceCIDR == "" {
		c.ServiceCIDR = DefaultServiceCIDR
	}
	if c.PodCIDR == "" {
		c.PodCIDR = DefaultPodCIDR
	}
	if c.NodeNetwork == "" {
		c.NodeNetwork = DefaultNodeNetwork
	}
	pairs := []struct {
		a, b   netip.Prefix
		pa, pb string
	}{
		{v.serviceCIDR, v.podCIDR, "cluster.serviceCIDR", "cluster.podCIDR"},
		{v.serviceCIDR, v.nodeNet, "cluster.serviceCIDR", "cluster.nodeNetwork"},
		{v.podCIDR, v.nodeNet, "cluster.podCIDR", "cluster.nodeNetwork"},
		{v.serviceCIDR, v.extNet, "cluster.serviceCIDR", "cluster.externalNetwork"},
		{v.podCIDR, v.extNet, "cluster.podCIDR", "cluster.externalNetwork"},
		{v.nodeNet, v.extNet, "cluster.nodeNetwork", "cluster.externalNetwork"},
	}
	for _, p := range pairs {
		if p.a.IsValid() && p.b.IsValid() && p.a.Overlaps(p.b) {
			v.r.at(p.pb, "%s overlaps %s %s", p.b, p.pa, p.a)
		}
	}
	if c.NodeCIDRMaskSize == 0 {
		c.NodeCIDRMaskSize = DefaultNodeCIDRMaskSize
	}
	if v.podCIDR.IsValid() && (c.NodeCIDRMaskSize < v.podCIDR.Bits() || c.NodeCIDRMaskSize > 30) {
		v.r.at("cluster.nodeCIDRMaskSize", "must be between the pod CIDR's prefix length %d and 30, got %d", v.podCIDR.Bits(), c.NodeCIDRMaskSize)
	}
	if len(c.Nodes) > 0 && c.NodeCount > 0 {
		v.r.at("cluster.nodeCount", "give either nodes or nodeCount, not both")
	}
	if c.NodeCount < 0 || c.NodeCount > 5000 {
		v.r.at("cluster.nodeCount", "must be between 1 and 5000, got %d", c.NodeCount)
	}
	if c.NodeNamePattern == "" {
		c.NodeNamePattern = DefaultNodeNamePattern
	} else if !strings.Contains(c.NodeNamePattern, "{i}") {
		v.r.at("cluster.nodeNamePattern", "must contain {i} (the node's index), got %q", c.NodeNamePattern)
	}
	for i, z := range c.Zones {
		if z == "" {
			v.r.at(fmt.Sprintf("cluster.zones[%d]", i), "zone names must not be empty")
		}
	}
	v.nodes = map[string]*nodeRef{}
	for i, n := range c.Nodes {
		path := fmt.Sprintf("cluster.nodes[%d]", i)
		v.node(path, n.Name, n.PodCIDR, n.IP)
	}
	if c.NodeCount > 0 && strings.Contains(c.NodeNamePattern, "{i}") {
		for i := 1; i <= c.NodeCount; i++ {
			name := NodeName(c.NodeNamePattern, i)
			if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
				v.r.at("cluster.nodeNamePattern", "gives node name %q: %s", name, errs[0])
				break
			}
			v.nodes[name] = &nodeRef{}
		}
	}
}

// NodeName expands a node name pattern for the 1-based index i.
func NodeName(pattern string, i int) string {
	return strings.ReplaceAll(pattern, "{i}", fmt.Sprint(i))
}

func (v *validator) node(path, name, podCIDR, ip string) *nodeRef {
	if name == "" {
		v.r.at(path+".name", "required")
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		v.r.at(path+".name", "%q is not a valid node name: %s", name, errs[0])
	}
	if _, dup := v.nodes[name]; dup {
		v.r.at(path+".name", "node %q is defined twice", name)
		return nil
	}
	ref := &nodeRef{}
	if podCIDR != "" {
		p := v.prefix(path+".podCIDR", podCIDR, "")
		if p.IsValid() && v.podCIDR.IsValid() {
			if !v.podCIDR.Contains(p.Addr()) || p.Bits() < v.podCIDR.Bits() {
				v.r.at(path+".podCIDR", "%s is not inside the cluster's podCIDR %s", p, v.podCIDR)
			} else {
				for other, r := range v.nodes {
					if r.podCIDR.IsValid() && r.podCIDR.Overlaps(p) {
						v.r.at(path+".podCIDR", "%s overlaps node %s's podCIDR %s", p, other, r.podCIDR)
					}
				}
				ref.podCIDR = p
			}
		}
	}
	if ip != "" {
		a, err := netip.ParseAddr(ip)
		if err != nil || !a.Is4() {
			v.r.at(path+".ip", "%q is not an IPv4 address", ip)
		} else if v.nodeNet.IsValid() && !v.nodeNet.Contains(a) {
			v.r.at(path+".ip", "%s is not inside cluster.nodeNetwork %s", a, v.nodeNet)
		} else {
			ref.ip = a
		}
	}
	v.nodes[name] = ref
	return ref
}

func (v *validator) proxy() {
	p := &v.sc.Proxy
	if len(p.Modes) == 0 {
		p.Modes = []cluster.Mode{cluster.ModeIPTables}
	}
	seen := map[cluster.Mode]bool{}
	for i, m := range p.Modes {
		path := fmt.Sprintf("proxy.modes[%d]", i)
		if !m.Valid() {
			v.r.at(path, "unknown mode %q (choose from %s)", m, cluster.ModeList())
		} else if seen[m] {
			v.r.at(path, "mode %q listed twice", m)
		}
		seen[m] = true
	}
	if p.IPVSScheduler == "" {
		p.IPVSScheduler = DefaultIPVSScheduler
	} else if !oneOf(p.IPVSScheduler, IPVSSchedulers) {
		v.r.at("proxy.ipvsScheduler", "unknown scheduler %q (choose from %s)", p.IPVSScheduler, choices(IPVSSchedulers))
	}
	if p.MinSyncPeriod == nil {
		d := DefaultMinSyncPeriod
		p.MinSyncPeriod = &d
	} else if p.MinSyncPeriod.Duration < 0 {
		v.r.at("proxy.minSyncPeriod", "must not be negative")
	}
	if p.SyncPeriod == nil {
		d := DefaultSyncPeriod
		p.SyncPeriod = &d
	} else if p.SyncPeriod.Duration <= 0 {
		v.r.at("proxy.syncPeriod", "must be positive")
	}
	if p.SyncPeriod.Duration > 0 && p.MinSyncPeriod.Duration > p.SyncPeriod.Duration {
		v.r.at("proxy.minSyncPeriod", "%s is longer than syncPeriod %s", p.MinSyncPeriod.Duration, p.SyncPeriod.Duration)
	}
	def := func(field *string, path, d string, set []string) {
		if *field == "" {
			*field = d
		} else if !oneOf(*field, set) {
			v.r.at(path, "unknown value %q (choose from %s)", *field, choices(set))
		}
	}
	def(&p.IPTablesBackend, "proxy.iptablesBackend", "nft", IPTablesBackends)
	def(&p.IPTablesAffinity, "proxy.iptablesAffinity", "recent", IPTablesAffinity)
	def(&p.NFTablesLayout, "proxy.nftablesLayout", "kube-proxy", NFTablesLayouts)
}

func (v *validator) objects() {
	v.services = map[string]*svcRef{}
	v.clusterIPs = map[netip.Addr]string{}
	v.nodePorts = map[int32]nodePortOwner{}
	// Nodes first, so that every other kind can refer to them.
	v.ignored = map[string]bool{}
	for _, o := range v.sc.Objects {
		if n, ok := o.Object.(*corev1.Node); ok {
			v.nodeObject(o.Path, n)
		}
	}
	if len(v.nodes) == 0 {
		v.r.at("cluster", "the cluster has no nodes: give cluster.nodes, cluster.nodeCount, or Node objects")
	}
	for _, o := range v.sc.Objects {
		if s, ok := o.Object.(*corev1.Service); ok {
			v.service(o.Path, s)
		}
	}
	slices := map[string]string{}
	for _, o := range v.sc.Objects {
		switch x := o.Object.(type) {
		case *discoveryv1.EndpointSlice:
			if v.sliceIgnored(o.Path, x) {
				continue
			}
			key := x.Namespace + "/" + x.Name
			if prev, dup := slices[key]; dup && x.Name != "" {
				v.r.at(o.Path+".metadata.name", "EndpointSlice %s is also defined at %s", key, prev)
			}
			slices[key] = o.Path
			v.slice(o.Path, x)
		case *corev1.Pod:
			v.pod(o.Path, x)
		}
	}
	if len(v.ignored) > 0 {
		kept := v.sc.Objects[:0:0]
		for _, o := range v.sc.Objects {
			if !v.ignored[o.Path] {
				kept = append(kept, o)
			}
		}
		v.sc.Objects = kept
	}
}

// nodeObject registers a v1 Node: its IPv4 pod block (spec.podCIDR, or the
// IPv4 entry of a dual-stack node's spec.podCIDRs; the IPv6 one is ignored
// with a warning) and its IPv4 InternalIP (host-network endpoints have it).
// The Node is rewritten to its IPv4 part.
func (v *validator) nodeObject(path string, n *corev1.Node) {
	cidr := n.Spec.PodCIDR
	if len(n.Spec.PodCIDRs) > 1 || (cidr != "" && !strings.Contains(cidr, ".")) {
		var v4, rest []string
		for _, c := range append([]string{n.Spec.PodCIDR}, n.Spec.PodCIDRs...) {
			if c == "" || slices.Contains(v4, c) || slices.Contains(rest, c) {
				continue
			}
			if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() {
				rest = append(rest, c)
			} else {
				v4 = append(v4, c)
			}
		}
		switch {
		case len(v4) > 1:
			v.r.at(path+".spec.podCIDRs", "only one IPv4 pod CIDR per node is supported, got %s", strings.Join(v4, ", "))
		case len(rest) > 0:
			v.warn(path+".spec.podCIDRs", "node %s: IPv6 pod CIDR %s ignored (IPv4 only)", n.Name, strings.Join(rest, ", "))
		}
		cidr = ""
		if len(v4) > 0 {
			cidr = v4[0]
		}
		n.Spec.PodCIDR = cidr
		n.Spec.PodCIDRs = nil
		if cidr != "" {
			n.Spec.PodCIDRs = []string{cidr}
		}
	}
	ref := v.node(path, n.Name, cidr, "")
	if ref == nil {
		return
	}
	if a, ok := NodeIPv4(n); ok {
		ref.ip = a
	} else if len(n.Status.Addresses) > 0 {
		v.warn(path+".status.addresses", "node %s has no IPv4 InternalIP: it gets one from cluster.nodeNetwork", n.Name)
	}
}

// sliceIgnored reports whether an EndpointSlice is accepted and not
// modelled, as kube-proxy in an IPv4 cluster ignores it: an IPv6 or FQDN
// slice, or a slice of an ignored Service. It warns, naming the slice.
func (v *validator) sliceIgnored(path string, s *discoveryv1.EndpointSlice) bool {
	defaultNamespace(&s.ObjectMeta)
	name := s.Namespace + "/" + s.Name
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
		v.warn(path+".addressType", "EndpointSlice %s (%s) ignored: kube-proxy here uses IPv4 slices only", name, s.AddressType)
		v.ignored[path] = true
		return true
	}
	if ref := v.services[s.Namespace+"/"+s.Labels[discoveryv1.LabelServiceName]]; ref != nil && ref.noRules != "" && !ref.headless {
		v.ignored[path] = true
		return true
	}
	return false
}

func defaultNamespace(m *metav1.ObjectMeta) {
	if m.Namespace == "" {
		m.Namespace = "default"
	}
}

func (v *validator) meta(path string, m *metav1.ObjectMeta, dns1035 bool) bool {
	defaultNamespace(m)
	ok := true
	if m.Name == "" {
		v.r.at(path+".metadata.name", "required")
		ok = false
	} else {
		check := validation.IsDNS1123Subdomain
		if dns1035 {
			check = validation.IsDNS1035Label
		}
		if errs := check(m.Name); len(errs) > 0 {
			v.r.at(path+".metadata.name", "%q is not a valid name: %s", m.Name, errs[0])
			ok = false
		}
	}
	if errs := validation.IsDNS1123Label(m.Namespace); len(errs) > 0 {
		v.r.at(path+".metadata.namespace", "%q is not a valid namespace: %s", m.Namespace, errs[0])
		ok = false
	}
	return ok
}

// service checks a Service as the API server would, within what kube-proxy
// load-balances here, and fills in the API's defaults. The steps run in the
// order the errors are reported.
func (v *validator) service(path string, s *corev1.Service) {
	key, ref := v.serviceRef(path, s)
	sp := path + ".spec"
	v.serviceType(sp, s, ref)
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		// A DNS name, no rules: kube-proxy skips it. The API server still
		// requires the name and valid ports, if any.
		if s.Spec.ExternalName == "" {
			v.r.at(sp+".externalName", "required for an ExternalName Service")
		}
		for i := range s.Spec.Ports {
			v.servicePort(fmt.Sprintf("%s.ports[%d]", sp, i), key, s, i, ref, map[portKey]bool{})
		}
		return
	}
	v.clusterIP(path, key, s, ref)
	v.servicePorts(sp, key, s, ref)
	v.trafficDistribution(sp, s)
	if s.Spec.AllocateLoadBalancerNodePorts != nil && s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		v.r.at(sp+".allocateLoadBalancerNodePorts", "applies only to LoadBalancer Services")
	}
	v.sessionAffinity(sp, s)
	v.trafficPolicies(sp, s)
	v.externalIPs(sp, s)
	v.sourceRanges(sp, s)
	v.healthCheckNodePort(sp, key, s)
	v.loadBalancerStatus(path+".status.loadBalancer", s)
	ref.nodePorts = allocatesNodePorts(s) || slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.NodePort != 0 })
	ref.lbIP = slices.ContainsFunc(s.Status.LoadBalancer.Ingress, func(in corev1.LoadBalancerIngress) bool {
		a, err := netip.ParseAddr(in.IP)
		return err == nil && a.Is4() && (in.IPMode == nil || *in.IPMode == corev1.LoadBalancerIPModeVIP)
	})
	ref.ranges = len(s.Spec.LoadBalancerSourceRanges) > 0
	ref.healthCheck = NeedsHealthCheck(s)
	ref.affinity = s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP
	ref.protocols = map[string]corev1.Protocol{}
	for _, p := range s.Spec.Ports {
		ref.protocols[p.Name] = p.Protocol
	}
}

// serviceRef checks the Service's name and registers what the later
// sections look it up by; a Service with a bad or duplicate name is not
// registered (its reference is still returned, to collect its ports).
func (v *validator) serviceRef(path string, s *corev1.Service) (string, *svcRef) {
	ok := v.meta(path, &s.ObjectMeta, true)
	key := s.Namespace + "/" + s.Name
	if ok {
		if _, dup := v.services[key]; dup {
			v.r.at(path+".metadata.name", "Service %s is defined twice", key)
			ok = false
		}
	}
	ref := &svcRef{pods: map[string]bool{}, addrs: map[string]bool{}, typ: s.Spec.Type, headless: s.Spec.ClusterIP == corev1.ClusterIPNone,
		externalIPs: len(s.Spec.ExternalIPs) > 0}
	if ok {
		v.services[key] = ref
	}
	return key, ref
}

// serviceType defaults the type to ClusterIP; an ExternalName Service is
// accepted and, as in kube-proxy, gets no rules.
func (v *validator) serviceType(sp string, s *corev1.Service, ref *svcRef) {
	switch s.Spec.Type {
	case "":
		s.Spec.Type = corev1.ServiceTypeClusterIP
		ref.typ = s.Spec.Type
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	case corev1.ServiceTypeExternalName:
		ref.noRules = "an ExternalName Service (a DNS name)"
	default:
		v.r.at(sp+".type", "unknown Service type %q (ClusterIP, NodePort, LoadBalancer or ExternalName)", s.Spec.Type)
	}
}

// clusterIP checks a requested cluster IP: IPv4, inside the service CIDR
// and given to one Service only. Of a dual-stack Service (clusterIPs,
// ipFamilies) the IPv4 part is used and the rest ignored with a warning; an
// IPv6-only Service is ignored with a warning, its slices with it.
func (v *validator) clusterIP(path, key string, s *corev1.Service, ref *svcRef) {
	sp := path + ".spec"
	if len(s.Spec.ClusterIPs) > 1 || (s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone && strings.Contains(s.Spec.ClusterIP, ":")) {
		var v4, v6 []string
		for _, c := range append([]string{s.Spec.ClusterIP}, s.Spec.ClusterIPs...) {
			if c == "" || c == corev1.ClusterIPNone || slices.Contains(v4, c) || slices.Contains(v6, c) {
				continue
			}
			if a, err := netip.ParseAddr(c); err == nil && a.Is6() {
				v6 = append(v6, c)
			} else {
				v4 = append(v4, c)
			}
		}
		switch {
		case len(v4) > 1:
			v.r.at(sp+".clusterIPs", "a Service has at most one IPv4 ClusterIP, got %s", strings.Join(v4, ", "))
			return
		case len(v4) == 0 && len(v6) > 0:
			v.warn(sp+".clusterIP", "Service %s ignored: it has only IPv6 ClusterIPs (%s), and IPv4 is what is modelled", key, strings.Join(v6, ", "))
			ref.noRules = "an IPv6-only Service (ignored)"
			v.ignored[path] = true
			return
		case len(v6) > 0:
			v.warn(sp+".clusterIPs", "Service %s is dual-stack: its IPv4 ClusterIP %s is used, IPv6 %s ignored", key, v4[0], strings.Join(v6, ", "))
		}
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			s.Spec.ClusterIP = v4[0]
		}
		s.Spec.ClusterIPs = v4
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
		// One family left: RequireDualStack would now be invalid (an API
		// server refuses it with one ClusterIP).
		if p := s.Spec.IPFamilyPolicy; p != nil && *p == corev1.IPFamilyPolicyRequireDualStack {
			single := corev1.IPFamilyPolicySingleStack
			s.Spec.IPFamilyPolicy = &single
		}
	}
	if s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone {
		a, err := netip.ParseAddr(s.Spec.ClusterIP)
		switch {
		case err != nil || !a.Is4():
			v.r.at(sp+".clusterIP", "%q is not an IPv4 address", s.Spec.ClusterIP)
		case v.serviceCIDR.IsValid() && !v.serviceCIDR.Contains(a):
			v.r.at(sp+".clusterIP", "%s is not inside cluster.serviceCIDR %s", a, v.serviceCIDR)
		default:
			if other, dup := v.clusterIPs[a]; dup {
				v.r.at(sp+".clusterIP", "%s is already the clusterIP of %s", a, other)
			}
			v.clusterIPs[a] = key
		}
	}
}

// trafficDistribution checks the Service's trafficDistribution: the values
// the API accepts (PreferClose, and PreferSameZone and PreferSameNode, GA in
// Kubernetes 1.35).
func (v *validator) trafficDistribution(sp string, s *corev1.Service) {
	d := s.Spec.TrafficDistribution
	if d == nil {
		return
	}
	switch *d {
	case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone, corev1.ServiceTrafficDistributionPreferSameNode:
	default:
		v.r.at(sp+".trafficDistribution", "unknown value %q (PreferClose, PreferSameZone or PreferSameNode)", *d)
	}
}

// portKey is a Service port's number and protocol, unique in a Service.
type portKey struct {
	port  int32
	proto corev1.Protocol
}

// servicePorts checks that the Service has ports and checks each one,
// collecting their names in ref.
func (v *validator) servicePorts(sp, key string, s *corev1.Service, ref *svcRef) {
	if len(s.Spec.Ports) == 0 && s.Spec.ClusterIP != corev1.ClusterIPNone {
		v.r.at(sp+".ports", "a Service needs at least one port")
	}
	seenPort := map[portKey]bool{}
	for i := range s.Spec.Ports {
		v.servicePort(fmt.Sprintf("%s.ports[%d]", sp, i), key, s, i, ref, seenPort)
	}
}

// servicePort checks the i-th port of a Service: its name (required and
// unique when there are several), protocol (defaulted to TCP), number
// (unique with its protocol), target port (defaulted to the port) and
// node port, if it requests one.
func (v *validator) servicePort(pp, key string, s *corev1.Service, i int, ref *svcRef, seenPort map[portKey]bool) {
	p := s.Spec.Ports[i]
	if len(s.Spec.Ports) > 1 && p.Name == "" {
		v.r.at(pp+".name", "required when a Service has more than one port")
	}
	if p.Name != "" {
		if errs := validation.IsDNS1123Label(p.Name); len(errs) > 0 {
			v.r.at(pp+".name", "%q is not a valid port name: %s", p.Name, errs[0])
		}
		if ref.hasPort(p.Name) {
			v.r.at(pp+".name", "port name %q is used twice", p.Name)
		}
	}
	ref.ports = append(ref.ports, p.Name)
	switch p.Protocol {
	case "":
		s.Spec.Ports[i].Protocol = corev1.ProtocolTCP
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
	default:
		v.r.at(pp+".protocol", "unknown protocol %q (TCP, UDP or SCTP)", p.Protocol)
	}
	if errs := validation.IsValidPortNum(int(p.Port)); len(errs) > 0 {
		v.r.at(pp+".port", "%d: %s", p.Port, errs[0])
	}
	k := portKey{p.Port, s.Spec.Ports[i].Protocol}
	if seenPort[k] {
		v.r.at(pp+".port", "port %d/%s is used twice", p.Port, k.proto)
	}
	seenPort[k] = true
	switch p.TargetPort.Type {
	case intstr.Int:
		if p.TargetPort.IntVal == 0 {
			s.Spec.Ports[i].TargetPort = intstr.FromInt32(p.Port)
		} else if errs := validation.IsValidPortNum(int(p.TargetPort.IntVal)); len(errs) > 0 {
			v.r.at(pp+".targetPort", "%d: %s", p.TargetPort.IntVal, errs[0])
		}
	case intstr.String:
		if errs := validation.IsValidPortName(p.TargetPort.StrVal); len(errs) > 0 {
			v.r.at(pp+".targetPort", "%q is neither a port number nor a valid port name: %s", p.TargetPort.StrVal, errs[0])
		}
	}
	if p.NodePort != 0 {
		v.nodePort(pp+".nodePort", key, s, p)
	}
}

// sessionAffinity defaults the affinity to None and a ClientIP affinity's
// timeout to DefaultAffinityTimeout, and checks a given timeout's range.
func (v *validator) sessionAffinity(sp string, s *corev1.Service) {
	switch s.Spec.SessionAffinity {
	case "":
		s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	case corev1.ServiceAffinityNone:
		if s.Spec.SessionAffinityConfig != nil {
			v.r.at(sp+".sessionAffinityConfig", "set only with sessionAffinity: ClientIP")
		}
	case corev1.ServiceAffinityClientIP:
		if s.Spec.SessionAffinityConfig == nil || s.Spec.SessionAffinityConfig.ClientIP == nil || s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds == nil {
			t := int32(DefaultAffinityTimeout)
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
		} else if t := *s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds; t < 1 || t > 86400 {
			v.r.at(sp+".sessionAffinityConfig.clientIP.timeoutSeconds", "must be between 1 and 86400, got %d", t)
		}
	default:
		v.r.at(sp+".sessionAffinity", "unknown value %q (None or ClientIP)", s.Spec.SessionAffinity)
	}
}

// trafficPolicies checks the internal and external traffic policies; an
// external policy of Local needs an externally accessible Service.
func (v *validator) trafficPolicies(sp string, s *corev1.Service) {
	if s.Spec.InternalTrafficPolicy != nil {
		switch *s.Spec.InternalTrafficPolicy {
		case corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal:
		default:
			v.r.at(sp+".internalTrafficPolicy", "unknown value %q (Cluster or Local)", *s.Spec.InternalTrafficPolicy)
		}
	}
	switch s.Spec.ExternalTrafficPolicy {
	case "":
	case corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal:
		if !externallyAccessible(s) && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			v.r.at(sp+".externalTrafficPolicy", "Local applies only to externally accessible Services (NodePort, LoadBalancer, or ClusterIP with externalIPs)")
		}
	default:
		v.r.at(sp+".externalTrafficPolicy", "unknown value %q (Cluster or Local)", s.Spec.ExternalTrafficPolicy)
	}
}

// externallyAccessible is apiservice.ExternallyAccessible: a NodePort or
// LoadBalancer Service, or a ClusterIP one with external IPs.
func externallyAccessible(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer ||
		(s.Spec.Type == corev1.ServiceTypeClusterIP || s.Spec.Type == "") && len(s.Spec.ExternalIPs) > 0
}

// NeedsHealthCheck is apiservice.NeedsHealthCheck: a LoadBalancer Service
// with externalTrafficPolicy Local, which the API server gives a
// healthCheckNodePort and kube-proxy serves a health check on.
func NeedsHealthCheck(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// addressProblem says why a must be refused where the API server takes an
// external or load-balancer address (ValidateEndpointIP), or "".
func addressProblem(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "may not be unspecified"
	case a.IsLoopback():
		return "may not be in the loopback range (127.0.0.0/8)"
	case a.IsLinkLocalUnicast():
		return "may not be in the link-local range (169.254.0.0/16)"
	case a.IsLinkLocalMulticast():
		return "may not be in the link-local multicast range (224.0.0.0/24)"
	}
	return ""
}

// externalIPs checks spec.externalIPs as the API server does: each a valid
// address, not unspecified, loopback or link-local. IPv6 ones are accepted
// and ignored with a warning (IPv4 is what is modelled).
func (v *validator) externalIPs(sp string, s *corev1.Service) {
	for i, x := range s.Spec.ExternalIPs {
		path := fmt.Sprintf("%s.externalIPs[%d]", sp, i)
		a, err := netip.ParseAddr(x)
		switch {
		case err != nil:
			v.r.at(path, "%q is not a valid IP address", x)
		case addressProblem(a) != "":
			v.r.at(path, "%s %s", a, addressProblem(a))
		case a.Is6():
			v.warn(path, "IPv6 external IP %s ignored (IPv4 is what is modelled)", a)
		default:
			v.externalAddr(path, a, "external IP")
		}
	}
}

// externalAddr warns about an external or load-balancer address inside the
// cluster's pod or service range: the API server accepts it, and so does
// kube-proxy, but traffic to it is then indistinguishable from traffic to a
// pod or a cluster IP. (One in the node network is common: external IPs set
// to node addresses, MetalLB's layer-2 pools.)
func (v *validator) externalAddr(path string, a netip.Addr, what string) {
	for _, r := range []struct {
		p    netip.Prefix
		name string
	}{{v.serviceCIDR, "cluster.serviceCIDR"}, {v.podCIDR, "cluster.podCIDR"}} {
		if r.p.IsValid() && r.p.Contains(a) {
			v.warn(path, "%s %s is inside %s %s", what, a, r.name, r.p)
			return
		}
	}
}

// sourceRanges checks spec.loadBalancerSourceRanges: only on a LoadBalancer
// Service, each a CIDR (surrounding spaces allowed, as the API allows them).
func (v *validator) sourceRanges(sp string, s *corev1.Service) {
	if len(s.Spec.LoadBalancerSourceRanges) == 0 {
		return
	}
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		v.r.at(sp+".loadBalancerSourceRanges", "may only be used when type is LoadBalancer (this Service is %s)", s.Spec.Type)
	}
	for i, x := range s.Spec.LoadBalancerSourceRanges {
		path := fmt.Sprintf("%s.loadBalancerSourceRanges[%d]", sp, i)
		p, err := netip.ParsePrefix(strings.TrimSpace(x))
		switch {
		case err != nil:
			v.r.at(path, "%q is not a CIDR such as 203.0.113.0/24", x)
		case p.Addr().Is6():
			v.warn(path, "IPv6 source range %s ignored (IPv4 is what is modelled)", p)
		}
	}
}

// healthCheckNodePort checks spec.healthCheckNodePort as the API server
// does: set only on a LoadBalancer Service with externalTrafficPolicy Local
// (the expansion allocates one there when it is unset), inside the node port
// range, and held by no other Service as a node port or health check port.
func (v *validator) healthCheckNodePort(sp, key string, s *corev1.Service) {
	p := s.Spec.HealthCheckNodePort
	if p == 0 {
		return
	}
	path := sp + ".healthCheckNodePort"
	switch {
	case !NeedsHealthCheck(s):
		v.r.at(path, "%d: may only be set when type is LoadBalancer and externalTrafficPolicy is Local", p)
		return
	case p < NodePortMin || p > NodePortMax:
		v.r.at(path, "%d is outside the node port range %d-%d", p, NodePortMin, NodePortMax)
		return
	}
	if o, taken := v.nodePorts[p]; taken {
		v.r.at(path, "%d is already allocated to Service %s (%s)", p, o.service, o.path)
		return
	}
	v.nodePorts[p] = nodePortOwner{service: key, port: -1, path: path}
}

// loadBalancerStatus checks status.loadBalancer.ingress as the API server
// does (ValidateLoadBalancerStatus): only on a LoadBalancer Service; ip a
// valid address; ipMode VIP or Proxy, only with an ip, defaulted to VIP when
// an ip is set; hostname a DNS name, not an address.
func (v *validator) loadBalancerStatus(lp string, s *corev1.Service) {
	ing := s.Status.LoadBalancer.Ingress
	if len(ing) == 0 {
		return
	}
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		v.r.at(lp+".ingress", "may only be used when spec.type is LoadBalancer (this Service is %s)", s.Spec.Type)
		return
	}
	for i := range ing {
		in := &ing[i]
		ip := fmt.Sprintf("%s.ingress[%d]", lp, i)
		if in.IP != "" {
			a, err := netip.ParseAddr(in.IP)
			switch {
			case err != nil:
				v.r.at(ip+".ip", "%q is not a valid IP address", in.IP)
			case addressProblem(a) != "":
				v.r.at(ip+".ip", "%s %s", a, addressProblem(a))
			case a.Is6():
				v.warn(ip+".ip", "IPv6 load-balancer IP %s ignored (IPv4 is what is modelled)", a)
			default:
				v.externalAddr(ip+".ip", a, "load-balancer IP")
			}
		}
		switch {
		case in.IPMode == nil && in.IP != "":
			vip := corev1.LoadBalancerIPModeVIP
			in.IPMode = &vip
		case in.IPMode != nil && in.IP == "":
			v.r.at(ip+".ipMode", "may not be set without ip")
		case in.IPMode != nil && *in.IPMode != corev1.LoadBalancerIPModeVIP && *in.IPMode != corev1.LoadBalancerIPModeProxy:
			v.r.at(ip+".ipMode", "unknown value %q (VIP or Proxy)", *in.IPMode)
		}
		if in.Hostname != "" {
			if errs := validation.IsDNS1123Subdomain(in.Hostname); len(errs) > 0 {
				v.r.at(ip+".hostname", "%q is not a DNS name: %s", in.Hostname, errs[0])
			} else if _, err := netip.ParseAddr(in.Hostname); err == nil {
				v.r.at(ip+".hostname", "%q must be a DNS name, not an IP address", in.Hostname)
			}
		}
	}
}

// nodePort checks a requested node port as the API server does: only on
// NodePort and LoadBalancer Services, inside the range, and allocated once
// in the cluster. Two ports of one Service may share it only when they share
// the port number (TCP and UDP of one port).
func (v *validator) nodePort(path, key string, s *corev1.Service, p corev1.ServicePort) {
	switch {
	case s.Spec.Type == corev1.ServiceTypeClusterIP:
		v.r.at(path, "only NodePort and LoadBalancer Services have node ports")
		return
	case p.NodePort < NodePortMin || p.NodePort > NodePortMax:
		v.r.at(path, "%d is outside the node port range %d-%d", p.NodePort, NodePortMin, NodePortMax)
		return
	}
	o, taken := v.nodePorts[p.NodePort]
	switch {
	case !taken:
		v.nodePorts[p.NodePort] = nodePortOwner{service: key, port: p.Port, path: path}
	case o.port == -1:
		v.r.at(path, "node port %d is already allocated to Service %s as its health check node port (%s)", p.NodePort, o.service, o.path)
	case o.service == key && o.port == p.Port:
		// TCP and UDP of one port number share their node port.
	case o.service == key:
		v.r.at(path, "node port %d is also given to port %d of this Service (%s); ports share a node port only when they share the port number", p.NodePort, o.port, o.path)
	default:
		v.r.at(path, "node port %d is already allocated to Service %s (%s)", p.NodePort, o.service, o.path)
	}
}

// nodePortDemand checks that the node port range holds a node port for
// every port that requests one and every port that will be given one (the
// expansion allocates them).
func (v *validator) nodePortDemand() {
	need := len(v.nodePorts)
	report := func(path, what string) {
		v.r.at(path, "%s need %d node ports; the node port range %d-%d holds %d", what, need, NodePortMin, NodePortMax, nodePortRangeSize)
	}
	for _, o := range v.sc.Objects {
		s, ok := o.Object.(*corev1.Service)
		if !ok {
			continue
		}
		if NeedsHealthCheck(s) && s.Spec.HealthCheckNodePort == 0 {
			need++
		}
		if need += missingNodePorts(s); need > nodePortRangeSize {
			report(o.Path+".spec.ports", "the NodePort and LoadBalancer Services up to this one")
			return
		}
	}
	g := v.sc.Generate
	if g == nil || g.Services < 1 || g.Services > 100000 || g.Ports.PerService < 1 {
		return
	}
	// The generator makes exactly round(fraction × services) NodePort
	// Services, each port with its own port number.
	need += int(math.Round(g.ExternalTrafficPolicyLocal*float64(g.Services))) * g.Ports.PerService
	if need > nodePortRangeSize {
		report("generate.externalTrafficPolicyLocal", "the NodePort and LoadBalancer Services, generated ones included,")
	}
}

func (v *validator) inNodeCIDR(path string, a netip.Addr, node string) {
	if v.podCIDR.IsValid() && !v.podCIDR.Contains(a) {
		v.r.at(path, "%s is not inside the cluster's podCIDR %s", a, v.podCIDR)
		return
	}
	if node == "" {
		return
	}
	if n, ok := v.nodes[node]; ok && n.podCIDR.IsValid() && !n.podCIDR.Contains(a) {
		v.r.at(path, "%s is not inside node %s's podCIDR %s", a, node, n.podCIDR)
	}
}

// endpointAddr checks where an endpoint address may be, as kube-proxy
// DNATs to any: in its node's pod block; or the node's own address (a
// host-network pod); or, for an endpoint that names no node, any node's
// address or an address outside the cluster's ranges (default/kubernetes
// points at the control plane's addresses, which on a managed cluster are
// no node's).
func (v *validator) endpointAddr(path string, a netip.Addr, node string) {
	if n, ok := v.nodes[node]; ok && n.ip == a {
		return
	}
	if node == "" {
		for _, n := range v.nodes {
			if n.ip == a {
				return
			}
		}
		if !v.podCIDR.Contains(a) {
			if v.serviceCIDR.IsValid() && v.serviceCIDR.Contains(a) {
				v.r.at(path, "%s is inside cluster.serviceCIDR %s: an endpoint is a pod's or a host's address", a, v.serviceCIDR)
			}
			return
		}
	}
	v.inNodeCIDR(path, a, node)
}

func (v *validator) slice(path string, s *discoveryv1.EndpointSlice) {
	v.meta(path, &s.ObjectMeta, false)
	svcName := s.Labels[discoveryv1.LabelServiceName]
	var ref *svcRef
	if svcName == "" {
		v.r.at(path+".metadata.labels", "needs the label %s naming its Service", discoveryv1.LabelServiceName)
	} else if ref = v.services[s.Namespace+"/"+svcName]; ref == nil {
		v.r.at(path+".metadata.labels."+discoveryv1.LabelServiceName, "Service %s/%s is not defined in this scenario", s.Namespace, svcName)
	}
	if s.AddressType != discoveryv1.AddressTypeIPv4 {
		v.r.at(path+".addressType", "must be IPv4 (IPv6 and FQDN slices are ignored), got %q", s.AddressType)
	}
	if len(s.Endpoints) > apiMaxEndpointsPerSlice {
		v.r.at(path+".endpoints", "%d endpoints: the API allows at most %d per slice", len(s.Endpoints), apiMaxEndpointsPerSlice)
	}
	for i, p := range s.Ports {
		pp := fmt.Sprintf("%s.ports[%d]", path, i)
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if ref != nil && !ref.hasPort(name) {
			v.r.at(pp+".name", "Service %s has no port named %q", svcName, name)
		}
		if p.Port == nil {
			v.r.at(pp+".port", "required")
		} else if errs := validation.IsValidPortNum(int(*p.Port)); len(errs) > 0 {
			v.r.at(pp+".port", "%d: %s", *p.Port, errs[0])
		}
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP && *p.Protocol != corev1.ProtocolUDP && *p.Protocol != corev1.ProtocolSCTP {
			v.r.at(pp+".protocol", "unknown protocol %q (TCP, UDP or SCTP)", *p.Protocol)
		}
	}
	for i, e := range s.Endpoints {
		ep := fmt.Sprintf("%s.endpoints[%d]", path, i)
		if len(e.Addresses) != 1 {
			v.r.at(ep+".addresses", "an endpoint has exactly one address, got %d", len(e.Addresses))
		}
		node := ""
		if e.NodeName != nil {
			node = *e.NodeName
			if _, ok := v.nodes[node]; !ok {
				v.r.at(ep+".nodeName", "node %q is not defined", node)
			}
		}
		for j, addr := range e.Addresses {
			a, err := netip.ParseAddr(addr)
			ap := fmt.Sprintf("%s.addresses[%d]", ep, j)
			if err != nil || !a.Is4() {
				v.r.at(ap, "%q is not an IPv4 address", addr)
				continue
			}
			v.endpointAddr(ap, a, node)
			if ref != nil {
				ref.addrs[addr] = true
			}
		}
		if ref != nil {
			ref.endpoints++
			if e.TargetRef != nil && e.TargetRef.Name != "" {
				ref.pods[e.TargetRef.Name] = true
			}
		}
	}
}

func (v *validator) pod(path string, p *corev1.Pod) {
	v.meta(path, &p.ObjectMeta, false)
	if p.Spec.NodeName != "" {
		if _, ok := v.nodes[p.Spec.NodeName]; !ok {
			v.r.at(path+".spec.nodeName", "node %q is not defined", p.Spec.NodeName)
		}
	}
	if p.Status.PodIP != "" {
		if a, ok := PodIPv4(p); ok && a.String() != p.Status.PodIP {
			// dual-stack, IPv6 first: the IPv4 address is the one used
			p.Status.PodIP = a.String()
		}
		a, err := netip.ParseAddr(p.Status.PodIP)
		switch {
		case err == nil && a.Is6():
			v.warn(path+".status.podIP", "Pod %s/%s has only IPv6 addresses: ignored as an endpoint source", p.Namespace, p.Name)
			p.Status.PodIP = ""
		case err != nil || !a.Is4():
			v.r.at(path+".status.podIP", "%q is not an IPv4 address", p.Status.PodIP)
		case p.Spec.HostNetwork:
		case v.isNodeIP(a):
			// a host-network pod whose spec the dump trimmed
		default:
			v.inNodeCIDR(path+".status.podIP", a, p.Spec.NodeName)
		}
	}
}

func (v *validator) isNodeIP(a netip.Addr) bool {
	for _, n := range v.nodes {
		if n.ip == a {
			return true
		}
	}
	return false
}

func (v *validator) fraction(path string, f float64) {
	if f < 0 || f > 1 {
		v.r.at(path, "a fraction must be between 0 and 1, got %g", f)
	}
}

// generate checks the generate section and fills in its defaults, then
// registers the Services it will make, so that EndpointSlices, checks and
// traffic may name them.
func (v *validator) generate() {
	g := v.sc.Generate
	if g == nil {
		return
	}
	v.generateNames(g)
	v.endpointsPerService(&g.EndpointsPerService)
	v.placement(g)
	v.generatePorts(&g.Ports)
	v.generateFractions(g)
	if g.Services < 1 || g.Namespaces < 1 || g.Services > 100000 {
		return
	}
	v.generatedRefs(g)
}

// generateNames checks the number of Services and namespaces and the name
// prefix, defaulting to one namespace and "svc-".
func (v *validator) generateNames(g *Generate) {
	if g.Services < 1 || g.Services > 100000 {
		v.r.at("generate.services", "must be between 1 and 100000, got %d", g.Services)
	}
	if g.Namespaces == 0 {
		g.Namespaces = 1
	} else if g.Namespaces < 0 || g.Namespaces > g.Services {
		v.r.at("generate.namespaces", "must be between 1 and the number of Services, got %d", g.Namespaces)
	}
	if g.NamePrefix == "" {
		g.NamePrefix = "svc-"
	} else if errs := validation.IsDNS1035Label(g.NamePrefix + "1"); len(errs) > 0 {
		v.r.at("generate.namePrefix", "%q does not make valid Service names: %s", g.NamePrefix, errs[0])
	}
}

// endpointsPerService checks the distribution of endpoint counts: its kind
// and the parameters that kind needs, within 0..1000 endpoints.
func (v *validator) endpointsPerService(d *Distribution) {
	dp := "generate.endpointsPerService"
	switch d.Kind {
	case "fixed":
		if d.Value < 0 || d.Value > 1000 {
			v.r.at(dp+".value", "must be between 0 and 1000, got %d", d.Value)
		}
		d.Min, d.Max = d.Value, d.Value
	case "uniform", "zipf", "lognormal":
		if d.Min < 0 || d.Max < d.Min || d.Max > 1000 {
			v.r.at(dp, "needs 0 <= min <= max <= 1000, got min %d, max %d", d.Min, d.Max)
		}
		if d.Kind == "zipf" && d.S <= 0 {
			v.r.at(dp+".s", "the zipf exponent must be positive, got %g", d.S)
		}
		if d.Kind == "lognormal" && d.Sigma <= 0 {
			v.r.at(dp+".sigma", "must be positive, got %g", d.Sigma)
		}
	case "":
		v.r.at(dp+".kind", "required (choose from %s)", choices(DistKinds))
	default:
		v.r.at(dp+".kind", "unknown distribution %q (choose from %s)", d.Kind, choices(DistKinds))
	}
}

// generatePorts checks the generated ports, defaulting to one port 80 with
// target port 8080: every port number of a Service's consecutive run must
// be valid.
func (v *validator) generatePorts(p *PortGenerator) {
	if p.PerService == 0 {
		p.PerService = 1
	} else if p.PerService < 1 || p.PerService > 20 {
		v.r.at("generate.ports.perService", "must be between 1 and 20, got %d", p.PerService)
	}
	v.fraction("generate.ports.named", p.Named)
	v.fraction("generate.ports.udp", p.UDP)
	if p.Port == 0 {
		p.Port = 80
	}
	if p.TargetPort == 0 {
		p.TargetPort = 8080
	}
	if p.Port < 1 || int(p.Port)+p.PerService-1 > 65535 {
		v.r.at("generate.ports.port", "ports %d..%d are not valid port numbers", p.Port, int(p.Port)+p.PerService-1)
	}
	if p.TargetPort < 1 || int(p.TargetPort)+p.PerService-1 > 65535 {
		v.r.at("generate.ports.targetPort", "ports %d..%d are not valid port numbers", p.TargetPort, int(p.TargetPort)+p.PerService-1)
	}
}

// generateFractions checks the fractions of Services and endpoints that get
// each property, and the affinity timeout (default DefaultAffinityTimeout).
func (v *validator) generateFractions(g *Generate) {
	v.fraction("generate.sessionAffinity.fraction", g.SessionAffinity.Fraction)
	if g.SessionAffinity.TimeoutSeconds == 0 {
		g.SessionAffinity.TimeoutSeconds = DefaultAffinityTimeout
	} else if t := g.SessionAffinity.TimeoutSeconds; t < 1 || t > 86400 {
		v.r.at("generate.sessionAffinity.timeoutSeconds", "must be between 1 and 86400, got %d", t)
	}
	v.fraction("generate.internalTrafficPolicyLocal", g.InternalTrafficPolicyLocal)
	v.fraction("generate.externalTrafficPolicyLocal", g.ExternalTrafficPolicyLocal)
	v.fraction("generate.notReady", g.NotReady)
	v.fraction("generate.terminating", g.Terminating)
	if g.NotReady+g.Terminating > 1 {
		v.r.at("generate.terminating", "notReady + terminating must not exceed 1")
	}
}

// generatedRefs registers each Service the expansion will generate, with
// the port names it will have, and stops at the first that clashes with a
// Service of the scenario's objects.
func (v *validator) generatedRefs(g *Generate) {
	p := &g.Ports
	// A single port is named or not by the seed unless the fraction makes
	// every one named or none (expand's pick takes round(named × services)).
	k := int(math.Round(p.Named * float64(g.Services)))
	for i := 0; i < g.Services; i++ {
		ns, name := GeneratedServiceName(g, i)
		key := ns + "/" + name
		if _, dup := v.services[key]; dup {
			v.r.at("generate.namePrefix", "generated Service %s clashes with an object of the same name", key)
			return
		}
		ref := &svcRef{generated: true, typ: corev1.ServiceTypeClusterIP}
		switch {
		case p.PerService > 1 || k == g.Services:
			for j := 0; j < p.PerService; j++ {
				ref.ports = append(ref.ports, GeneratedPortName(g, j, true))
			}
		case k == 0:
			ref.ports = []string{""}
		default:
			ref.ports = []string{""}
			ref.seedNamed = GeneratedPortName(g, 0, true)
		}
		v.services[key] = ref
	}
}

// GeneratedServiceName gives the namespace and name of the i-th (0-based)
// generated Service.
func GeneratedServiceName(g *Generate, i int) (string, string) {
	ns := "default"
	if g.Namespaces > 1 {
		ns = fmt.Sprintf("ns-%d", i%g.Namespaces+1)
	}
	return ns, fmt.Sprintf("%s%d", g.NamePrefix, i+1)
}

// GeneratedPortName names the j-th port of a generated Service: "p<port>"
// when named. Ports of multi-port Services are always named (the API
// requires it); a single port is named when the generator chose it.
func GeneratedPortName(g *Generate, j int, named bool) string {
	if !named && g.Ports.PerService == 1 {
		return ""
	}
	return fmt.Sprintf("p%d", int(g.Ports.Port)+j)
}

// svcTarget resolves a traffic or event target, namespace/name[:port]:
// without a port it names the Service (every port, for traffic).
func (v *validator) svcTarget(path, target string) (*svcRef, string, bool) {
	name, port, hasPort := strings.Cut(target, ":")
	ref := v.lookupService(path, name)
	if ref == nil {
		return nil, "", false
	}
	if hasPort && !v.port(path, name, ref, port) {
		return nil, "", false
	}
	return ref, port, true
}

// lookupService finds a Service by namespace/name, or reports at path why not.
func (v *validator) lookupService(path, name string) *svcRef {
	if !strings.Contains(name, "/") {
		v.r.at(path, "%q: name a Service as namespace/name or namespace/name:port", name)
		return nil
	}
	ref := v.services[name]
	if ref == nil {
		v.r.at(path, "Service %s is not defined in this scenario%s", name, v.generatedHint(name))
	}
	return ref
}

// generatedHint says where the generator puts a Service whose name looks
// generated but that it does not make: svc-12 in the wrong namespace, or
// svc-1001 of 1000.
func (v *validator) generatedHint(key string) string {
	g := v.sc.Generate
	if g == nil || g.Services < 1 || g.Namespaces < 1 {
		return ""
	}
	_, name, _ := strings.Cut(key, "/")
	num, ok := strings.CutPrefix(name, g.NamePrefix)
	i, err := strconv.Atoi(num)
	if !ok || err != nil || strconv.Itoa(i) != num {
		return ""
	}
	if i < 1 || i > g.Services {
		return fmt.Sprintf(" (generate makes %s1 to %s%d)", g.NamePrefix, g.NamePrefix, g.Services)
	}
	ns, _ := GeneratedServiceName(g, i-1)
	return fmt.Sprintf(" (generate puts %s in namespace %s)", name, ns)
}

// port checks that a named port of a Service exists in every run: a
// generated single port named only by some seeds does not.
func (v *validator) port(path, name string, ref *svcRef, port string) bool {
	switch {
	case ref.seedNamed != "" && port == ref.seedNamed:
		v.r.at(path, "Service %s is generated with one port, named %q or unnamed depending on the seed (generate.ports.named %g): omit the port to mean its only port",
			name, port, v.sc.Generate.Ports.Named)
	case !ref.hasPort(port):
		v.r.at(path, "Service %s has no port named %q (it has %s)", name, port, ref.portList())
	default:
		return true
	}
	return false
}

// checkTarget resolves the service port a check names, as sim run and sim
// conform will (cluster.ResolvePort): port names it; without one the
// Service must have exactly one port, which is meant whatever it is named.
// A headless Service has no service port at all.
func (v *validator) checkTarget(cp string, c *Check) {
	if c.Service == "" {
		v.r.at(cp+".service", "required: the Service to check, as namespace/name")
		return
	}
	if svc, port, ok := strings.Cut(c.Service, ":"); ok {
		if c.Port != "" {
			v.r.at(cp+".service", "%q names a port and so does port: give the port once", c.Service)
			return
		}
		c.Service, c.Port = svc, port
	}
	ref := v.lookupService(cp+".service", c.Service)
	switch {
	case ref == nil:
	case ref.headless:
		v.r.at(cp+".service", "Service %s is headless (clusterIP: None): kube-proxy programs nothing for it, so there is nothing to check", c.Service)
	case ref.noRules != "":
		v.r.at(cp+".service", "Service %s is %s: kube-proxy programs nothing for it, so there is nothing to check", c.Service, ref.noRules)
	case c.Port != "":
		v.port(cp+".port", c.Service, ref, c.Port)
	case len(ref.ports) > 1:
		v.r.at(cp+".service", "Service %s has %s: name one with port:", c.Service, ref.portList())
	}
}

func (v *validator) traffic() {
	t := v.sc.Traffic
	if t == nil {
		return
	}
	if len(t.Clients) == 0 {
		v.r.at("traffic.clients", "at least one client is needed")
	}
	names := map[string]bool{}
	for i := range t.Clients {
		c := &t.Clients[i]
		cp := fmt.Sprintf("traffic.clients[%d]", i)
		if c.Name == "" {
			c.Name = fmt.Sprintf("client-%d", i+1)
		} else if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
			v.r.at(cp+".name", "%q is not a valid name: %s", c.Name, errs[0])
		}
		if names[c.Name] {
			v.r.at(cp+".name", "client %q is defined twice", c.Name)
		}
		names[c.Name] = true
		switch {
		case c.Where == "":
			c.Where = cluster.InPod
		case !c.Where.Valid():
			v.r.at(cp+".where", "unknown value %q (choose from %s)", c.Where, choices(whereNames()))
		case c.Where != cluster.InPod && c.PodsPerNode > 1:
			v.r.at(cp+".podsPerNode", "applies to pods; a %s client group is one client per node (host) or one machine (external)", c.Where)
		case c.Where == cluster.OnHost && c.SourceIPs > 1:
			v.r.at(cp+".sourceIPs", "a host client sends from its node's address only")
		case c.Where == cluster.Outside && v.extNet.IsValid() && c.SourceIPs > 1<<(32-v.extNet.Bits())-4:
			v.r.at(cp+".sourceIPs", "%d addresses do not fit cluster.externalNetwork %s", c.SourceIPs, v.extNet)
		}
		v.clientVia(cp, c)
		for j, n := range c.Nodes {
			if _, ok := v.nodes[n]; !ok {
				v.r.at(fmt.Sprintf("%s.nodes[%d]", cp, j), "node %q is not defined", n)
			}
		}
		if c.PodsPerNode == 0 {
			c.PodsPerNode = 1
		} else if c.PodsPerNode < 1 || c.PodsPerNode > 64 {
			v.r.at(cp+".podsPerNode", "must be between 1 and 64, got %d", c.PodsPerNode)
		}
		if c.SourceIPs == 0 {
			c.SourceIPs = 1
		} else if c.SourceIPs < 1 || c.SourceIPs > 65536 {
			v.r.at(cp+".sourceIPs", "must be between 1 and 65536, got %d", c.SourceIPs)
		}
		if c.SourcePorts == "" {
			c.SourcePorts = "random"
		} else if !oneOf(c.SourcePorts, SourcePortModes) {
			v.r.at(cp+".sourcePorts", "unknown value %q (choose from %s)", c.SourcePorts, choices(SourcePortModes))
		}
		if c.Protocol != "" && c.Protocol != "TCP" && c.Protocol != "UDP" {
			v.r.at(cp+".protocol", "unknown protocol %q (TCP or UDP)", c.Protocol)
		}
		v.clientRequests(cp, c)
		if c.Weight < 0 {
			v.r.at(cp+".weight", "must not be negative, got %g", c.Weight)
		} else if c.Weight == 0 {
			c.Weight = 1
		}
		if c.Where == cluster.Outside {
			v.externalTargets(cp, c)
		} else {
			for j, s := range c.Services {
				v.svcTarget(fmt.Sprintf("%s.services[%d]", cp, j), s)
			}
		}
	}
	if v.requestsOnly(t) {
		return
	}
	hasRate := t.Rate != 0 || t.Duration != nil
	switch {
	case t.Connections != 0 && hasRate:
		v.r.at("traffic.connections", "give either connections or rate and duration, not both")
	case t.Connections < 0 || t.Connections > 1e10:
		v.r.at("traffic.connections", "must be between 1 and 10^10, got %d", t.Connections)
	case t.Connections == 0 && !hasRate:
		v.r.at("traffic", "give connections, or rate and duration")
	case hasRate && (t.Rate <= 0 || t.Duration == nil || t.Duration.Duration <= 0):
		v.r.at("traffic.rate", "rate and duration must both be positive")
	case hasRate && t.Rate*t.Duration.Seconds() > 1e10:
		v.r.at("traffic.rate", "rate x duration must not exceed 10^10 connections")
	}
	if d := t.ConnectionDuration; d != nil {
		if d.Kind != "fixed" && d.Kind != "exponential" {
			v.r.at("traffic.connectionDuration.kind", "unknown distribution %q (fixed or exponential)", d.Kind)
		}
		if d.Mean.Duration < 0 {
			v.r.at("traffic.connectionDuration.mean", "must not be negative")
		}
		v.distShape("traffic.connectionDuration", d)
	}
}

func (v *validator) events() {
	for i := range v.sc.Events {
		e := &v.sc.Events[i]
		ep := fmt.Sprintf("events[%d]", i)
		if e.At.Duration < 0 {
			v.r.at(ep+".at", "must not be negative")
		}
		if !oneOf(e.Type, EventTypes) {
			v.r.at(ep+".type", "unknown event type %q (choose from %s)", e.Type, choices(EventTypes))
			continue
		}
		ref, _, ok := v.svcTarget(ep+".service", e.Service)
		if e.Service == "" {
			continue
		}
		needsEndpoint := e.Type == EventReadiness || e.Type == EventFlap || e.Type == EventDeletePod
		picks := 0
		for _, s := range []string{e.Pod, e.Endpoint} {
			if s != "" {
				picks++
			}
		}
		if e.Endpoints > 0 {
			picks++
		}
		if needsEndpoint {
			if picks != 1 {
				v.r.at(ep, "a %s event names exactly one of pod, endpoint or endpoints (a count)", e.Type)
			} else if ok && ref.generated && e.Pod != "" {
				v.r.at(ep+".pod", "generated Services have no pods: name the endpoint by address (endpoint) or pick a count (endpoints)")
			} else if ok && !ref.generated {
				if e.Pod != "" && !ref.pods[e.Pod] {
					v.r.at(ep+".pod", "Service %s has no endpoint whose targetRef is pod %q", e.Service, e.Pod)
				}
				if e.Endpoint != "" && !ref.addrs[e.Endpoint] {
					v.r.at(ep+".endpoint", "Service %s has no endpoint with address %q", e.Service, e.Endpoint)
				}
				if e.Endpoints > ref.endpoints {
					v.r.at(ep+".endpoints", "Service %s has only %d endpoints", e.Service, ref.endpoints)
				}
			}
			if e.Endpoints < 0 {
				v.r.at(ep+".endpoints", "must be positive")
			}
		} else if picks > 0 {
			v.r.at(ep, "a %s event does not name endpoints", e.Type)
		}
		switch e.Type {
		case EventReadiness:
			if e.Ready == nil {
				v.r.at(ep+".ready", "required: the new readiness (true or false)")
			}
		case EventFlap:
			if e.Period == nil || e.Period.Duration <= 0 {
				v.r.at(ep+".period", "required and positive")
			}
			if e.Duty <= 0 || e.Duty >= 1 {
				v.r.at(ep+".duty", "the not-ready share of each period must be between 0 and 1 (exclusive), got %g", e.Duty)
			}
			if e.Count < 1 || e.Count > 10000 {
				v.r.at(ep+".count", "must be between 1 and 10000, got %d", e.Count)
			}
		case EventDeletePod:
			if e.GracePeriod == nil {
				e.GracePeriod = &metav1.Duration{Duration: 30 * time.Second}
			} else if e.GracePeriod.Duration < 0 {
				v.r.at(ep+".gracePeriod", "must not be negative")
			}
		case EventScale:
			if e.Replicas == nil || *e.Replicas < 0 || *e.Replicas > 1000 {
				v.r.at(ep+".replicas", "required, between 0 and 1000")
			}
		case EventServiceUpdate:
			if e.SessionAffinity == "" && e.AffinityTimeout == nil && e.InternalTrafficPolicy == "" && e.ExternalTrafficPolicy == "" {
				v.r.at(ep, "a service-update event changes at least one of sessionAffinity, affinityTimeoutSeconds, internalTrafficPolicy, externalTrafficPolicy")
			}
			if e.SessionAffinity != "" && e.SessionAffinity != "None" && e.SessionAffinity != "ClientIP" {
				v.r.at(ep+".sessionAffinity", "unknown value %q (None or ClientIP)", e.SessionAffinity)
			}
			if e.AffinityTimeout != nil && (*e.AffinityTimeout < 1 || *e.AffinityTimeout > 86400) {
				v.r.at(ep+".affinityTimeoutSeconds", "must be between 1 and 86400")
			}
			if e.InternalTrafficPolicy != "" && e.InternalTrafficPolicy != "Cluster" && e.InternalTrafficPolicy != "Local" {
				v.r.at(ep+".internalTrafficPolicy", "unknown value %q (Cluster or Local)", e.InternalTrafficPolicy)
			}
			if e.ExternalTrafficPolicy != "" {
				if e.ExternalTrafficPolicy != "Cluster" && e.ExternalTrafficPolicy != "Local" {
					v.r.at(ep+".externalTrafficPolicy", "unknown value %q (Cluster or Local)", e.ExternalTrafficPolicy)
				} else if ok && ref.typ == corev1.ServiceTypeClusterIP && !ref.externalIPs {
					v.r.at(ep+".externalTrafficPolicy", "Service %s is of type ClusterIP without externalIPs; externalTrafficPolicy applies to externally accessible Services", e.Service)
				}
			}
		}
	}
}

// whereNames and viaNames spell the client places and destinations.
func whereNames() []string {
	var out []string
	for _, w := range cluster.Wheres() {
		out = append(out, string(w))
	}
	return out
}

// checkRoutes says, per check type, where its clients may stand and which
// destinations they may use, the first of each the default. Types not
// listed are the pod checks of the cluster IP.
var checkRoutes = map[string]struct {
	from []cluster.Where
	via  []cluster.Via
}{
	CheckExternalDistribution: {[]cluster.Where{cluster.Outside}, []cluster.Via{cluster.ViaNodePort, cluster.ViaExternalIP, cluster.ViaLoadBalancer}},
	CheckExternalLocalBalance: {[]cluster.Where{cluster.Outside}, []cluster.Via{cluster.ViaLoadBalancer}},
	CheckExternalAffinity:     {[]cluster.Where{cluster.Outside}, []cluster.Via{cluster.ViaNodePort, cluster.ViaLoadBalancer}},
	CheckSourceAddress: {[]cluster.Where{cluster.InPod, cluster.OnHost, cluster.Outside},
		[]cluster.Via{cluster.ViaClusterIP, cluster.ViaNodePort, cluster.ViaExternalIP, cluster.ViaLoadBalancer}},
	CheckSourceRanges: {[]cluster.Where{cluster.Outside}, []cluster.Via{cluster.ViaLoadBalancer}},
}

// CheckRoute is where a check's clients stand and what they connect to,
// its defaults filled (the scenario's validation fills them in c too).
func CheckRoute(c *Check) (cluster.Where, cluster.Via) {
	from, via := c.From, c.Via
	r, ok := checkRoutes[c.Type]
	if from == "" {
		from = cluster.InPod
		if ok {
			from = r.from[0]
		}
	}
	if via == "" {
		via = cluster.ViaClusterIP
		if ok && (from == cluster.Outside || c.Type != CheckSourceAddress) {
			via = r.via[0]
			if from == cluster.Outside && via == cluster.ViaClusterIP {
				via = cluster.ViaNodePort
			}
		}
	}
	return from, via
}

// checkRoute validates a check's from and via and what its Service must
// have for them.
func (v *validator) checkRoute(cp string, c *Check) {
	r, external := checkRoutes[c.Type]
	allowedFrom := []cluster.Where{cluster.InPod}
	allowedVia := []cluster.Via{cluster.ViaClusterIP}
	if external {
		allowedFrom, allowedVia = r.from, r.via
	}
	if c.From != "" && !slices.Contains(allowedFrom, c.From) {
		v.r.at(cp+".from", "the clients of %s checks stand in %s, not %q", c.Type, joinWheres(allowedFrom), c.From)
		return
	}
	if c.Via != "" && !slices.Contains(allowedVia, c.Via) {
		v.r.at(cp+".via", "%s checks connect through %s, not %q", c.Type, joinVias(allowedVia), c.Via)
		return
	}
	c.From, c.Via = CheckRoute(c)
	if c.From == cluster.Outside && c.Via == cluster.ViaClusterIP {
		v.r.at(cp+".via", "clients outside the cluster connect through node-port, external-ip or load-balancer")
		return
	}
	ref := v.services[c.Service]
	if ref == nil {
		return
	}
	need := func(ok bool, what string) {
		if !ok {
			v.r.at(cp+".service", "Service %s has no %s: %s checks through %s need one", c.Service, what, c.Type, c.Via)
		}
	}
	switch c.Via {
	case cluster.ViaNodePort:
		need(ref.nodePorts || ref.generated, "node port")
	case cluster.ViaExternalIP:
		need(ref.externalIPs, "external IP")
	case cluster.ViaLoadBalancer:
		need(ref.lbIP, "load-balancer ingress IP in ipMode VIP (status.loadBalancer.ingress)")
	}
	switch c.Type {
	case CheckUDPFlow, CheckTCPEstablished:
		v.checkProtocol(cp, c, ref)
		if c.Type == CheckTCPEstablished && ref.affinity {
			v.r.at(cp+".service", "Service %s has sessionAffinity ClientIP: a connection whose conntrack entry was flushed goes back to its endpoint, so tcp-established could not see a flush; check a Service without affinity", c.Service)
		}
	case CheckExternalAffinity, CheckAffinityMoves:
		if !ref.affinity {
			v.r.at(cp+".service", "Service %s has no sessionAffinity ClientIP to check", c.Service)
		}
	case CheckHealthCheck, CheckExternalLocalBalance:
		if !ref.healthCheck {
			v.r.at(cp+".service", "Service %s has no health check node port: only a LoadBalancer Service with externalTrafficPolicy Local has one (%s checks need it)", c.Service, c.Type)
		}
	case CheckSourceRanges:
		if !ref.ranges {
			v.r.at(cp+".service", "Service %s has no loadBalancerSourceRanges to check", c.Service)
		}
	}
}

// checkProtocol says when an established-flow check names a port of the
// other protocol (udp-flow needs UDP, tcp-established TCP). A generated
// Service's protocol is the seed's: the harness reports a mismatch as not
// run.
func (v *validator) checkProtocol(cp string, c *Check, ref *svcRef) {
	want := corev1.ProtocolUDP
	if c.Type == CheckTCPEstablished {
		want = corev1.ProtocolTCP
	}
	p, ok := ref.protocols[c.Port]
	if !ok && c.Port == "" && len(ref.protocols) == 1 {
		for _, x := range ref.protocols {
			p, ok = x, true
		}
	}
	if p == "" && ok {
		p = corev1.ProtocolTCP // the API's default
	}
	if ok && p != want {
		name := fmt.Sprintf("port %q", c.Port)
		if c.Port == "" {
			name = "only port"
		}
		v.r.at(cp+".port", "%s checks need a %s port; Service %s's %s is %s", c.Type, want, c.Service, name, p)
	}
}

func joinWheres(l []cluster.Where) string {
	var out []string
	for _, w := range l {
		out = append(out, string(w))
	}
	return strings.Join(out, " or ")
}

func joinVias(l []cluster.Via) string {
	var out []string
	for _, w := range l {
		out = append(out, string(w))
	}
	return strings.Join(out, " or ")
}

func (v *validator) checks() {
	names := map[string]bool{}
	for i := range v.sc.Checks {
		c := &v.sc.Checks[i]
		cp := fmt.Sprintf("checks[%d]", i)
		if !oneOf(c.Type, CheckTypes) {
			v.r.at(cp+".type", "unknown check %q (choose from %s)", c.Type, choices(CheckTypes))
		}
		v.checkTarget(cp, c)
		v.checkRoute(cp, c)
		for j, n := range c.ClientNodes {
			if _, ok := v.nodes[n]; !ok {
				v.r.at(fmt.Sprintf("%s.clientNodes[%d]", cp, j), "node %q is not defined", n)
			}
		}
		if c.Name == "" {
			c.Name = c.Type + ":" + c.Service
			if c.Port != "" {
				c.Name += ":" + c.Port
			}
		}
		if names[c.Name] {
			v.r.at(cp+".name", "check %q is defined twice; give each a distinct name", c.Name)
		}
		names[c.Name] = true
		if c.Alpha == 0 {
			c.Alpha = DefaultAlpha
		} else if c.Alpha <= 0 || c.Alpha >= 0.5 {
			v.r.at(cp+".alpha", "must be between 0 and 0.5 (exclusive), got %g", c.Alpha)
		}
		if c.MDE == 0 {
			c.MDE = DefaultMDE
		} else if c.MDE <= 0 || c.MDE > 1 {
			v.r.at(cp+".mde", "the minimum detectable effect is a relative change between 0 and 1, got %g", c.MDE)
		}
		if c.Power == 0 {
			c.Power = DefaultPower
		} else if c.Power <= 0.5 || c.Power >= 1 {
			v.r.at(cp+".power", "must be between 0.5 and 1 (exclusive), got %g", c.Power)
		}
	}
}
