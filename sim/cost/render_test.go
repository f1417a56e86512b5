package cost_test

// Count against the rules dataplane/ renders for the same node: every
// count is the renderers' own, for ClusterIP Services and for node ports,
// external IPs, load-balancer IPs (with and without source ranges, one
// holding the node's address or not), health-check node ports and both
// traffic policies, with and without local endpoints.

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/ipvs"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
)

const testNode = "node-0"

var (
	testNodeIP  = netip.MustParseAddr("198.18.0.10")
	testPodCIDR = netip.MustParsePrefix("10.128.0.0/9")
	testSvcCIDR = netip.MustParsePrefix("10.96.0.0/16")
)

// portSpec is one service port of the test state.
type portSpec struct {
	proto                   corev1.Protocol
	eps, local              int // endpoints, of which on testNode
	affinity                bool
	internalLocal, extLocal bool
	nodePort, hc            bool
	extIPs, lbIPs           int
	ranges                  []string
	notReadyLocal           int // more local endpoints, not ready
	name                    string
}

// externalState is a node's worth of every external shape the counts
// distinguish, and plain ClusterIP ports around them.
func externalState() *cluster.State {
	specs := []portSpec{
		{name: "plain", eps: 3},
		{name: "affinity", eps: 4, local: 1, affinity: true},
		{name: "reject"},
		{name: "itp-local-none", eps: 2, internalLocal: true},
		{name: "np-cluster", eps: 4, local: 1, nodePort: true},
		{name: "np-local", eps: 5, local: 2, extLocal: true, nodePort: true},
		{name: "np-local-none", eps: 3, extLocal: true, nodePort: true},
		{name: "lb-local-hc", eps: 3, local: 1, extLocal: true, nodePort: true, hc: true, lbIPs: 2},
		{name: "lb-ranges-node", eps: 2, nodePort: true, lbIPs: 1, ranges: []string{"198.18.0.0/24", "203.0.113.0/24"}},
		{name: "lb-range-other", eps: 2, lbIPs: 2, ranges: []string{"203.0.113.0/24"}},
		{name: "lb-range-one", eps: 1, local: 1, lbIPs: 1, ranges: []string{"203.0.113.0/24"}, extLocal: true},
		{name: "ext-ips", eps: 2, extIPs: 2},
		{name: "ext-both-local", eps: 3, local: 1, extIPs: 1, extLocal: true, internalLocal: true},
		{name: "reject-external", nodePort: true, hc: true, extIPs: 1, lbIPs: 1, ranges: []string{"203.0.113.0/24"}},
		{name: "itp-local-np", eps: 2, internalLocal: true, nodePort: true},
		{name: "udp-aff-local", proto: corev1.ProtocolUDP, eps: 3, local: 2, affinity: true, extLocal: true, nodePort: true},
		{name: "sctp-np", proto: corev1.ProtocolSCTP, eps: 2, local: 1, nodePort: true, notReadyLocal: 1},
	}
	st := &cluster.State{Services: map[cluster.ServicePortName]*cluster.ServicePort{}, Endpoints: map[cluster.ServicePortName][]*cluster.Endpoint{},
		Nodes: map[string]*cluster.Node{}}
	for i := range 3 {
		n := fmt.Sprintf("node-%d", i)
		st.Nodes[n] = &cluster.Node{Name: n, IP: netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)})}
	}
	for i, p := range specs {
		addPort(st, i, p)
	}
	return st
}

