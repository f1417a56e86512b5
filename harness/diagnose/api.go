package diagnose

// The API side of the analysis: what the cluster's objects say the node's
// rules should hold, in our own reading of kube-proxy's documented
// behaviour (the Cluster set is the ready endpoints, else the serving and
// terminating ones; internalTrafficPolicy Local: the node's own endpoints,
// ready first, else serving and terminating; topology hints narrow the
// Cluster set to the node's zone when every ready endpoint has one and one
// names the zone). It does not import dataplane/proxy, the subject's copy,
// so that a bug there would show here as a finding.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kpsim/kpsim/sim/scenario"
)

// API is the cluster's objects as sim diagnose --api reads them.
type API struct {
	File     string
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	Nodes    []*corev1.Node
	// pos locates objects of the file: "Kind ns/name" to its line.
	pos map[string]Line
}

// LoadAPI reads a Kubernetes object dump (what scenario.LoadFile accepts:
// a scenario's objects, or kubectl get ... -o yaml) and expands it into
// typed objects. Errors are scenario.ErrorList (bad input).
func LoadAPI(path string) (*API, error) {
	l, err := scenario.LoadFile(path)
	if err != nil {
		return nil, err
	}
	x, err := scenario.Expand(l, nil)
	if err != nil {
		return nil, err
	}
	a := &API{File: path, Services: x.Services, Slices: x.Slices, Nodes: x.Nodes, pos: map[string]Line{}}
	for _, o := range l.Scenario.Objects {
		k := objectKey(o.Object)
		if k == "" {
			continue
		}
		a.pos[k] = Line{File: path, Line: l.PosOf(o.Path).Line, Text: k}
	}
	return a, nil
}

func objectKey(o runtime.Object) string {
	switch x := o.(type) {
	case *corev1.Service:
		return "Service " + x.Namespace + "/" + x.Name
	case *discoveryv1.EndpointSlice:
		return "EndpointSlice " + x.Namespace + "/" + x.Name
	case *corev1.Node:
		return "Node " + x.Name
	}
	return ""
}

// line returns the evidence line of an object, or a line without number.
func (a *API) line(key string) Line {
	if l, ok := a.pos[key]; ok {
		return l
	}
	return Line{File: a.File, Text: key}
}

// apiEndpoint is one endpoint of a service port as the API has it.
type apiEndpoint struct {
	addr                        netip.AddrPort
	ready, serving, terminating bool
	node                        string
	zones                       []string
	slice                       string
}

// apiPort is one service port of the API.
type apiPort struct {
	svc      *corev1.Service
	port     corev1.ServicePort
	name     string
	eps      []apiEndpoint
	itpLocal bool
	etpLocal bool
	affinity time.Duration // 0: none
	svcLine  Line
}

func protoOf(p corev1.Protocol) string {
	if p == "" {
		return "tcp"
	}
	return strings.ToLower(string(p))
}

// ports returns the API's service ports by Key. Headless and ExternalName
// Services have no rules and are left out; so are IPv6 ClusterIPs.
func (a *API) ports() map[string]*apiPort {
	out := map[string]*apiPort{}
	slicesOf := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range a.Slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		svc := s.Labels[discoveryv1.LabelServiceName]
		slicesOf[s.Namespace+"/"+svc] = append(slicesOf[s.Namespace+"/"+svc], s)
	}
	for _, svc := range a.Services {
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !ip.Is4() {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			name := svc.Namespace + "/" + svc.Name
			if sp.Name != "" {
				name += ":" + sp.Name
			}
			ap := &apiPort{svc: svc, port: sp, name: name, svcLine: a.line("Service " + svc.Namespace + "/" + svc.Name)}
			ap.itpLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
			ap.etpLocal = svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				ap.affinity = 10800 * time.Second
				if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
					ap.affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
				}
			}
			for _, s := range slicesOf[svc.Namespace+"/"+svc.Name] {
				for _, p := range s.Ports {
					pn := ""
					if p.Name != nil {
						pn = *p.Name
					}
					proto := corev1.ProtocolTCP
					if p.Protocol != nil {
						proto = *p.Protocol
					}
					if pn != sp.Name || protoOf(proto) != protoOf(sp.Protocol) || p.Port == nil {
						continue
					}
					for _, e := range s.Endpoints {
						if len(e.Addresses) == 0 {
							continue
						}
						addr, err := netip.ParseAddr(e.Addresses[0])
						if err != nil {
							continue
						}
						ae := apiEndpoint{addr: netip.AddrPortFrom(addr, uint16(*p.Port)), slice: s.Namespace + "/" + s.Name}
						ae.ready = e.Conditions.Ready == nil || *e.Conditions.Ready
						ae.serving = ae.ready
						if e.Conditions.Serving != nil {
							ae.serving = *e.Conditions.Serving
						}
						ae.terminating = e.Conditions.Terminating != nil && *e.Conditions.Terminating
						if e.NodeName != nil {
							ae.node = *e.NodeName
						}
						if e.Hints != nil {
							for _, z := range e.Hints.ForZones {
								ae.zones = append(ae.zones, z.Name)
							}
						}
						ap.eps = append(ap.eps, ae)
					}
				}
			}
			out[Key(ip, int(sp.Port), protoOf(sp.Protocol))] = ap
		}
	}
	return out
}

