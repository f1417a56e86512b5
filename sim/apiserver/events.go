package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/sim/scenario"
)

// Action is what one timeline step does to the API.
type Action string

// Actions of timeline steps.
const (
	ActSetReady      Action = "set-ready"      // ready=serving=Ready
	ActTerminate     Action = "terminate"      // ready=false, serving kept, terminating=true
	ActRemove        Action = "remove"         // the endpoint leaves its slice
	ActScale         Action = "scale"          // endpoints added or removed to reach Replicas
	ActServiceUpdate Action = "service-update" // Service fields changed
)

// Step is one API write of the timeline, at a time from the start of the run.
type Step struct {
	At      time.Duration
	Action  Action
	Event   int // index in the scenario's events
	Service string
	// Which endpoints: by pod, by address, or the first Count in address order.
	Pod, Endpoint string
	Count         int
	Ready         bool
	Replicas      int
	Update        *scenario.Event // for service updates
}

// String describes the step for logs and reports.
func (s Step) String() string {
	target := s.Pod
	if target == "" {
		target = s.Endpoint
	}
	if target == "" && s.Count > 0 {
		target = fmt.Sprintf("%d endpoint(s)", s.Count)
	}
	switch s.Action {
	case ActSetReady:
		return fmt.Sprintf("%s %s %s ready=%t", s.At, s.Service, target, s.Ready)
	case ActScale:
		return fmt.Sprintf("%s %s scale to %d", s.At, s.Service, s.Replicas)
	}
	return fmt.Sprintf("%s %s %s %s", s.At, s.Service, target, s.Action)
}

// Timeline expands the scenario's events into API writes ordered by time
// (stable: events at the same time keep their file order). A flap becomes
// 2×count readiness writes; a pod deletion becomes terminate, then remove
// after the grace period.
func Timeline(sc *scenario.Scenario) []Step {
	var out []Step
	for i := range sc.Events {
		e := &sc.Events[i]
		base := Step{At: e.At.Duration, Event: i, Service: e.Service, Pod: e.Pod, Endpoint: e.Endpoint, Count: e.Endpoints}
		switch e.Type {
		case scenario.EventReadiness:
			s := base
			s.Action, s.Ready = ActSetReady, *e.Ready
			out = append(out, s)
		case scenario.EventFlap:
			period := e.Period.Duration
			down := time.Duration(float64(period) * e.Duty)
			for k := 0; k < e.Count; k++ {
				s := base
				s.At = base.At + time.Duration(k)*period
				s.Action, s.Ready = ActSetReady, false
				out = append(out, s)
				s.At += down
				s.Ready = true
				out = append(out, s)
			}
		case scenario.EventDeletePod:
			s := base
			s.Action = ActTerminate
			out = append(out, s)
			s.At += e.GracePeriod.Duration
			s.Action = ActRemove
			out = append(out, s)
		case scenario.EventScale:
			s := base
			s.Action, s.Replicas = ActScale, *e.Replicas
			out = append(out, s)
		case scenario.EventServiceUpdate:
			s := base
			s.Action, s.Update = ActServiceUpdate, e
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].At < out[b].At })
	return out
}

// Apply performs one step through the clientset: every tracker sees it as an
// informer update. It returns the number of API writes made (each is one
// informer event for every tracker; see cluster.Tracker.Seq).
func (c *Cluster) Apply(ctx context.Context, s Step) (int, error) {
	c.writes = 0
	err := c.apply(ctx, s)
	return c.writes, err
}

