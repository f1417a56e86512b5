package oracle

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/cluster"
)

func affinityFixture(mode cluster.Mode, timeout int32) (*cluster.ServicePort, []*cluster.Endpoint, *Affinity) {
	sp := svcPort(corev1.ServiceTypeClusterIP)
	sp.ClientIPAffinity, sp.AffinityTimeout = true, timeout
	eps := []*cluster.Endpoint{ep("10.0.1.1", "RS", otherNode), ep("10.0.1.2", "RS", otherNode), ep("10.0.1.3", "RS", otherNode)}
	return sp, eps, NewAffinity(mode, sp, Expect(mode, sp, eps, testHostname, ""))
}

func TestAffinityHoldsAndExpires(t *testing.T) {
	for _, mode := range []cluster.Mode{cluster.ModeIPTables, cluster.ModeNFTables} {
		_, _, a := affinityFixture(mode, 10)
		c := netip.MustParseAddr("10.0.0.2")
		if _, bound := a.Expect(c, 0); bound {
			t.Fatalf("%s: bound before any connection", mode)
		}
		if r := a.Observe(c, "10.0.1.2:80", time.Second, 2*time.Second); r != Consistent {
			t.Fatalf("%s: first connection: %v", mode, r)
		}
		if got, bound := a.Expect(c, 10*time.Second); !bound || got != "10.0.1.2:80" {
			t.Errorf("%s: inside the timeout: %q %v", mode, got, bound)
		}
		// A second connection refreshes the timeout.
		if r := a.Observe(c, "10.0.1.2:80", 9*time.Second, 9*time.Second); r != Consistent {
			t.Errorf("%s: second connection: %v", mode, r)
		}
		if _, bound := a.Expect(c, 18*time.Second); !bound {
			t.Errorf("%s: refreshed binding expired early", mode)
		}
		if _, bound := a.Expect(c, 19*time.Second); bound {
			t.Errorf("%s: bound after the timeout", mode)
		}
		if r := a.Observe(c, "10.0.1.3:80", 12*time.Second, 12*time.Second); r != Violation {
			t.Errorf("%s: another endpoint inside the timeout: %v", mode, r)
		}
		// After expiry any endpoint is fine and binds anew.
		if r := a.Observe(c, "10.0.1.1:80", 40*time.Second, 41*time.Second); r != Consistent {
			t.Errorf("%s: after expiry: %v", mode, r)
		}
		if got, _ := a.Expect(c, 41*time.Second); got != "10.0.1.1:80" {
			t.Errorf("%s: new binding: %q", mode, got)
		}
	}
}

func TestAffinityForgetsRemovedEndpoint(t *testing.T) {
	sp, eps, a := affinityFixture(cluster.ModeNFTables, 100)
	c := netip.MustParseAddr("10.0.0.2")
	a.Observe(c, "10.0.1.1:80", 0, time.Second)
	eps[0].Ready = false
	a.Update(Expect(cluster.ModeNFTables, sp, eps, testHostname, ""))
	if _, bound := a.Expect(c, time.Second); bound {
		t.Errorf("bound to a not-ready endpoint")
	}
	eps[0].Ready = true
	a.Update(Expect(cluster.ModeNFTables, sp, eps, testHostname, ""))
	if _, bound := a.Expect(c, 2*time.Second); bound {
		t.Errorf("binding came back with the endpoint")
	}
}

func TestAffinityIPVSMayOutlastTimeout(t *testing.T) {
	_, _, a := affinityFixture(cluster.ModeIPVS, 10)
	c := netip.MustParseAddr("10.0.0.2")
	a.Observe(c, "10.0.1.1:80", 0, 5*time.Second) // TCP: in the table until 125 s
	b, ok := a.Binding(c, 11*time.Second)
	if !ok {
		t.Fatal("no binding")
	}
	// The template's timer fires at 10 s and 70 s with the connection still
	// in the table, re-arms for 60 s each time, and finds it gone at 130 s;
	// the timer wheel's slack on top.
	if want := 130*time.Second + IPVSTimerSlack; b.Until != 10*time.Second || b.MayHoldUntil != want {
		t.Errorf("got until %v, may hold until %v; want 10s and %v", b.Until, b.MayHoldUntil, want)
	}
	if _, bound := a.Expect(c, 11*time.Second); bound {
		t.Errorf("must not be required after Until")
	}
	// Held by the template: reaching the same endpoint refreshes it.
	if r := a.Observe(c, "10.0.1.1:80", 60*time.Second, 60*time.Second); r != Consistent {
		t.Errorf("held: %v", r)
	}
	if got, bound := a.Expect(c, 65*time.Second); !bound || got != "10.0.1.1:80" {
		t.Errorf("refreshed: %q %v", got, bound)
	}
}