func addPort(st *cluster.State, i int, p portSpec) {
	proto := p.proto
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	spn := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: p.name}, Port: "p", Protocol: proto}
	sp := &cluster.ServicePort{Name: spn, Type: corev1.ServiceTypeClusterIP, ClusterIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), Port: 80,
		TargetPort: "8080", InternalLocal: p.internalLocal, ExternalLocal: p.extLocal}
	if p.affinity {
		sp.ClientIPAffinity, sp.AffinityTimeout = true, 10800
	}
	if p.nodePort {
		sp.Type, sp.NodePort = corev1.ServiceTypeNodePort, int32(30000+i)
	}
	if p.hc {
		sp.HealthCheckNodePort = int32(32000 + i)
	}
	for j := range p.extIPs {
		sp.ExternalIPs = append(sp.ExternalIPs, netip.AddrFrom4([4]byte{192, 0, 2, byte(10*i + j)}))
	}
	for j := range p.lbIPs {
		sp.Type = corev1.ServiceTypeLoadBalancer
		sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.AddrFrom4([4]byte{198, 51, 100, byte(10*i + j)}))
	}
	for _, r := range p.ranges {
		sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(r))
	}
	var eps []*cluster.Endpoint
	for j := range p.eps + p.notReadyLocal {
		node := fmt.Sprintf("node-%d", 1+j%2)
		if j < p.local || j >= p.eps {
			node = testNode
		}
		ready := j < p.eps
		eps = append(eps, &cluster.Endpoint{IP: netip.AddrFrom4([4]byte{10, 200, byte(i), byte(j + 1)}), Port: 8080, Ready: ready, Serving: ready, NodeName: node})
	}
	st.Services[spn], st.Endpoints[spn] = sp, eps
}

// costInputs are the cost model's inputs of st on testNode in a mode, as
// sim/simulate and sim/capacity build them.
func costInputs(t *testing.T, mode cluster.Mode, st *cluster.State) ([]cost.ServicePortInput, []cost.LocalPort) {
	t.Helper()
	em, err := engine.ModeOf(mode)
	if err != nil {
		t.Fatal(err)
	}
	names := st.SortedServicePorts()
	in := make([]cost.ServicePortInput, len(names))
	eps := make([][]*cluster.Endpoint, len(names))
	for i, n := range names {
		sp := st.Services[n]
		eps[i] = st.Endpoints[n]
		r := engine.Render(em, sp, eps[i], testNode, "", engine.NewInterner(), engine.RenderOptions{})
		in[i] = r.CostInput(n)
		engine.AddExternal(&in[i], em, sp, eps[i], testNode, "", testNodeIP, engine.RenderOptions{})
	}
	return in, cost.Locals([]string{testNode}, eps)[0]
}

func nodeConfig() dataplane.NodeConfig {
	return dataplane.NodeConfig{NodeName: testNode, ClusterCIDR: testPodCIDR, ServiceCIDRs: []netip.Prefix{testSvcCIDR}, NodeIPs: []netip.Addr{testNodeIP}}
}

