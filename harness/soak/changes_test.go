package soak

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

func openSoak(t *testing.T) (*apiserver.Model, *Generator, *cluster.Tracker) {
	t.Helper()
	ctx := context.Background()
	m, err := apiserver.Open(ctx, "../../scenarios/soak.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	tr, err := m.Cluster.AddTrackerSynced(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGenerator(ctx, m.Cluster.Client, netip.MustParsePrefix(m.Loaded.Scenario.Cluster.ServiceCIDR),
		scenario.NewRand(m.Expanded.Seed, streamSoak), boundsFor(m.State))
	if err != nil {
		t.Fatal(err)
	}
	return m, g, tr
}

// TestGeneratorValid makes 2,000 changes and, after each, holds every
// object against the API's rules and the generator's bounds; it also
// checks that Change.Writes is exactly the number of informer events each
// tracker gets (the soak settles on it).
func TestGeneratorValid(t *testing.T) {
	m, g, tr := openSoak(t)
	ctx := context.Background()
	serviceCIDR := netip.MustParsePrefix(m.Loaded.Scenario.Cluster.ServiceCIDR)
	b := boundsFor(m.State)
	base := tr.Seq()
	writes := 0
	for i := 1; i <= 2000; i++ {
		ch, err := g.Next(ctx)
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		if ch.Writes < 1 {
			t.Fatalf("change %d (%s) made no API write", i, ch)
		}
		writes += ch.Writes
		if err := waitSeq(ctx, tr, base+uint64(writes), 10*time.Second); err != nil {
			t.Fatalf("change %d (%s): %v", i, ch, err)
		}
		if i%20 == 0 || ch.Kind == ChangeServiceCreate || ch.Kind == ChangeServiceDelete {
			if err := checkObjects(ctx, m, serviceCIDR, b); err != nil {
				t.Fatalf("after change %d (%s): %v", i, ch, err)
			}
		}
		if i%100 == 0 {
			clearActions(m)
		}
	}
	// No event beyond the writes counted.
	time.Sleep(50 * time.Millisecond)
	if got := tr.Seq() - base; got != uint64(writes) {
		t.Errorf("tracker got %d events for %d counted writes", got, writes)
	}
	for _, k := range Kinds() {
		if g.Counts()[k] == 0 {
			t.Errorf("no %s change in 2,000", k)
		}
	}
}

