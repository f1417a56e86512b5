package cost

import (
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
)

func TestCountIPTablesShape(t *testing.T) {
	in := []ServicePortInput{
		{Endpoints: 3, Reachable: 3},
		{Endpoints: 2, Reachable: 2, Affinity: true},
		{Reject: true},
	}
	c := Count("iptables", in, true)
	// per Service: 1 KUBE-SERVICES + 1 masq + n cascade + 2n SEP (+ n affinity)
	wantNat := 5 + (1 + 1 + 3 + 6) + (1 + 1 + 2 + 4 + 2)
	if c.NatRules != wantNat || c.FilterRules != 4+1 || c.Chains != 10+4+3 {
		t.Errorf("counts %+v, want nat %d filter 5 chains 17", c, wantNat)
	}
}

func TestFirstPacketOrder(t *testing.T) {
	in := make([]ServicePortInput, 1000)
	for i := range in {
		in[i] = ServicePortInput{Endpoints: 1, Reachable: 1}
	}
	fp := FirstPackets(cluster.ModeIPTables, in, nil, true)
	if fp.RulesP50 < 500 || fp.RulesP50 > 510 || fp.RulesP99 < 990 || fp.RulesP99 > 1000 {
		t.Errorf("uniform traffic over 1000 Services: %+v", fp)
	}
	if fp.NodePort != nil || fp.LoadBalancer != nil || fp.ClusterIP == nil || *fp.ClusterIP != (PathWalk{fp.RulesP50, fp.RulesP99}) {
		t.Errorf("cluster IPs only: %+v", fp)
	}
}

// withExternal is 1000 one-endpoint ClusterIP ports, port 500 with a node
// port and port 700 with a node port and two load-balancer IPs, both
// externalTrafficPolicy Cluster.
func withExternal() []ServicePortInput {
	in := make([]ServicePortInput, 1000)
	for i := range in {
		in[i] = ServicePortInput{Endpoints: 1, Reachable: 1}
	}
	in[500].External = External{NodePort: true, Endpoints: 1, SameChain: true}
	in[700].External = External{NodePort: true, LoadBalancerIPs: 2, Endpoints: 1, SameChain: true}
	return in
}

// In iptables mode a node port is reached after every rule of
// KUBE-SERVICES (1000 cluster IPs, 2 load-balancer IPs, the jump), its
// position in KUBE-NODEPORTS (two rules a port), KUBE-EXT (masquerade
// jump, KUBE-MARK-MASQ's rule, the jump on) and the policy chain
// (masquerade check, the one endpoint, KUBE-SEP's two): 1003 + 2 + 3 + 4
// for the first; a load-balancer IP at its rule's position (700 cluster
// IPs before it, its own, then the IP's).
func TestFirstPacketIPTablesExternal(t *testing.T) {
	fp := FirstPackets(cluster.ModeIPTables, withExternal(), nil, true)
	if fp.NodePort == nil || *fp.NodePort != (PathWalk{1012, 1014}) {
		t.Errorf("node ports: %+v, want 1012/1014", fp.NodePort)
	}
	if fp.LoadBalancer == nil || *fp.LoadBalancer != (PathWalk{702 + 7, 703 + 7}) {
		t.Errorf("load-balancer IPs: %+v, want 709/710", fp.LoadBalancer)
	}
	// Past port 700, the cluster IPs move down by its two rules.
	w := &Weights{ClusterIP: make([]float64, 1000)}
	w.ClusterIP[999] = 1
	if fp := FirstPackets(cluster.ModeIPTables, withExternal(), w, true); fp.RulesP50 != 999+2+1+4 || fp.NodePort != nil {
		t.Errorf("the last cluster IP: %+v, want 1006 and no node port", fp)
	}
	// A port's connections spread over its load-balancer IPs: as many to
	// the first cluster IP (0 + 1 + 4 rules) as to both IPs together.
	w = &Weights{ClusterIP: make([]float64, 1000), LoadBalancer: make([]float64, 1000)}
	w.ClusterIP[0], w.LoadBalancer[700] = 1, 1
	if fp := FirstPackets(cluster.ModeIPTables, withExternal(), w, true); fp.RulesP50 != 5 || fp.RulesP99 != 710 {
		t.Errorf("one cluster IP and one load balancer alike: %s, want 5/710", fp)
	}
	// Local without a local endpoint: KUBE-EXT's three short-circuits,
	// then filter's DROP.
	in := withExternal()
	in[500].External = External{NodePort: true, Local: true}
	w = &Weights{NodePort: make([]float64, 1000)}
	w.NodePort[500] = 1
	if fp := FirstPackets(cluster.ModeIPTables, in, w, true); fp.NodePort == nil || fp.NodePort.RulesP99 != 1003+2+3 {
		t.Errorf("Local node port without endpoints: %+v, want 1008", fp.NodePort)
	}
}

// nftables and IPVS walk the same rules whatever the Service count.
func TestFirstPacketConstantModes(t *testing.T) {
	for _, tc := range []struct {
		mode            cluster.Mode
		cluster, np, lb float64
	}{
		// firewall-check, masquerade check, service-ips, the DNAT; a node
		// port misses service-ips, then service-nodeports and the
		// external chain's two rules.
		{cluster.ModeNFTables, 4, 7, 6},
		// KUBE-SERVICES: RETURN, LB jump, masquerade check, the node-port
		// jump into KUBE-NODE-PORT (one rule), the ACCEPT, the lookup.
		{cluster.ModeIPVS, 7, 9, 10},
	} {
		all := withExternal()
		for _, in := range [][]ServicePortInput{all, {all[0], all[500], all[700]}} {
			fp := FirstPackets(tc.mode, in, nil, true)
			if fp.ClusterIP == nil || fp.NodePort == nil || fp.LoadBalancer == nil ||
				fp.ClusterIP.RulesP99 != tc.cluster || fp.NodePort.RulesP99 != tc.np || fp.LoadBalancer.RulesP99 != tc.lb {
				t.Errorf("%s over %d service ports: %s, want %v/%v/%v", tc.mode, len(in), fp, tc.cluster, tc.np, tc.lb)
			}
		}
	}
}
