package conntrack

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
)

// TestNamespaceTable creates UDP and TCP entries in a node namespace's own
// table through netlink, cleans it for the fixture and reads it back: the
// stale UDP entries are gone, the others kept, and the host's table never
// held any of them.
func TestNamespaceTable(t *testing.T) {
	testenv.RequireRoot(t)
	id, err := netns.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	topo, err := netns.Build(context.Background(), &netns.Config{RunID: id, Nodes: []netns.NodeConfig{{Name: "node-a",
		Addr: netip.MustParsePrefix("172.18.0.2/16"), PodCIDR: netip.MustParsePrefix("10.244.0.0/24"), Gateway: netip.MustParseAddr("10.244.0.1")}}})
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	tab, err := NewNamespaceTable(topo.Nodes()[0].NS)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	keep := flow(udp, "10.244.1.9:4000", "10.96.0.10:53", "10.244.0.1:53")
	stale := []*netlink.ConntrackFlow{
		flow(udp, "10.244.1.9:4003", "10.96.0.10:53", "10.244.0.9:53"),
		flow(udp, "10.244.1.9:4005", "10.96.0.10:53", "10.96.0.10:53"),
		flow(udp, "203.0.113.9:4009", "172.18.0.2:30053", "10.244.0.9:53"),
	}
	tcpFlow := flow(tcp, "10.244.1.9:4013", "10.96.0.12:80", "10.244.0.9:80")
	tcpFlow.ProtoInfo = &netlink.ProtoInfoTCP{State: 3} // ESTABLISHED
	for _, f := range append([]*netlink.ConntrackFlow{keep, tcpFlow}, stale...) {
		f.TimeOut = 300
		if err := tab.h.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
			t.Fatalf("could not create %s: %v", f, err)
		}
	}
	before, err := tab.List()
	if err != nil || len(before) != 5 {
		t.Fatalf("listed %d entries (%v), want 5", len(before), err)
	}
	n, err := Clean(tab, fixture())
	if err != nil || n != len(stale) {
		t.Fatalf("Clean deleted %d (%v), want %d", n, err, len(stale))
	}
	after, err := tab.List()
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, f := range after {
		left[flowKey(f)] = true
	}
	if len(after) != 2 || !left[flowKey(keep)] || !left[flowKey(tcpFlow)] {
		t.Errorf("left %v, want the served UDP flow and the TCP flow", after)
	}
	host, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range host {
		if d, _ := netip.AddrFromSlice(f.Forward.DstIP); d.Unmap() == netip.MustParseAddr("10.96.0.10") && f.Forward.SrcPort >= 4000 && f.Forward.SrcPort <= 4013 {
			t.Errorf("the host's table holds %s", f)
		}
	}
}