func checkObjects(ctx context.Context, m *apiserver.Model, serviceCIDR netip.Prefix, b Bounds) error {
	c := m.Cluster.Client
	nodes, _ := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	blocks := map[string]netip.Prefix{}
	for _, n := range nodes.Items {
		blocks[n.Name] = netip.MustParsePrefix(n.Spec.PodCIDR)
	}
	svcs, _ := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if n := len(svcs.Items); n < b.MinServices || n > b.MaxServices {
		return fmt.Errorf("%d Services, bounds %d..%d", n, b.MinServices, b.MaxServices)
	}
	byName := map[string]*corev1.Service{}
	ips := map[string]bool{}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		byName[s.Namespace+"/"+s.Name] = s
		ip, err := netip.ParseAddr(s.Spec.ClusterIP)
		if err != nil || !serviceCIDR.Contains(ip) || ips[s.Spec.ClusterIP] {
			return fmt.Errorf("service %s: clusterIP %q invalid, outside %s or not unique", s.Name, s.Spec.ClusterIP, serviceCIDR)
		}
		ips[s.Spec.ClusterIP] = true
		switch s.Spec.SessionAffinity {
		case corev1.ServiceAffinityClientIP:
			cfg := s.Spec.SessionAffinityConfig
			if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil || *cfg.ClientIP.TimeoutSeconds < 1 || *cfg.ClientIP.TimeoutSeconds > 86400 {
				return fmt.Errorf("service %s: ClientIP affinity without a timeout in 1..86400", s.Name)
			}
		case corev1.ServiceAffinityNone, "":
			if s.Spec.SessionAffinityConfig != nil {
				return fmt.Errorf("service %s: sessionAffinityConfig with affinity None (the API rejects it)", s.Name)
			}
		default:
			return fmt.Errorf("service %s: sessionAffinity %q", s.Name, s.Spec.SessionAffinity)
		}
		if p := s.Spec.InternalTrafficPolicy; p != nil && *p != corev1.ServiceInternalTrafficPolicyLocal && *p != corev1.ServiceInternalTrafficPolicyCluster {
			return fmt.Errorf("service %s: internalTrafficPolicy %q", s.Name, *p)
		}
		for _, p := range s.Spec.Ports {
			if p.Port < 1 || p.Port > 65535 || (p.Protocol != corev1.ProtocolTCP && p.Protocol != corev1.ProtocolUDP) {
				return fmt.Errorf("service %s: port %v", s.Name, p)
			}
		}
	}
	sl, _ := c.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	addrs := map[string]bool{}
	perService := map[string]int{}
	for _, s := range sl.Items {
		svc := byName[s.Namespace+"/"+s.Labels[discoveryv1.LabelServiceName]]
		if svc == nil {
			return fmt.Errorf("endpointslice %s/%s: no Service %q (deleted Services' slices must go)", s.Namespace, s.Name, s.Labels[discoveryv1.LabelServiceName])
		}
		if s.AddressType != discoveryv1.AddressTypeIPv4 || len(s.Endpoints) > scenario.MaxEndpointsPerSlice {
			return fmt.Errorf("endpointslice %s: address type %s, %d endpoints", s.Name, s.AddressType, len(s.Endpoints))
		}
		for _, p := range s.Ports {
			if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
				return fmt.Errorf("endpointslice %s: port %v", s.Name, p)
			}
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) != 1 || ep.NodeName == nil {
				return fmt.Errorf("endpointslice %s: endpoint %v without one address and a node", s.Name, ep)
			}
			a := netip.MustParseAddr(ep.Addresses[0])
			if !blocks[*ep.NodeName].Contains(a) || addrs[ep.Addresses[0]] {
				return fmt.Errorf("endpointslice %s: address %s outside node %s's block or not unique", s.Name, a, *ep.NodeName)
			}
			addrs[ep.Addresses[0]] = true
			cond := ep.Conditions
			if isTrue(cond.Terminating, false) && isTrue(cond.Ready, true) {
				return fmt.Errorf("endpointslice %s: %s is terminating and ready (the API never says so)", s.Name, a)
			}
			if !isTrue(cond.Terminating, false) && isTrue(cond.Ready, true) != isTrue(cond.Serving, true) {
				return fmt.Errorf("endpointslice %s: %s ready %v serving %v while not terminating", s.Name, a, cond.Ready, cond.Serving)
			}
		}
		perService[s.Namespace+"/"+s.Labels[discoveryv1.LabelServiceName]] += len(s.Endpoints)
	}
	for name, n := range perService {
		// Scale-up stops at the bound; the scenario's own Services start
		// below it (max 40).
		if n > b.MaxEndpoints {
			return fmt.Errorf("service %s: %d endpoints, bound %d", name, n, b.MaxEndpoints)
		}
	}
	return nil
}

// TestGeneratorReproducible: the same seed and objects give the same changes.
func TestGeneratorReproducible(t *testing.T) {
	var runs [2][]string
	for r := range runs {
		_, g, tr := openSoak(t)
		ctx := context.Background()
		base, writes := tr.Seq(), 0
		for i := 0; i < 300; i++ {
			ch, err := g.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			runs[r] = append(runs[r], ch.String())
			// Keep the informer within the fake watch's 100 events
			// (it panics when full, as a loaded machine showed).
			writes += ch.Writes
			if err := waitSeq(ctx, tr, base+uint64(writes), 10*time.Second); err != nil {
				t.Fatalf("change %d (%s): %v", i, ch, err)
			}
		}
	}
	if !slices.Equal(runs[0], runs[1]) {
		for i := range runs[0] {
			if runs[0][i] != runs[1][i] {
				t.Fatalf("change %d differs: %q against %q", i, runs[0][i], runs[1][i])
			}
		}
	}
}