// external finds the API port a dump's port stands for when its address is
// no ClusterIP: an externalIP or load-balancer IP with the port, else a
// NodePort (IPVS writes a virtual server per node address and NodePort).
func external(ports map[string]*apiPort, pr *PortReport) *apiPort {
	p := pr.port
	proto := strings.ToLower(p.Protocol)
	var byNodePort *apiPort
	for _, ap := range ports {
		if protoOf(ap.port.Protocol) != proto {
			continue
		}
		if int(ap.port.Port) == p.Port {
			ips := slices.Clone(ap.svc.Spec.ExternalIPs)
			for _, in := range ap.svc.Status.LoadBalancer.Ingress {
				ips = append(ips, in.IP)
			}
			if slices.Contains(ips, p.ClusterIP.String()) {
				return ap
			}
		}
		if ap.port.NodePort != 0 && int(ap.port.NodePort) == p.Port {
			byNodePort = ap
		}
	}
	return byNodePort
}

// clusterSet is the endpoints Cluster traffic should reach from node in
// zone: ready ones (narrowed by zone hints when every ready endpoint has
// one and one names the zone), else the serving and terminating ones.
func clusterSet(eps []apiEndpoint, zone string) (set []apiEndpoint, hinted bool) {
	var ready []apiEndpoint
	for _, e := range eps {
		if e.ready {
			ready = append(ready, e)
		}
	}
	if len(ready) > 0 {
		if zone != "" {
			all, any := true, false
			var inZone []apiEndpoint
			for _, e := range ready {
				if len(e.zones) == 0 {
					all = false
				}
				if slices.Contains(e.zones, zone) {
					any = true
					inZone = append(inZone, e)
				}
			}
			if all && any {
				return inZone, true
			}
		}
		return ready, false
	}
	for _, e := range eps {
		if e.serving && e.terminating {
			set = append(set, e)
		}
	}
	return set, false
}

