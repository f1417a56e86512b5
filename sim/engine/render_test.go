package engine

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
)

const thisNode = "test-hostname"

func sp(typ corev1.ServiceType) *cluster.ServicePort {
	return &cluster.ServicePort{
		Name:      cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns1", Name: "svc1"}, Port: "p80", Protocol: corev1.ProtocolTCP},
		Type:      typ,
		ClusterIP: netip.MustParseAddr("172.30.1.1"),
		Port:      80,
	}
}

func ep(ip, conds, node string) *cluster.Endpoint {
	return &cluster.Endpoint{
		IP: netip.MustParseAddr(ip), Port: 80, NodeName: node,
		Ready: strings.Contains(conds, "R"), Serving: strings.Contains(conds, "S"), Terminating: strings.Contains(conds, "T"),
	}
}

func show(r Rules) string {
	if r.Verdict != Accept {
		return r.Verdict.String()
	}
	return r.String()
}

// TestRenderReferenceVectors runs the reference vectors with traffic
// outcomes (harness/testenv/testdata/vectors.yaml) through the engine's
// endpoint selection (the dataplane's eligibility, then each mode's choice).
func TestRenderReferenceVectors(t *testing.T) {
	all := func(ips ...string) []*cluster.Endpoint {
		var out []*cluster.Endpoint
		for _, s := range ips {
			f := strings.Split(s, "/")
			out = append(out, ep(f[0], f[1], f[2]))
		}
		return out
	}
	ids := NewInterner()
	// ipvs falls back to cluster endpoints only for a service port that
	// uses them, that is one reachable from outside (here a NodePort).
	np := sp(corev1.ServiceTypeNodePort)
	np.NodePort, np.InternalLocal = 30080, true
	if got := show(Render(IPVS, np, all("10.0.1.1/RS/host0", "10.0.1.2/RS/host1"), thisNode, "", ids, RenderOptions{})); got != "10.0.1.1:80, 10.0.1.2:80" {
		t.Errorf("ipvs NodePort ITP local, none local: %s", got)
	}
	for _, c := range testenv.TrafficVectors(t) {
		s := sp(corev1.ServiceType(c.Service.Type))
		s.NodePort, s.InternalLocal, s.ExternalLocal = c.Service.NodePort, c.Service.InternalLocal, c.Service.ExternalLocal
		var eps []*cluster.Endpoint
		for _, e := range c.Endpoints {
			node := "host1"
			if e.Local() {
				node = thisNode
			}
			eps = append(eps, ep(e.IP, e.Cond, node))
		}
		for _, mode := range []Mode{IPTables, NFTables, IPVS} {
			want := c.Outcomes(mode.String())
			if got := show(Render(mode, s, eps, thisNode, c.Zone, ids, RenderOptions{})); got != want.Pod {
				t.Errorf("%s [%v] pod→ClusterIP: %s, want %s", c.Name, mode, got, want.Pod)
			}
			if want.External == "" {
				continue
			}
			if got := show(RenderExternal(mode, s, eps, thisNode, c.Zone, ids, RenderOptions{})); got != want.External {
				t.Errorf("%s [%v] external→node port: %s, want %s", c.Name, mode, got, want.External)
			}
		}
	}
}

func TestRenderOrderAndSettings(t *testing.T) {
	s := sp(corev1.ServiceTypeClusterIP)
	s.ClientIPAffinity, s.AffinityTimeout = true, 30
	eps := []*cluster.Endpoint{ep("10.0.1.2", "RS", "a"), ep("10.0.1.10", "RS", "a"), ep("10.0.1.1", "RS", "b")}
	r := Render(IPTables, s, eps, "a", "", NewInterner(), RenderOptions{})
	// kube-proxy sorts by the "ip:port" string: "10.0.1.10:80" < "10.0.1.1:80"
	// since '0' < ':'.
	if got := r.String(); got != "10.0.1.10:80, 10.0.1.1:80, 10.0.1.2:80" {
		t.Errorf("order %s", got)
	}
	if r.AffinityTimeout.Seconds() != 30 || r.Proto != TCP || r.VIP != 0xAC1E0101 || r.VPort != 80 {
		t.Errorf("settings %+v", r)
	}
}

