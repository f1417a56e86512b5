package conntrack

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

func spn(name string, proto corev1.Protocol) cluster.ServicePortName {
	return cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: name}, Port: "p", Protocol: proto}
}

func ep(ip string, ready, serving bool) *cluster.Endpoint {
	return &cluster.Endpoint{IP: netip.MustParseAddr(ip), Port: 53, Ready: ready, Serving: serving, Terminating: !ready && serving, NodeName: "node-a"}
}

// fixture: dns (UDP, cluster IP, external IP, load-balancer IP, node port)
// with a ready, a serving-terminating and a not-serving endpoint; empty
// (UDP, node port, no endpoints); web (TCP) with one endpoint; and the TCP
// port of a Service that also has a UDP port.
func fixture() *cluster.State {
	st := &cluster.State{Services: map[cluster.ServicePortName]*cluster.ServicePort{}, Endpoints: map[cluster.ServicePortName][]*cluster.Endpoint{}}
	add := func(p *cluster.ServicePort, eps ...*cluster.Endpoint) {
		st.Services[p.Name] = p
		st.Endpoints[p.Name] = eps
	}
	add(&cluster.ServicePort{Name: spn("dns", corev1.ProtocolUDP), ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 53, NodePort: 30053,
		ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.53")}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.51.100.53")}},
		ep("10.244.0.1", true, true), ep("10.244.0.2", false, true), ep("10.244.0.3", false, false))
	add(&cluster.ServicePort{Name: spn("empty", corev1.ProtocolUDP), ClusterIP: netip.MustParseAddr("10.96.0.11"), Port: 53, NodePort: 30054})
	add(&cluster.ServicePort{Name: spn("web", corev1.ProtocolTCP), ClusterIP: netip.MustParseAddr("10.96.0.12"), Port: 80}, ep("10.244.0.4", true, true))
	return st
}

// flow is a NATed entry: client -> dst, answered by reply.
func flow(proto uint8, client, dst, reply string) *netlink.ConntrackFlow {
	c, d, r := netip.MustParseAddrPort(client), netip.MustParseAddrPort(dst), netip.MustParseAddrPort(reply)
	return &netlink.ConntrackFlow{FamilyType: unix.AF_INET,
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: net.IP(c.Addr().AsSlice()), SrcPort: c.Port(), DstIP: net.IP(d.Addr().AsSlice()), DstPort: d.Port()},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: net.IP(r.Addr().AsSlice()), SrcPort: r.Port(), DstIP: net.IP(c.Addr().AsSlice()), DstPort: c.Port()}}
}

func TestStale(t *testing.T) {
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	cases := []struct {
		name  string
		f     *netlink.ConntrackFlow
		stale bool
	}{
		{"to a ready endpoint", flow(udp, "10.244.1.9:4000", "10.96.0.10:53", "10.244.0.1:53"), false},
		{"to a serving terminating endpoint", flow(udp, "10.244.1.9:4001", "10.96.0.10:53", "10.244.0.2:53"), false},
		{"to a not serving endpoint", flow(udp, "10.244.1.9:4002", "10.96.0.10:53", "10.244.0.3:53"), true},
		{"to a deleted endpoint", flow(udp, "10.244.1.9:4003", "10.96.0.10:53", "10.244.0.9:53"), true},
		{"to the right address, another port", flow(udp, "10.244.1.9:4004", "10.96.0.10:53", "10.244.0.1:5353"), true},
		{"not NATed (no endpoint when it began)", flow(udp, "10.244.1.9:4005", "10.96.0.10:53", "10.96.0.10:53"), true},
		{"external IP to a deleted endpoint", flow(udp, "203.0.113.9:4006", "192.0.2.53:53", "10.244.0.9:53"), true},
		{"load-balancer IP to a ready endpoint", flow(udp, "203.0.113.9:4007", "198.51.100.53:53", "10.244.0.1:53"), false},
		{"load-balancer IP to a deleted endpoint", flow(udp, "203.0.113.9:4008", "198.51.100.53:53", "10.244.0.9:53"), true},
		{"node port to a deleted endpoint", flow(udp, "203.0.113.9:4009", "172.18.0.2:30053", "10.244.0.9:53"), true},
		{"node port to a ready endpoint", flow(udp, "203.0.113.9:4010", "172.18.0.2:30053", "10.244.0.1:53"), false},
		{"a Service without endpoints: its cluster IP", flow(udp, "10.244.1.9:4011", "10.96.0.11:53", "10.96.0.11:53"), true},
		{"a Service without endpoints: its node port is left", flow(udp, "203.0.113.9:4012", "172.18.0.2:30054", "172.18.0.2:30054"), false},
		{"TCP to a deleted endpoint is left", flow(tcp, "10.244.1.9:4013", "10.96.0.12:80", "10.244.0.9:80"), false},
		{"UDP to the TCP port's cluster IP", flow(udp, "10.244.1.9:4014", "10.96.0.12:80", "10.244.0.9:80"), false},
		{"UDP to nobody's address", flow(udp, "10.244.1.9:4015", "10.1.2.3:53", "10.1.2.3:53"), false},
	}
	var all []*netlink.ConntrackFlow
	for _, c := range cases {
		all = append(all, c.f)
	}
	got := Stale(all, fixture())
	for _, c := range cases {
		if slices.Contains(got, c.f) != c.stale {
			t.Errorf("%s: stale %v, want %v (%s)", c.name, !c.stale, c.stale, c.f)
		}
	}
}

