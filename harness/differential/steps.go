package differential

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Step actions.
const (
	ActReadyFlip     = "ready-flip"
	ActTerminate     = "terminate"
	ActRemove        = "remove"
	ActScaleUp       = "scale-up"
	ActScaleDown     = "scale-down"
	ActServiceUpdate = "service-update"
	ActServiceDelete = "service-delete"
	ActServiceAdd    = "service-add"
)

// Actions lists every step action, for coverage counts.
var Actions = []string{ActReadyFlip, ActTerminate, ActRemove, ActScaleUp, ActScaleDown, ActServiceUpdate, ActServiceDelete, ActServiceAdd}

// maxServices bounds the Services of a scenario (its ClusterIPs and node
// ports are reserved for that many).
const maxServices = 4

// writes collects a step's writes, each object once, deletions last.
type writes struct {
	svcs   map[string]*corev1.Service
	slices map[string]*discoveryv1.EndpointSlice
	delSvc map[string]bool
	delSl  map[string]bool
}

// step draws one step: one or two actions on the current objects; none
// when nothing is left to act on (the scenario then ends).
func (g *gen) step() Step {
	w := &writes{svcs: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}, delSvc: map[string]bool{}, delSl: map[string]bool{}}
	var st Step
	n := 1 + g.r.IntN(2)
	// An action may find nothing to act on (no endpoint left, every
	// Service gone): draw another, a bounded number of times.
	for try := 0; len(st.What) < n && try < 20; try++ {
		act := pick(g.r, Actions, []int{4, 3, 2, 3, 2, 3, 1, 1})
		if target, ok := g.apply(act, w); ok {
			st.What = append(st.What, act+" "+target)
		}
	}
	for _, k := range sortedKeys(w.svcs) {
		st.Services = append(st.Services, w.svcs[k])
	}
	for _, k := range sortedKeys(w.slices) {
		st.Slices = append(st.Slices, w.slices[k])
	}
	for _, k := range sortedKeys(w.delSvc) {
		st.DeleteServices = append(st.DeleteServices, types.NamespacedName{Namespace: g.ns, Name: k})
	}
	for _, k := range sortedKeys(w.delSl) {
		st.DeleteSlices = append(st.DeleteSlices, types.NamespacedName{Namespace: g.ns, Name: k})
	}
	return st
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// live returns the indexes of the Services not deleted; withEndpoints: only
// those with at least one endpoint.
func (g *gen) live(withEndpoints bool) []int {
	var out []int
	for i, m := range g.svcs {
		if m == nil {
			continue
		}
		if withEndpoints && !slices.ContainsFunc(m.slices, func(s *discoveryv1.EndpointSlice) bool { return len(s.Endpoints) > 0 }) {
			continue
		}
		out = append(out, i)
	}
	return out
}

// apply performs act on a Service it picks and records the writes; it
// returns the Service's name, or false when act has nothing to act on.
func (g *gen) apply(act string, w *writes) (string, bool) {
	switch act {
	case ActServiceAdd:
		if len(g.svcs) >= maxServices {
			return "", false
		}
		m := g.newService(len(g.svcs))
		g.svcs = append(g.svcs, m)
		w.svcs[m.svc.Name] = m.svc
		for _, s := range m.slices {
			w.slices[s.Name] = s
		}
		return m.svc.Name, true
	case ActServiceDelete, ActServiceUpdate:
		l := g.live(false)
		if len(l) == 0 {
			return "", false
		}
		i := l[g.r.IntN(len(l))]
		name := g.svcs[i].svc.Name
		if act == ActServiceDelete {
			g.deleteService(i, w)
		} else {
			g.updateService(i, w)
		}
		return name, true
	case ActScaleUp:
		l := g.live(false)
		if len(l) == 0 {
			return "", false
		}
		i := l[g.r.IntN(len(l))]
		g.scaleUp(g.svcs[i], w)
		return g.svcs[i].svc.Name, true
	}
	l := g.live(true)
	if len(l) == 0 {
		return "", false
	}
	m := g.svcs[l[g.r.IntN(len(l))]]
	g.endpointAction(act, m, w)
	return m.svc.Name, true
}

func (g *gen) deleteService(i int, w *writes) {
	m := g.svcs[i]
	delete(w.svcs, m.svc.Name)
	w.delSvc[m.svc.Name] = true
	for _, s := range m.slices {
		delete(w.slices, s.Name)
		w.delSl[s.Name] = true
	}
	g.svcs[i] = nil
}