// TestIPVSTemplateHold: a template outlives its timeout by whole re-arms
// of 60 s while a connection it controls is in the table (including one
// leaving exactly when the timer fires), plus the timer's slack.
func TestIPVSTemplateHold(t *testing.T) {
	for _, tc := range []struct {
		timeout, busy, want time.Duration
	}{
		{30 * time.Second, 11 * time.Second, 30*time.Second + IPVSTimerSlack},
		{3 * time.Second, 11 * time.Second, 63*time.Second + IPVSTimerSlack},
		{11 * time.Second, 11 * time.Second, 71*time.Second + IPVSTimerSlack},
		{3 * time.Second, IPVSUDPTimeout + time.Second, 303*time.Second + IPVSTimerSlack},
	} {
		if got := IPVSTemplateHold(tc.timeout, tc.busy); got != tc.want {
			t.Errorf("timeout %v, busy %v: %v, want %v", tc.timeout, tc.busy, got, tc.want)
		}
	}
}

func TestAffinityRecentCapacity(t *testing.T) {
	sp, eps, _ := affinityFixture(cluster.ModeIPTables, 1000)
	o := Oracle{RecentCapacity: 3}
	a := o.NewAffinity(cluster.ModeIPTables, sp, o.Expect(cluster.ModeIPTables, sp, eps, testHostname, ""))
	var clients []netip.Addr
	for i := range 5 {
		c := netip.MustParseAddr(fmt.Sprintf("10.0.0.%d", 10+i))
		clients = append(clients, c)
		a.Observe(c, "10.0.1.1:80", time.Duration(i)*time.Second, time.Duration(i)*time.Second)
	}
	ov := a.Overflow(10 * time.Second)
	if ov["10.0.1.1:80"] != 5 || len(ov) != 1 {
		t.Errorf("overflow %v", ov)
	}
	for i, c := range clients {
		b, _ := a.Binding(c, 10*time.Second)
		if want := i < 2; b.AtRisk != want {
			t.Errorf("client %d: at risk %v, want %v", i, b.AtRisk, want)
		}
	}
	d := a.Deviations(10 * time.Second)
	if len(d) != 1 || !strings.Contains(d[0], "10.0.1.1:80 has 5 clients") {
		t.Errorf("deviations %q", d)
	}
	if r := a.Observe(clients[0], "10.0.1.2:80", 11*time.Second, 11*time.Second); r != KnownDeviation {
		t.Errorf("evicted client moved: %v, want a known deviation", r)
	}
	if r := a.Observe(clients[4], "10.0.1.3:80", 12*time.Second, 12*time.Second); r != Violation {
		t.Errorf("recent client moved: %v, want a violation", r)
	}
	if d := a.Deviations(12 * time.Second); len(d) != 0 {
		t.Errorf("deviations after the moves %q", d)
	}
}

func TestNoAffinityNeverBinds(t *testing.T) {
	sp := svcPort(corev1.ServiceTypeClusterIP)
	eps := []*cluster.Endpoint{ep("10.0.1.1", "RS", otherNode)}
	a := NewAffinity(cluster.ModeIPTables, sp, Expect(cluster.ModeIPTables, sp, eps, testHostname, ""))
	c := netip.MustParseAddr("10.0.0.2")
	a.Observe(c, "10.0.1.1:80", 0, 0)
	if _, bound := a.Expect(c, 0); bound {
		t.Error("bound without affinity")
	}
}

func TestExpectAcross(t *testing.T) {
	sp := &cluster.ServicePort{Name: cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "sticky"}, Port: "http", Protocol: corev1.ProtocolTCP},
		Type: corev1.ServiceTypeNodePort, ClusterIP: netip.MustParseAddr("10.96.0.122"), Port: 80, NodePort: 31122, ClientIPAffinity: true, AffinityTimeout: 10800}
	ep := func(ip, node string) *cluster.Endpoint {
		return &cluster.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true, NodeName: node}
	}
	eps := []*cluster.Endpoint{ep("10.244.0.40", "node-a"), ep("10.244.0.41", "node-a"), ep("10.244.1.40", "node-b")}
	client := netip.MustParseAddr("192.0.2.10")
	nodes := []string{"node-a", "node-b"}
	for _, c := range []struct {
		mode   cluster.Mode
		local  bool
		agree  float64
		random bool
	}{
		{cluster.ModeIPTables, false, 1.0 / 3, true},
		{cluster.ModeNFTables, false, 1.0 / 3, true},
		{cluster.ModeIPVS, false, 1.0 / 3, false},
		// Local: each node holds the client to one of its own.
		{cluster.ModeIPTables, true, 0, true},
	} {
		p := *sp
		p.ExternalLocal = c.local
		a := Oracle{}.ExpectAcross(c.mode, &p, eps, client, cluster.ViaNodePort, nodes, nil)
		if math.Abs(a.Agree-c.agree) > 1e-12 || a.Random != c.random || len(a.PerNode) != 2 {
			t.Errorf("%s local=%v: agree %g random %v (%d nodes), want %g %v", c.mode, c.local, a.Agree, a.Random, len(a.PerNode), c.agree, c.random)
		}
		if c.local && (a.PerNode["node-b"].Allows("10.244.0.40:8080") || !a.PerNode["node-b"].Allows("10.244.1.40:8080")) {
			t.Errorf("Local: node-b may use %v", a.PerNode["node-b"].Endpoints())
		}
		if !strings.Contains(a.Reason, "per node") {
			t.Errorf("reason %q does not say the state is per node", a.Reason)
		}
	}
}