// localSet is the endpoints Local traffic should reach on node.
func localSet(eps []apiEndpoint, node string) []apiEndpoint {
	var ready, st []apiEndpoint
	for _, e := range eps {
		if e.node != node {
			continue
		}
		if e.ready {
			ready = append(ready, e)
		} else if e.serving && e.terminating {
			st = append(st, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return st
}

// inferNode names the node the dump comes from: the one node whose
// InternalIP appears in the dump's lines, else the one node whose podCIDR
// holds every endpoint of the dump's Local-only ports.
func inferNode(d *Dump, a *API) (string, string) {
	var hits []string
	for _, n := range a.Nodes {
		for _, ad := range n.Status.Addresses {
			if ad.Type != corev1.NodeInternalIP || ad.Address == "" {
				continue
			}
			if dumpMentions(d, ad.Address) || dumpServes(d, ad.Address) {
				hits = append(hits, n.Name)
			}
		}
	}
	if len(hits) == 1 {
		return hits[0], "inferred: its InternalIP appears in the dump"
	}
	var local []netip.Addr
	api := a.ports()
	for _, p := range d.Ports {
		if p.LocalOnly || (d.Mode == "ipvs" && ipvsExternalLocal(api, p)) {
			for _, e := range p.Endpoints {
				local = append(local, e.Addr.Addr())
			}
		}
		if xp := p.External; xp != nil && xp.Local {
			for _, e := range xp.Endpoints {
				local = append(local, e.Addr.Addr())
			}
		}
	}
	if len(local) > 0 {
		var by []string
		for _, n := range a.Nodes {
			pfx, err := netip.ParsePrefix(n.Spec.PodCIDR)
			if err != nil {
				continue
			}
			all := true
			for _, ip := range local {
				all = all && pfx.Contains(ip)
			}
			if all {
				by = append(by, n.Name)
			}
		}
		if len(by) == 1 {
			return by[0], "inferred: its podCIDR holds the endpoints of the Local-only ports and external paths"
		}
	}
	return "", ""
}

// ipvsExternalLocal reports an IPVS virtual server on an external
// address of an externalTrafficPolicy Local Service: kube-proxy gives it
// the node's own endpoints only.
func ipvsExternalLocal(api map[string]*apiPort, p *ServicePort) bool {
	if api[spKey(p)] != nil {
		return false
	}
	ap := external(api, &PortReport{port: p})
	return ap != nil && ap.etpLocal
}

func dumpMentions(d *Dump, ip string) bool {
	has := func(text string) bool {
		for i := 0; ; {
			j := strings.Index(text[i:], ip)
			if j < 0 {
				return false
			}
			s, e := i+j, i+j+len(ip)
			okL := s == 0 || !isAddrByte(text[s-1])
			okR := e == len(text) || !isAddrByte(text[e])
			if okL && okR {
				return true
			}
			i = e
		}
	}
	for _, p := range d.Ports {
		for _, l := range p.Evidence {
			if has(l.Text) {
				return true
			}
		}
		for _, e := range p.Endpoints {
			if has(e.Evidence.Text) {
				return true
			}
		}
	}
	return false
}

// dumpServes reports a port on the address (IPVS NodePort virtual servers).
func dumpServes(d *Dump, ip string) bool {
	for _, p := range d.Ports {
		if p.ClusterIP.String() == ip {
			return true
		}
	}
	return false
}

func isAddrByte(b byte) bool { return b >= '0' && b <= '9' || b == '.' }

// checkAPI compares the dump with the API.
func checkAPI(r *Report, d *Dump, opt Options) {
	a := opt.API
	node, how := opt.Node, "given with --node"
	if node == "" {
		node, how = inferNode(d, a)
	}
	var zone string
	if node != "" {
		found := false
		for _, n := range a.Nodes {
			if n.Name == node {
				found = true
				zone = n.Labels[scenario.LabelZone]
			}
		}
		if !found {
			r.add(LevelNote, KindNodeUnknown, nil, fmt.Sprintf("node %s is not among the API's Nodes: Local policies and topology hints are checked without its zone", node))
		}
	}
	r.Node, r.NodeHow, r.zone = node, how, zone
	if node == "" {
		r.NodeHow = ""
	}
	var needNode []string
	api := a.ports()
	seen := map[string]bool{}
	for _, pr := range r.Ports {
		ap, ext := api[pr.Key], false
		if ap == nil {
			if ap = external(api, pr); ap == nil {
				if isAPIServerService(pr) && !a.hasService("default", "kubernetes") {
					r.add(LevelNote, KindAPIIncomplete, pr, fmt.Sprintf("the rules handle %s for default/kubernetes, which every API server makes for itself; the API given has no such Service, so it is not a whole kubectl get svc -A and this port is not checked", pr.Key), pr.Evidence...)
					continue
				}
				r.add(LevelFinding, KindStaleService, pr, fmt.Sprintf("the rules handle %s, which no Service of the API has: stale rules of a deleted Service", pr.Key), pr.Evidence...)
				continue
			}
			ext = true
		} else {
			seen[pr.Key] = true
		}
		if ext {
			pr.Via = apiWhat(ap, pr.port) + " " + destWords(pr.port.ClusterIP, pr.port.Port)
		}
		if pr.Name == "" {
			pr.Name = ap.name
		} else if pr.Name != ap.name {
			r.add(LevelNote, "name-differs", pr, fmt.Sprintf("the rules' comment names %s, the API %s", pr.Name, ap.name), pr.Evidence...)
		}
		comparePort(r, pr, ap, node, zone, d.Mode, ext)
		if node == "" && (ap.itpLocal || ap.etpLocal || pr.port.LocalOnly || anyHints(ap.eps)) {
			needNode = append(needNode, pr.Label())
		}
	}
	if len(needNode) > 0 {
		r.add(LevelNote, KindNodeUnknown, nil, fmt.Sprintf("the node could not be inferred from the dump (no Node's InternalIP or podCIDR matches): give --node NAME to check the Local traffic policies and topology hints of %s", strings.Join(needNode, ", ")))
	}
	for key, ap := range api {
		if seen[key] || ap.svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		want, _ := clusterSet(ap.eps, zone)
		if ap.itpLocal {
			if node == "" {
				continue
			}
			want = localSet(ap.eps, node)
		}
		if len(want) == 0 {
			continue
		}
		r.add(LevelFinding, KindMissingService, nil, fmt.Sprintf("%s (%s) has %d ready endpoint(s) in the API but no rules in the dump", ap.name, key, len(want)), ap.svcLine)
	}
}

func comparePort(r *Report, pr *PortReport, ap *apiPort, node, zone, mode string, ext bool) {
	compareAffinity(r, pr, ap)
	compareEndpoints(r, pr, ap, node, zone, mode, ext)
}

// compareAffinity holds the rules' ClientIP affinity to the Service's.
func compareAffinity(r *Report, pr *PortReport, ap *apiPort) {
	p := pr.port
	switch {
	case ap.affinity > 0 && p.Affinity == nil:
		r.add(LevelFinding, KindAffinityMissing, pr, fmt.Sprintf("the Service asks for ClientIP affinity (timeout %s) but the rules have none", ap.affinity), ap.svcLine)
	case ap.affinity == 0 && p.Affinity != nil:
		r.add(LevelFinding, KindAffinityMissing, pr, "the rules apply ClientIP affinity the Service does not ask for", p.Affinity.Evidence, ap.svcLine)
	case p.Affinity != nil && p.Affinity.Timeout > 0 && p.Affinity.Timeout != ap.affinity:
		r.add(LevelFinding, KindAffinityTimeout, pr, fmt.Sprintf("the rules' affinity timeout is %s, the Service's sessionAffinityConfig.clientIP.timeoutSeconds %s", p.Affinity.Timeout, ap.affinity), p.Affinity.Evidence, ap.svcLine)
	}
}

// compareEndpoints holds the port's endpoints to the ones the API says
// its traffic policy selects on node (ext: an external destination, whose
// policy is externalTrafficPolicy).
func compareEndpoints(r *Report, pr *PortReport, ap *apiPort, node, zone, mode string, ext bool) {
	p := pr.port
	// Local policy: internalTrafficPolicy for the ClusterIP, external for
	// NodePorts, externalIPs and load-balancer IPs.
	policy, local := "internalTrafficPolicy", ap.itpLocal
	if ext {
		policy, local = "externalTrafficPolicy", ap.etpLocal
	}
	// IPVS has no chain that says "Local": kube-proxy's ipvs proxier
	// gives the virtual server only the node's local endpoints, so the
	// API's policy says how to read its real servers.
	localOnly := p.LocalOnly || (ext && p.ExternalLocal) || (mode == "ipvs" && local)
	if local && !localOnly {
		r.add(LevelFinding, KindLocalIgnored, pr, fmt.Sprintf("the Service has %s Local but the rules send this traffic to every node's endpoints", policy), append([]Line{ap.svcLine}, pr.Evidence...)...)
	}
	var want []apiEndpoint
	hinted := false
	switch {
	case localOnly && node == "":
		return
	case localOnly:
		want = localSet(ap.eps, node)
		if len(want) == 0 && !ext {
			r.add(LevelFinding, KindNoLocal, pr, fmt.Sprintf("internalTrafficPolicy Local and no serving endpoint on node %s: traffic from this node's pods to it is dropped", node), append([]Line{ap.svcLine}, pr.Evidence...)...)
		}
	default:
		want, hinted = clusterSet(ap.eps, zone)
	}
	if !ext && ap.etpLocal && node != "" && len(localSet(ap.eps, node)) == 0 {
		r.add(LevelNote, KindNoLocal, pr, fmt.Sprintf("externalTrafficPolicy Local and no endpoint on node %s: external traffic arriving here is dropped (load balancers' health checks steer away from such nodes)", node), ap.svcLine)
	}
	wantSet := map[netip.AddrPort]bool{}
	for _, e := range want {
		wantSet[e.addr] = true
	}
	all := map[netip.AddrPort]apiEndpoint{}
	for _, e := range ap.eps {
		all[e.addr] = e
	}
	have := map[netip.AddrPort]bool{}
	for _, e := range pr.Endpoints {
		have[e.Addr] = true
		if wantSet[e.Addr] {
			continue
		}
		ae, inAPI := all[e.Addr]
		if mode == "ipvs" && e.P == 0 && isIPVS(p) {
			if !inAPI || ae.terminating || !ae.ready {
				r.add(LevelNote, KindGraceful, pr, fmt.Sprintf("real server %s has weight 0: kube-proxy's IPVS graceful termination keeps it for its open connections, new ones go elsewhere", e.Addr), e.Evidence)
				continue
			}
		}
		switch {
		case !inAPI:
			r.add(LevelFinding, KindStale, pr, fmt.Sprintf("endpoint %s is in the rules but in no EndpointSlice of %s: stale (deleted)", e.Addr, ap.name), e.Evidence, ap.svcLine)
		case localOnly && ae.node != node:
			r.add(LevelFinding, KindLocalToRemote, pr, fmt.Sprintf("endpoint %s is on node %s, but %s Local allows only node %s's endpoints", e.Addr, orUnknown(ae.node), policy, node), e.Evidence, apiLine(ae, r))
		case !ae.serving:
			r.add(LevelFinding, KindStale, pr, fmt.Sprintf("endpoint %s is in the rules but not serving in the API (ready=%t, serving=false): stale", e.Addr, ae.ready), e.Evidence, apiLine(ae, r))
		case !ae.ready && ae.terminating:
			r.add(LevelFinding, KindStale, pr, fmt.Sprintf("endpoint %s is terminating (serving) and used although ready endpoints exist: kube-proxy uses terminating endpoints only when none is ready", e.Addr), e.Evidence, apiLine(ae, r))
		case !ae.ready:
			r.add(LevelFinding, KindStale, pr, fmt.Sprintf("endpoint %s is in the rules but not ready in the API: stale", e.Addr), e.Evidence, apiLine(ae, r))
		case hinted:
			r.add(LevelFinding, KindStale, pr, fmt.Sprintf("endpoint %s is outside zone %s's topology hints, which the other endpoints follow", e.Addr, zone), e.Evidence, apiLine(ae, r))
		default:
			r.add(LevelFinding, KindStale, pr, fmt.Sprintf("endpoint %s is in the rules but kube-proxy would not select it", e.Addr), e.Evidence, apiLine(ae, r))
		}
	}
	for _, e := range want {
		if have[e.addr] {
			continue
		}
		state := "ready"
		if !e.ready {
			state = "serving and terminating (no endpoint is ready)"
		}
		r.add(LevelFinding, KindMissing, pr, fmt.Sprintf("endpoint %s is %s in the API (EndpointSlice %s) but missing from the rules", e.addr, state, e.slice), apiLine(e, r), ap.svcLine)
	}
}

// isAPIServerService reports a port the rules name default/kubernetes.
func isAPIServerService(pr *PortReport) bool {
	n := pr.Name
	return n == "default/kubernetes" || strings.HasPrefix(n, "default/kubernetes:")
}

// hasService reports whether the API has the Service.
func (a *API) hasService(ns, name string) bool {
	return slices.ContainsFunc(a.Services, func(s *corev1.Service) bool { return s.Namespace == ns && s.Name == name })
}

// anyHints reports whether any endpoint carries zone hints.
func anyHints(eps []apiEndpoint) bool {
	for _, e := range eps {
		if len(e.zones) > 0 {
			return true
		}
	}
	return false
}

func orUnknown(s string) string {
	if s == "" {
		return "(no nodeName)"
	}
	return s
}

// apiLine is the evidence line of an endpoint's slice.
func apiLine(e apiEndpoint, r *Report) Line {
	l := r.api.line("EndpointSlice " + e.slice)
	l.Text += " endpoint " + e.addr.String()
	return l
}