func (c *Cluster) apply(ctx context.Context, s Step) error {
	ns, name, _ := strings.Cut(s.Service, "/")
	if s.Action == ActServiceUpdate {
		return c.updateService(ctx, ns, name, s.Update)
	}
	sl := c.SlicesOf(ns, name)
	if len(sl) == 0 {
		return fmt.Errorf("event %d: Service %s has no EndpointSlice", s.Event, s.Service)
	}
	slices.SortFunc(sl, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	copies := make([]*discoveryv1.EndpointSlice, len(sl))
	for i, x := range sl {
		copies[i] = x.DeepCopy()
	}
	if s.Action == ActScale {
		return c.scale(ctx, copies, s)
	}
	targets := selectEndpoints(copies, s)
	if len(targets) == 0 {
		// The endpoint may already be gone (removed by an earlier step):
		// that is not an error for removal, and is one for the others.
		if s.Action == ActRemove {
			return nil
		}
		return fmt.Errorf("event %d: no endpoint of %s matches %s", s.Event, s.Service, s)
	}
	changed := map[int]bool{}
	for _, t := range targets {
		ep := &copies[t.slice].Endpoints[t.idx]
		changed[t.slice] = true
		switch s.Action {
		case ActSetReady:
			r, sv := s.Ready, s.Ready
			ep.Conditions.Ready, ep.Conditions.Serving = &r, &sv
			if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
				// A terminating endpoint is never ready again; only serving moves.
				f := false
				ep.Conditions.Ready = &f
			}
		case ActTerminate:
			serving := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			f, tr := false, true
			ep.Conditions.Ready, ep.Conditions.Serving, ep.Conditions.Terminating = &f, &serving, &tr
		case ActRemove:
			ep.Addresses = nil // marked, compacted below
		}
	}
	for i := range copies {
		if !changed[i] {
			continue
		}
		if s.Action == ActRemove {
			kept := copies[i].Endpoints[:0]
			for _, ep := range copies[i].Endpoints {
				if len(ep.Addresses) > 0 {
					kept = append(kept, ep)
				}
			}
			copies[i].Endpoints = kept
		}
		stampTrigger(copies[i])
		if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, copies[i], metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("event %d: could not update EndpointSlice %s/%s: %w", s.Event, ns, copies[i].Name, err)
		}
		c.writes++
	}
	return nil
}

type epRef struct{ slice, idx int }

// selectEndpoints finds the step's endpoints: by pod, by address, or the
// first Count in address order.
func selectEndpoints(sl []*discoveryv1.EndpointSlice, s Step) []epRef {
	var all []epRef
	for i, x := range sl {
		for j, ep := range x.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			switch {
			case s.Pod != "":
				if ep.TargetRef != nil && ep.TargetRef.Name == s.Pod {
					return []epRef{{i, j}}
				}
			case s.Endpoint != "":
				if ep.Addresses[0] == s.Endpoint {
					return []epRef{{i, j}}
				}
			default:
				all = append(all, epRef{i, j})
			}
		}
	}
	if s.Count == 0 {
		return nil
	}
	addr := func(r epRef) netip.Addr {
		a, _ := netip.ParseAddr(sl[r.slice].Endpoints[r.idx].Addresses[0])
		return a
	}
	slices.SortFunc(all, func(a, b epRef) int { return addr(a).Compare(addr(b)) })
	return all[:min(s.Count, len(all))]
}