// updateService changes one setting of Service i: affinity, its timeout,
// internal or external traffic policy, its external destinations, or a port
// number.
func (g *gen) updateService(i int, w *writes) {
	m := g.svcs[i]
	s := m.svc.DeepCopy()
	switch g.r.IntN(5) {
	case 0:
		if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			s.Spec.SessionAffinity, s.Spec.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
		} else {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(30 + g.r.IntN(600)))}}
		}
	case 1:
		if s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
		} else {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		}
	case 4:
		g.updateExternals(s, i)
	case 2:
		if externallyAccessible(s) {
			if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
				s.Spec.ExternalTrafficPolicy, s.Spec.HealthCheckNodePort = corev1.ServiceExternalTrafficPolicyCluster, 0
			} else {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
					s.Spec.HealthCheckNodePort = g.nodePort(i, 2)
				}
			}
			break
		}
		fallthrough
	default:
		p := g.r.IntN(len(s.Spec.Ports))
		s.Spec.Ports[p].Port = int32(80 + p*1000 + g.r.IntN(900))
	}
	m.svc = s
	w.svcs[s.Name] = s
}

// updateExternals changes the external destinations of Service s (index
// i): a LoadBalancer's ingress (a controller rewriting the status) or
// source ranges, or anyone's external IPs. A ClusterIP Service that loses
// its last external IP loses its externalTrafficPolicy with it (the API
// allows the policy only on externally accessible Services).
func (g *gen) updateExternals(s *corev1.Service, i int) {
	lb := s.Spec.Type == corev1.ServiceTypeLoadBalancer
	switch k := g.r.IntN(3); {
	case lb && k == 0:
		if len(s.Status.LoadBalancer.Ingress) > 0 && g.r.IntN(3) == 0 {
			s.Status.LoadBalancer.Ingress = nil
		} else {
			s.Status.LoadBalancer.Ingress = g.ingress(i)
		}
	case lb && k == 1:
		if len(s.Spec.LoadBalancerSourceRanges) > 0 && g.r.IntN(2) == 0 {
			s.Spec.LoadBalancerSourceRanges = nil
		} else {
			s.Spec.LoadBalancerSourceRanges = g.ranges()
		}
	default:
		if len(s.Spec.ExternalIPs) > 0 {
			s.Spec.ExternalIPs = nil
		} else {
			s.Spec.ExternalIPs = []string{g.externalAddr(i, g.r.IntN(2)).String()}
		}
		if !externallyAccessible(s) {
			s.Spec.ExternalTrafficPolicy = ""
		}
	}
}

// scaleUp adds endpoints: to an existing slice, or in a new one.
func (g *gen) scaleUp(m *svcModel, w *writes) {
	add := 1 + g.r.IntN(8)
	if g.r.IntN(10) == 0 {
		add = 100 + g.r.IntN(300)
	}
	if len(m.slices) == 0 || len(m.slices) < 3 && g.r.IntN(3) == 0 {
		s := g.newSlice(m, g.freeSlice(m), add)
		m.slices = append(m.slices, s)
		delete(w.delSl, s.Name)
		w.slices[s.Name] = s
		return
	}
	k := g.r.IntN(len(m.slices))
	s := m.slices[k].DeepCopy()
	for range add {
		s.Endpoints = append(s.Endpoints, g.newEndpoint(m))
	}
	m.slices[k] = s
	w.slices[s.Name] = s
}

// freeSlice is the lowest slice number m does not use.
func (g *gen) freeSlice(m *svcModel) int {
	for k := 0; ; k++ {
		name := fmt.Sprintf("%s-%d", m.svc.Name, k)
		if !slices.ContainsFunc(m.slices, func(s *discoveryv1.EndpointSlice) bool { return s.Name == name }) {
			return k
		}
	}
}

// endpointAction changes endpoints of one slice of m (one with endpoints):
// flips readiness, terminates, removes some, or scales down (deleting the
// slice or halving it).
func (g *gen) endpointAction(act string, m *svcModel, w *writes) {
	var withEps []int
	for k, s := range m.slices {
		if len(s.Endpoints) > 0 {
			withEps = append(withEps, k)
		}
	}
	k := withEps[g.r.IntN(len(withEps))]
	if act == ActScaleDown && g.r.IntN(2) == 0 {
		name := m.slices[k].Name
		m.slices = slices.Delete(m.slices, k, k+1)
		delete(w.slices, name)
		w.delSl[name] = true
		return
	}
	s := m.slices[k].DeepCopy()
	n := len(s.Endpoints)
	touch := 1 + g.r.IntN(min(n, 3))
	switch act {
	case ActReadyFlip:
		for range touch {
			e := &s.Endpoints[g.r.IntN(n)]
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				setConditions(e, "not-ready")
			} else {
				setConditions(e, "ready")
			}
		}
	case ActTerminate:
		for range touch {
			setConditions(&s.Endpoints[g.r.IntN(n)], pick(g.r, []string{"terminating-serving", "terminating"}, []int{2, 1}))
		}
	case ActRemove:
		for range touch {
			i := g.r.IntN(len(s.Endpoints))
			s.Endpoints = slices.Delete(s.Endpoints, i, i+1)
			if len(s.Endpoints) == 0 {
				break
			}
		}
	default: // scale down: keep the first half
		s.Endpoints = s.Endpoints[:n/2]
	}
	m.slices[k] = s
	w.slices[s.Name] = s
}