// TestRenderAgreesWithOracle compares the subject's endpoint selection (the
// dataplane's own eligibility, dataplane/proxy, and each mode's choice) with
// the oracle's, written after the documentation, on random service ports and
// endpoint sets: every Service type, with and without a node port, both
// traffic policies, topology hints with and without the PreferSameNode gate,
// and every combination of endpoint conditions.
//
// The service ports are those the API server can produce, and one it cannot:
// a NodePort or LoadBalancer port without a node port (the API server
// allocates one, except for a LoadBalancer with allocateLoadBalancerNodePorts
// false). On it the two readings must still agree: it is not reachable from
// outside. A ClusterIP port with a node port is not generated: the API server
// rejects it, and the readings legitimately differ there (kube-proxy, and the
// oracle, read the node port alone; the dataplane also requires the type).
func TestRenderAgreesWithOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 29))
	nodes := []string{thisNode, "host1", "host2", ""}
	zones := []string{"za", "zb", ""}
	types := []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}
	ids := NewInterner()
	// covered counts the cases that once went unseen (the engine and the
	// oracle shared a predicate the dataplane did not): ipvs,
	// internalTrafficPolicy Local, no local endpoint, a usable one elsewhere,
	// a NodePort or LoadBalancer type, with and without a node port.
	covered := map[bool]int{}
	for iter := range 5000 {
		var eps []*cluster.Endpoint
		hints := rng.IntN(3) // 0 none, 1 all ready have hints, 2 random
		for i := range rng.IntN(7) {
			e := &cluster.Endpoint{
				IP: netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)}), Port: 80,
				Ready: rng.IntN(2) == 0, Serving: rng.IntN(2) == 0, Terminating: rng.IntN(2) == 0,
				NodeName: nodes[rng.IntN(len(nodes))],
			}
			if hints == 1 || (hints == 2 && rng.IntN(2) == 0) {
				e.ZoneHints = []string{zones[rng.IntN(2)]}
				e.NodeHints = []string{nodes[rng.IntN(3)]}
			}
			eps = append(eps, e)
		}
		s := sp(types[rng.IntN(len(types))])
		if s.Type != corev1.ServiceTypeClusterIP && rng.IntN(3) != 0 {
			s.NodePort = 30000 + rng.Int32N(2768)
		}
		s.InternalLocal = rng.IntN(2) == 0
		// The tracker sets ExternalLocal only for NodePort and LoadBalancer.
		s.ExternalLocal = s.Type != corev1.ServiceTypeClusterIP && rng.IntN(2) == 0
		zone := zones[rng.IntN(len(zones))]
		sameNode := rng.IntN(2) == 0
		or := oracle.Oracle{PreferSameNode: sameNode}
		opts := RenderOptions{PreferSameNode: sameNode}
		usableLocal := slices.ContainsFunc(eps, func(e *cluster.Endpoint) bool {
			return e.NodeName == thisNode && (e.Ready || (e.Serving && e.Terminating))
		})
		usable := slices.ContainsFunc(eps, func(e *cluster.Endpoint) bool { return e.Ready || (e.Serving && e.Terminating) })
		if s.Type != corev1.ServiceTypeClusterIP && s.InternalLocal && usable && !usableLocal {
			covered[s.NodePort != 0]++
		}
		for _, mode := range []Mode{IPTables, NFTables, IPVS} {
			want := or.Expect(mode.Cluster(), s, eps, thisNode, zone)
			got := Render(mode, s, eps, thisNode, zone, ids, opts)
			if msg := agree(want, got); msg != "" {
				t.Fatalf("iteration %d, %v, %s: %s\nendpoints: %s", iter, mode, describe(s), msg, dump(eps))
			}
			if s.NodePort == 0 {
				continue // no destination outside the cluster IP
			}
			want = or.ExpectExternal(mode.Cluster(), s, eps, thisNode, zone)
			got = RenderExternal(mode, s, eps, thisNode, zone, ids, opts)
			if msg := agree(want, got); msg != "" {
				t.Fatalf("iteration %d, %v external, %s: %s\nendpoints: %s", iter, mode, describe(s), msg, dump(eps))
			}
		}
	}
	// About 5000 × 2/3 × 1/2 × P(usable elsewhere, none local) × 1/3 or 2/3.
	if covered[false] < 50 || covered[true] < 100 {
		t.Errorf("the generator rarely built the Local-without-local-endpoint case on NodePort/LoadBalancer: %d without a node port, %d with", covered[false], covered[true])
	}
}

func describe(s *cluster.ServicePort) string {
	return fmt.Sprintf("type=%s nodePort=%d itp-local=%v etp-local=%v", s.Type, s.NodePort, s.InternalLocal, s.ExternalLocal)
}

func agree(want oracle.Outcome, got Rules) string {
	kind := map[Verdict]oracle.Kind{Accept: oracle.Endpoints, Drop: oracle.Drop, Reject: oracle.Reject}[got.Verdict]
	if kind != want.Kind {
		return fmt.Sprintf("oracle %s, engine %s", want, show(got))
	}
	if kind != oracle.Endpoints {
		return ""
	}
	var g []string
	for _, b := range got.Backends {
		g = append(g, netip.AddrPortFrom(AddrFromIPv4(b.IP), b.Port).String())
	}
	slices.Sort(g)
	if !slices.Equal(g, want.Endpoints()) {
		return fmt.Sprintf("oracle %s, engine %s", want, show(got))
	}
	return ""
}

func dump(eps []*cluster.Endpoint) string {
	var b strings.Builder
	for _, e := range eps {
		fmt.Fprintf(&b, "%s R=%v S=%v T=%v node=%q zh=%v nh=%v; ", e, e.Ready, e.Serving, e.Terminating, e.NodeName, e.ZoneHints, e.NodeHints)
	}
	return b.String()
}