func TestIPTablesCountsMatchRenderer(t *testing.T) {
	st := externalState()
	r, err := iptables.NewRenderer(iptables.Config{NodeConfig: nodeConfig()})
	if err != nil {
		t.Fatal(err)
	}
	r.SetNFAcct(map[string]bool{iptables.NFAcctInvalidDropped: true, iptables.NFAcctLocalhostNodePorts: true})
	rs, err := r.Render(st, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	in, local := costInputs(t, cluster.ModeIPTables, st)
	c := cost.CountOn(cluster.ModeIPTables, in, local, true)
	got := [4]int{c.NatRules, c.FilterRules, c.Chains, c.Objects}
	want := [4]int{rs.NATRules, rs.FilterRules, rs.NATChains + rs.FilterChains, rs.Lines - 4}
	if got != want {
		t.Errorf("nat rules, filter rules, chains, objects: cost %v, renderer %v\n%s", got, want, rs.Restore)
	}
	if d := float64(c.Bytes)/float64(len(rs.Restore)) - 1; d < -0.1 || d > 0.1 {
		t.Errorf("bytes: cost %d, renderer %d (%+.0f %%, want within 10 %%)", c.Bytes, len(rs.Restore), 100*d)
	}
}

func TestNFTablesCountsMatchRenderer(t *testing.T) {
	st := externalState()
	cfg := nftables.Config{NodeConfig: nodeConfig()}
	f := knftables.NewFake(knftables.IPv4Family, nftables.DefaultTable)
	b, err := nftables.NewBackend(cfg, f, nftables.BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(st, nil, true); err != nil {
		t.Fatal(err)
	}
	in, local := costInputs(t, cluster.ModeNFTables, st)
	c := cost.CountOn(cluster.ModeNFTables, in, local, true)
	got := [5]int{c.NFTChains, c.NFTRules, c.MapElements, c.Sets, c.AnonSets}
	want := nftTableCounts(t, f.Table)
	if got != want {
		t.Errorf("chains, rules, elements, affinity sets, anonymous sets: cost %v, renderer %v\n%s", got, want, f.Dump())
	}
}

// Inline sets and maps in rules: a numgen DNAT map, a numgen verdict map,
// a set of source ranges.
var (
	reInlineMap = regexp.MustCompile(`numgen random mod (\d+) (?:v?map) \{`)
	reInlineSet = regexp.MustCompile(`saddr != \{ ([^}]*) \}`)
)

// nftTableCounts counts a table the way cost.Count does: chains, rules,
// the elements of the named maps and sets kube-proxy fills per service
// port (cluster-ips, service-ips, service-nodeports, the no-endpoint maps,
// firewall-ips; not nodeport-ips or hairpin-connections) plus the entries
// of inline DNAT maps (one for a plain `dnat to`) and source-range sets,
// the affinity sets, and the anonymous sets (inline maps, sets of two or
// more entries).
func nftTableCounts(t *testing.T, tb *knftables.FakeTable) [5]int {
	t.Helper()
	var n [5]int
	n[0] = len(tb.Chains)
	for _, ch := range tb.Chains {
		n[1] += len(ch.Rules)
		for _, r := range ch.Rules {
			switch {
			case reInlineMap.MatchString(r.Rule):
				n[4]++
				if !strings.Contains(r.Rule, "vmap") {
					k, _ := strconv.Atoi(reInlineMap.FindStringSubmatch(r.Rule)[1])
					n[2] += k
				}
			case strings.Contains(r.Rule, "dnat to") && !strings.HasPrefix(ch.Name, "endpoint-"):
				n[2]++
			case reInlineSet.MatchString(r.Rule):
				if k := len(strings.Split(reInlineSet.FindStringSubmatch(r.Rule)[1], ",")); k >= 2 {
					n[2] += k
					n[4]++
				}
			}
		}
	}
	for name, s := range tb.Sets {
		switch {
		case strings.HasPrefix(name, "affinity-"):
			n[3]++
		case name == "cluster-ips":
			n[2] += len(s.Elements)
		}
	}
	for name, m := range tb.Maps {
		switch name {
		case "service-ips", "service-nodeports", "no-endpoint-services", "no-endpoint-nodeports", "firewall-ips":
			n[2] += len(m.Elements)
		}
	}
	return n
}

func TestIPVSCountsMatchRenderer(t *testing.T) {
	st := externalState()
	r, err := ipvs.NewRenderer(ipvs.Config{NodeConfig: nodeConfig(), NodeIPs: []netip.Addr{testNodeIP}})
	if err != nil {
		t.Fatal(err)
	}
	p := r.Render(st)
	in, local := costInputs(t, cluster.ModeIPVS, st)
	c := cost.CountOn(cluster.ModeIPVS, in, local, true)
	var want [4]int
	want[0] = len(p.Servers)
	for _, v := range p.Servers {
		want[1] += len(v.Dests)
	}
	for name, e := range p.Sets {
		if name != ipvs.SetIPVSIPs {
			want[2] += len(e)
		}
	}
	// The restore's lines less its headers, COMMITs and the 11 chains.
	want[3] = p.RestoreLines - 4 - 11
	got := [4]int{c.VirtualServers, c.RealServers, c.IPSetEntries, c.IPVSRules}
	if got != want {
		t.Errorf("virtual servers, real servers, ipset entries (but KUBE-IPVS-IPS), iptables rules: cost %v, renderer %v\n%v\n%s", got, want, p.Sets, p.Restore)
	}
}
