package simulate

import (
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

// TestExternalCosts: the placement scenario's two Services, shop
// (load-balancer IP and node port, externalTrafficPolicy Local, a health
// check node port) and catalog (node port, Cluster), with six pods each on
// three nodes (1, 2, 3), reached only from outside: shop through its
// load-balancer IP, catalog through its node port. The counts are the two
// service ports' objects with their external ones, whatever entries the
// traffic has; the first packets walk the external paths, worked out by
// hand from kube-proxy's layout on the node with three pods:
//
//   - iptables, catalog's node port: KUBE-SERVICES' 4 rules (2 cluster
//     IPs, shop's load-balancer IP, the jump), KUBE-NODEPORTS' first 2,
//     KUBE-EXT's masquerade jump, KUBE-MARK-MASQ's rule and the jump on,
//     then KUBE-SVC: masquerade check, 3.5 cascade rules, KUBE-SEP's 2:
//     15.5. shop's load-balancer IP: its rule is KUBE-SERVICES' third,
//     KUBE-EXT's three short-circuit checks and the jump, KUBE-SVL's 2
//     cascade rules (3 local pods) and KUBE-SEP's 2: 11.
//   - nftables: firewall-check, the masquerade check, service-ips (missed),
//     service-nodeports, the external chain's 2, the DNAT: 7; shop:
//     firewall-check, masquerade check, service-ips, the external chain's
//     4, the DNAT: 8.
//   - ipvs: KUBE-SERVICES holds 6 rules (RETURN, the load-balancer jump,
//     the masquerade check, the node-port jump, two ACCEPTs), KUBE-NODE-PORT
//     2 (TCP -LOCAL and TCP): catalog 6 + 2 + KUBE-MARK-MASQ's rule + the
//     lookup = 10; shop 6 + KUBE-LOAD-BALANCER-LOCAL's RETURN + 2 + the
//     lookup = 10.
func TestExternalCosts(t *testing.T) {
	r := simulate(t, placementScenario, nil, Options{})
	want := map[cluster.Mode]struct{ nodePort, lb float64 }{
		cluster.ModeIPTables: {15.5, 11}, cluster.ModeNFTables: {7, 8}, cluster.ModeIPVS: {10, 10},
	}
	for _, m := range r.Modes {
		fp := m.FirstPacket
		w := want[m.Mode]
		if fp.ClusterIP != nil || fp.NodePort == nil || fp.LoadBalancer == nil {
			t.Fatalf("%s: first packets %+v, want node-port and load-balancer walks only", m.Mode, fp)
		}
		if *fp.NodePort != (cost.PathWalk{RulesP50: w.nodePort, RulesP99: w.nodePort}) || fp.LoadBalancer.RulesP99 != w.lb {
			t.Errorf("%s: node port %+v, load balancer %+v, want %v and p99 %v", m.Mode, *fp.NodePort, *fp.LoadBalancer, w.nodePort, w.lb)
		}
	}
	for _, m := range r.Modes {
		c := m.Rules.Counts
		// Two cluster IPs; shop's load-balancer IP and node port (one
		// node address), catalog's node port. Real servers on node-3:
		// 6 + 6 cluster, shop's 3 local twice, catalog's 6.
		if m.Mode == cluster.ModeIPVS && (c.VirtualServers != 5 || c.RealServers != 24) {
			t.Errorf("ipvs: %d virtual and %d real servers, want 5 and 24", c.VirtualServers, c.RealServers)
		}
		// 10 fixed; KUBE-SVC for both (shop's short-circuits use its
		// Cluster chain), KUBE-SVL for shop, KUBE-EXT for both, and
		// KUBE-SEP for every endpoint of both.
		if m.Mode == cluster.ModeIPTables && c.Chains != 10+2+1+2+12 {
			t.Errorf("iptables: %d chains, want 27", c.Chains)
		}
	}
}
