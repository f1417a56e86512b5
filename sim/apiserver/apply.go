package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kpsim/kpsim/sim/scenario"
)

// Apply performs one step through the clientset: every tracker sees it as an
// informer update. It returns the number of API writes made (each is one
// informer event for every tracker; see cluster.Tracker.Seq).
//
// Every write starts from the API's current object (a List or Get, never
// the informer cache, which lags a real API's writes and lacks nothing the
// API defaulted) and is retried on a conflict (retry.RetryOnConflict, the
// standard read-modify-write; nothing is retried until some check passes).
// A service-update that changes nothing writes nothing, as a real API would
// drop it without an event. Scale picks free endpoint addresses from the
// informer cache of every slice plus the addresses this Cluster handed out
// before, so the Cluster must be started.
func (c *Cluster) Apply(ctx context.Context, s Step) (int, error) {
	ns, name, _ := strings.Cut(s.Service, "/")
	if s.Action == ActServiceUpdate {
		n, err := updateService(ctx, c.Client, ns, name, s.Update)
		if err != nil {
			return n, fmt.Errorf("event %d: %w", s.Event, err)
		}
		return n, nil
	}
	sl, err := slicesFromAPI(ctx, c.Client, ns, name)
	if err != nil {
		return 0, fmt.Errorf("event %d: %w", s.Event, err)
	}
	if len(sl) == 0 {
		return 0, fmt.Errorf("event %d: Service %s has no EndpointSlice", s.Event, s.Service)
	}
	switch s.Action {
	case ActAdd:
		n, err := c.add(ctx, sl, s)
		if err != nil {
			return n, fmt.Errorf("event %d: %w", s.Event, err)
		}
		return n, nil
	case ActRestore:
		n, err := restore(ctx, c.Client, sl, s.Snapshot)
		if err != nil {
			return n, fmt.Errorf("event %d: %w", s.Event, err)
		}
		return n, nil
	}
	if s.Action == ActScale {
		n, err := c.scale(ctx, sl, s)
		if err != nil {
			return n, fmt.Errorf("event %d: %w", s.Event, err)
		}
		return n, nil
	}
	targets := selectEndpoints(sl, s)
	if len(targets) == 0 {
		// The endpoint may already be gone (removed by an earlier step):
		// that is not an error for removal, and is one for the others.
		if s.Action == ActRemove {
			return 0, nil
		}
		return 0, fmt.Errorf("event %d: no endpoint of %s matches %s", s.Event, s.Service, s)
	}
	n, err := changeEndpoints(ctx, c.Client, sl, targets, s.Action, s.Ready)
	if err != nil {
		return n, fmt.Errorf("event %d: %w", s.Event, err)
	}
	return n, nil
}