// scale adds endpoints (ready, on the nodes round-robin, with fresh addresses
// from each node's pod block) or removes the last ones in address order.
func (c *Cluster) scale(ctx context.Context, sl []*discoveryv1.EndpointSlice, s Step) error {
	ns := sl[0].Namespace
	var refs []epRef
	used := map[netip.Addr]bool{}
	for i, x := range sl {
		for j, ep := range x.Endpoints {
			if len(ep.Addresses) > 0 {
				refs = append(refs, epRef{i, j})
			}
		}
	}
	for _, o := range c.slice.GetStore().List() {
		for _, ep := range o.(*discoveryv1.EndpointSlice).Endpoints {
			if len(ep.Addresses) > 0 {
				if a, err := netip.ParseAddr(ep.Addresses[0]); err == nil {
					used[a] = true
				}
			}
		}
	}
	changed := map[int]bool{}
	if len(refs) > s.Replicas {
		sel := selectEndpoints(sl, Step{Count: len(refs)})
		for _, r := range sel[s.Replicas:] {
			sl[r.slice].Endpoints[r.idx].Addresses = nil
			changed[r.slice] = true
		}
		for i := range changed {
			kept := sl[i].Endpoints[:0]
			for _, ep := range sl[i].Endpoints {
				if len(ep.Addresses) > 0 {
					kept = append(kept, ep)
				}
			}
			sl[i].Endpoints = kept
		}
	} else {
		nodes := c.node.GetStore().List()
		sort.Slice(nodes, func(a, b int) bool { return nodes[a].(*corev1.Node).Name < nodes[b].(*corev1.Node).Name })
		last := len(sl) - 1
		for k := len(refs); k < s.Replicas; k++ {
			n := nodes[k%len(nodes)].(*corev1.Node)
			p, err := netip.ParsePrefix(n.Spec.PodCIDR)
			if err != nil {
				return fmt.Errorf("event %d: node %s has no pod CIDR", s.Event, n.Name)
			}
			a := p.Addr().Next().Next()
			for used[a] && p.Contains(a.Next()) {
				a = a.Next()
			}
			if !p.Contains(a.Next()) {
				return fmt.Errorf("event %d: node %s's pod block %s is full", s.Event, n.Name, p)
			}
			used[a] = true
			t, node := true, n.Name
			ep := discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: &node,
				Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t, Terminating: new(bool)}}
			if z, ok := n.Labels[scenario.LabelZone]; ok {
				ep.Zone = &z
			}
			if len(sl[last].Endpoints) >= scenario.MaxEndpointsPerSlice {
				next := sl[last].DeepCopy()
				next.Name = fmt.Sprintf("%s-s%d", sl[0].Labels[discoveryv1.LabelServiceName], len(sl))
				next.ResourceVersion = ""
				next.Endpoints = nil
				if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, next, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("event %d: could not create EndpointSlice: %w", s.Event, err)
				}
				c.writes++
				created, err := c.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, next.Name, metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("event %d: %w", s.Event, err)
				}
				sl = append(sl, created.DeepCopy())
				last++
			}
			sl[last].Endpoints = append(sl[last].Endpoints, ep)
			changed[last] = true
		}
	}
	for i := range changed {
		stampTrigger(sl[i])
		if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, sl[i], metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("event %d: could not update EndpointSlice %s/%s: %w", s.Event, ns, sl[i].Name, err)
		}
		c.writes++
	}
	return nil
}

func (c *Cluster) updateService(ctx context.Context, ns, name string, e *scenario.Event) error {
	cur, ok := c.Service(ns, name)
	if !ok {
		return fmt.Errorf("service-update: Service %s/%s not found", ns, name)
	}
	s := cur.DeepCopy()
	if e.SessionAffinity != "" {
		s.Spec.SessionAffinity = corev1.ServiceAffinity(e.SessionAffinity)
		if e.SessionAffinity == "None" {
			s.Spec.SessionAffinityConfig = nil
		}
	}
	if e.AffinityTimeout != nil || s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		if s.Spec.SessionAffinityConfig == nil || s.Spec.SessionAffinityConfig.ClientIP == nil {
			t := int32(scenario.DefaultAffinityTimeout)
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
		}
		if e.AffinityTimeout != nil {
			t := *e.AffinityTimeout
			s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = &t
		}
	}
	if e.InternalTrafficPolicy != "" {
		p := corev1.ServiceInternalTrafficPolicy(e.InternalTrafficPolicy)
		s.Spec.InternalTrafficPolicy = &p
	}
	if e.ExternalTrafficPolicy != "" {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(e.ExternalTrafficPolicy)
	}
	if _, err := c.Client.CoreV1().Services(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("could not update Service %s/%s: %w", ns, name, err)
	}
	c.writes++
	return nil
}

// stampTrigger sets the annotation the EndpointSlice controller writes: when
// the change that caused this write happened. Proxies measure the network
// programming latency from it.
func stampTrigger(s *discoveryv1.EndpointSlice) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
}