func TestRequired(t *testing.T) {
	st := fixture()
	st.Services[spn("web", corev1.ProtocolUDP)] = &cluster.ServicePort{Name: spn("web", corev1.ProtocolUDP), ClusterIP: netip.MustParseAddr("10.96.0.12"), Port: 80}
	for _, c := range []struct {
		name string
		ch   cluster.Changes
		want bool
	}{
		{"nothing", cluster.Changes{}, false},
		{"a UDP port's endpoints", cluster.Changes{Endpoints: []cluster.ServicePortName{spn("dns", corev1.ProtocolUDP)}}, true},
		{"the TCP port of a Service with a UDP port", cluster.Changes{Endpoints: []cluster.ServicePortName{spn("web", corev1.ProtocolTCP)}}, true},
		{"a UDP Service's settings only", cluster.Changes{Services: []cluster.ServicePortName{spn("dns", corev1.ProtocolUDP)}}, false},
		{"a TCP-only Service's endpoints", cluster.Changes{Endpoints: []cluster.ServicePortName{spn("other", corev1.ProtocolTCP)}}, false},
		{"a deleted UDP port's endpoints", cluster.Changes{Endpoints: []cluster.ServicePortName{spn("gone", corev1.ProtocolUDP)}}, true},
	} {
		if got := Required(c.ch, st); got != c.want {
			t.Errorf("%s: Required %v, want %v", c.name, got, c.want)
		}
	}
}

// fakeTable is a Table in memory.
type fakeTable struct {
	flows   []*netlink.ConntrackFlow
	listErr error
}

func (f *fakeTable) List() ([]*netlink.ConntrackFlow, error) { return slices.Clone(f.flows), f.listErr }

func (f *fakeTable) Delete(del []*netlink.ConntrackFlow) (int, error) {
	m := newFilter(del)
	n := len(f.flows)
	f.flows = slices.DeleteFunc(f.flows, m.MatchConntrackFlow)
	return n - len(f.flows), nil
}

func TestClean(t *testing.T) {
	udp := uint8(unix.IPPROTO_UDP)
	keep := flow(udp, "10.244.1.9:4000", "10.96.0.10:53", "10.244.0.1:53")
	gone := flow(udp, "10.244.1.9:4003", "10.96.0.10:53", "10.244.0.9:53")
	tab := &fakeTable{flows: []*netlink.ConntrackFlow{keep, gone}}
	n, err := Clean(tab, fixture())
	if err != nil || n != 1 || len(tab.flows) != 1 || tab.flows[0] != keep {
		t.Fatalf("Clean: %d deleted, %v; left %v", n, err, tab.flows)
	}
	// An interrupted dump cleans what it read.
	tab = &fakeTable{flows: []*netlink.ConntrackFlow{keep, gone}, listErr: netlink.ErrDumpInterrupted}
	if n, err := Clean(tab, fixture()); err != nil || n != 1 {
		t.Errorf("interrupted dump: %d deleted, %v", n, err)
	}
}

func TestCleanerFaults(t *testing.T) {
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	keep := flow(udp, "10.244.1.9:4000", "10.96.0.10:53", "10.244.0.1:53")
	gone := flow(udp, "10.244.1.9:4003", "10.96.0.10:53", "10.244.0.9:53")
	est := flow(tcp, "10.244.1.9:4004", "10.96.0.11:80", "10.244.0.1:80")
	udpChange := cluster.Changes{Endpoints: []cluster.ServicePortName{spn("dns", corev1.ProtocolUDP)}}
	tcpChange := cluster.Changes{Endpoints: []cluster.ServicePortName{spn("other", corev1.ProtocolTCP)}}
	for _, c := range []struct {
		name     string
		faults   proxy.Faults
		ch       cluster.Changes
		required bool
		left     int
	}{
		{"correct", nil, udpChange, true, 2},
		{"correct, TCP-only change", nil, tcpChange, false, 3},
		{"no cleanup", proxy.Faults{proxy.FaultNoConntrackCleanup: true}, udpChange, false, 3},
		{"flush all", proxy.Faults{proxy.FaultConntrackFlushAll: true}, tcpChange, true, 0},
		{"flush all, nothing changed", proxy.Faults{proxy.FaultConntrackFlushAll: true}, cluster.Changes{}, false, 3},
	} {
		tab := &fakeTable{flows: []*netlink.ConntrackFlow{keep, gone, est}}
		cl := Cleaner{Table: tab, Faults: c.faults}
		st := fixture()
		req := cl.Required(c.ch, st)
		if req != c.required {
			t.Errorf("%s: Required %v, want %v", c.name, req, c.required)
		}
		if req {
			if _, err := cl.Clean(st); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		if len(tab.flows) != c.left {
			t.Errorf("%s: %d entries left, want %d", c.name, len(tab.flows), c.left)
		}
	}
}