// slicesFromAPI lists a Service's EndpointSlices (by the service-name label)
// from the API, sorted by name.
func slicesFromAPI(ctx context.Context, client kubernetes.Interface, ns, name string) ([]*discoveryv1.EndpointSlice, error) {
	sel := labels.Set{discoveryv1.LabelServiceName: name}.String()
	l, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("could not list the EndpointSlices of Service %s/%s: %w", ns, name, err)
	}
	out := make([]*discoveryv1.EndpointSlice, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	slices.SortFunc(out, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// changeEndpoints applies an endpoint action to the targets, one write per
// slice that holds some, in slice order.
func changeEndpoints(ctx context.Context, client kubernetes.Interface, sl []*discoveryv1.EndpointSlice, targets []epRef, a Action, ready bool) (int, error) {
	bySlice := map[int]map[string]bool{}
	for _, t := range targets {
		if bySlice[t.slice] == nil {
			bySlice[t.slice] = map[string]bool{}
		}
		bySlice[t.slice][sl[t.slice].Endpoints[t.idx].Addresses[0]] = true
	}
	n := 0
	for i, x := range sl {
		addrs := bySlice[i]
		if addrs == nil {
			continue
		}
		if err := updateSlice(ctx, client, x, func(x *discoveryv1.EndpointSlice) { mutateEndpoints(x, addrs, a, ready) }); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// mutateEndpoints applies an action to the endpoints of one slice whose
// first address is in addrs.
func mutateEndpoints(x *discoveryv1.EndpointSlice, addrs map[string]bool, a Action, ready bool) {
	kept := x.Endpoints[:0]
	for _, ep := range x.Endpoints {
		if len(ep.Addresses) == 0 || !addrs[ep.Addresses[0]] {
			kept = append(kept, ep)
			continue
		}
		switch a {
		case ActSetReady:
			r, sv := ready, ready
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
			continue
		}
		kept = append(kept, ep)
	}
	x.Endpoints = kept
}

// updateSlice writes a change to one EndpointSlice: mutate is applied to cur
// (just read from the API) and, after a conflict, to a fresh Get; every
// write is stamped with the trigger time.
func updateSlice(ctx context.Context, client kubernetes.Interface, cur *discoveryv1.EndpointSlice, mutate func(*discoveryv1.EndpointSlice)) error {
	api := client.DiscoveryV1().EndpointSlices(cur.Namespace)
	base := cur
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if base == nil {
			fresh, err := api.Get(ctx, cur.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			base = fresh
		}
		x := base.DeepCopy()
		base = nil
		mutate(x)
		stampTrigger(x)
		_, err := api.Update(ctx, x, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("could not update EndpointSlice %s/%s: %w", cur.Namespace, cur.Name, err)
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
func (c *Cluster) scale(ctx context.Context, sl []*discoveryv1.EndpointSlice, s Step) (int, error) {
	live := selectEndpoints(sl, Step{Count: AllEndpoints})
	switch {
	case len(live) > s.Replicas:
		return changeEndpoints(ctx, c.Client, sl, live[s.Replicas:], ActRemove, false)
	case len(live) < s.Replicas:
		return c.scaleUp(ctx, sl, s.Replicas-len(live), len(live))
	}
	return 0, nil
}

// scaleUp adds count endpoints, the k-th (from first) on node k mod the
// node count in name order: the last slice is filled up to
// scenario.MaxEndpointsPerSlice, then new slices are created with theirs.
func (c *Cluster) scaleUp(ctx context.Context, sl []*discoveryv1.EndpointSlice, count, first int) (int, error) {
	nl, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("could not list Nodes: %w", err)
	}
	nodes := nl.Items
	if len(nodes) == 0 {
		return 0, fmt.Errorf("no Node to place endpoints on")
	}
	slices.SortFunc(nodes, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	add := make([]discoveryv1.Endpoint, 0, count)
	c.mu.Lock()
	used := c.usedAddrs(sl)
	for k := first; k < first+count; k++ {
		ep, err := newEndpoint(&nodes[k%len(nodes)], used)
		if err != nil {
			c.mu.Unlock()
			return 0, err
		}
		add = append(add, ep)
	}
	c.mu.Unlock()
	last, n := sl[len(sl)-1], 0
	if room := scenario.MaxEndpointsPerSlice - len(last.Endpoints); room > 0 {
		put := add[:min(room, len(add))]
		add = add[len(put):]
		if err := updateSlice(ctx, c.Client, last, func(x *discoveryv1.EndpointSlice) { x.Endpoints = append(x.Endpoints, put...) }); err != nil {
			return n, err
		}
		n++
	}
	taken := map[string]bool{}
	for _, x := range sl {
		taken[x.Name] = true
	}
	for k := len(sl); len(add) > 0; k++ {
		name := fmt.Sprintf("%s-s%d", last.Labels[discoveryv1.LabelServiceName], k)
		if taken[name] {
			continue
		}
		put := add[:min(scenario.MaxEndpointsPerSlice, len(add))]
		add = add[len(put):]
		next := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: last.Namespace, Labels: last.Labels, Annotations: last.Annotations},
			AddressType: last.AddressType,
			Ports:       last.Ports,
			Endpoints:   put,
		}
		next = next.DeepCopy()
		stampTrigger(next)
		if _, err := c.Client.DiscoveryV1().EndpointSlices(next.Namespace).Create(ctx, next, metav1.CreateOptions{}); err != nil {
			return n, fmt.Errorf("could not create EndpointSlice %s/%s: %w", next.Namespace, name, err)
		}
		n++
	}
	return n, nil
}

// usedAddrs is every endpoint address known: the informer cache's, the
// slices just read, and those scale handed out before. Call with c.mu held.
func (c *Cluster) usedAddrs(sl []*discoveryv1.EndpointSlice) map[netip.Addr]bool {
	used := c.allocated
	mark := func(x *discoveryv1.EndpointSlice) {
		for _, ep := range x.Endpoints {
			if len(ep.Addresses) > 0 {
				if a, err := netip.ParseAddr(ep.Addresses[0]); err == nil {
					used[a] = true
				}
			}
		}
	}
	for _, o := range c.slice.GetStore().List() {
		mark(o.(*discoveryv1.EndpointSlice))
	}
	for _, x := range sl {
		mark(x)
	}
	return used
}

// newEndpoint returns a ready endpoint on node n at the first free address
// of its pod block (from the third), and marks the address used.
func newEndpoint(n *corev1.Node, used map[netip.Addr]bool) (discoveryv1.Endpoint, error) {
	p, err := netip.ParsePrefix(n.Spec.PodCIDR)
	if err != nil {
		return discoveryv1.Endpoint{}, fmt.Errorf("node %s has no pod CIDR", n.Name)
	}
	a := p.Addr().Next().Next()
	for used[a] && p.Contains(a.Next()) {
		a = a.Next()
	}
	if !p.Contains(a.Next()) {
		return discoveryv1.Endpoint{}, fmt.Errorf("node %s's pod block %s is full", n.Name, p)
	}
	used[a] = true
	return readyEndpoint(a, n), nil
}

// updateService applies a service-update event to the API's current
// Service (Get, retried on conflict); a change that leaves the spec as it
// is writes nothing.
func updateService(ctx context.Context, client kubernetes.Interface, ns, name string, e *scenario.Event) (int, error) {
	api := client.CoreV1().Services(ns)
	n := 0
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := cur.DeepCopy()
		changeService(s, e)
		if err := healthCheckPort(ctx, client, s); err != nil {
			return err
		}
		if equality.Semantic.DeepEqual(s.Spec, cur.Spec) {
			return nil
		}
		if _, err := api.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			return err
		}
		n = 1
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("could not update Service %s/%s: %w", ns, name, err)
	}
	return n, nil
}

// healthCheckPort gives s the healthCheckNodePort the API server's update
// would (pkg/registry/core/service/storage/alloc.go): a Service that now
// needs a health check (LoadBalancer, externalTrafficPolicy Local) and has
// no port gets the lowest one of the node port range that no Service holds
// (a real API server picks at random; it takes the one given), and one that
// no longer needs it loses it (the fake clientset does neither).
func healthCheckPort(ctx context.Context, client kubernetes.Interface, s *corev1.Service) error {
	if !scenario.NeedsHealthCheck(s) {
		s.Spec.HealthCheckNodePort = 0
		return nil
	}
	if s.Spec.HealthCheckNodePort != 0 {
		return nil
	}
	all, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	used := map[int32]bool{}
	for _, o := range all.Items {
		for _, p := range o.Spec.Ports {
			used[p.NodePort] = true
		}
		used[o.Spec.HealthCheckNodePort] = true
	}
	for p := int32(scenario.NodePortMin); p <= scenario.NodePortMax; p++ {
		if !used[p] {
			s.Spec.HealthCheckNodePort = p
			return nil
		}
	}
	return fmt.Errorf("no node port left in %d-%d for the health check of Service %s/%s", scenario.NodePortMin, scenario.NodePortMax, s.Namespace, s.Name)
}

// changeService applies a service-update event's fields to s. Session
// affinity None clears sessionAffinityConfig (validation forbids one with
// None; kube-apiserver's defaulting clears it first, the fake clientset does
// not), so a timeout alone changes nothing on a None Service; ClientIP
// without a config gets the default timeout, as the API would default it.
func changeService(s *corev1.Service, e *scenario.Event) {
	if e.SessionAffinity != "" {
		s.Spec.SessionAffinity = corev1.ServiceAffinity(e.SessionAffinity)
		if e.SessionAffinity == "None" {
			s.Spec.SessionAffinityConfig = nil
		}
	}
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
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
}
