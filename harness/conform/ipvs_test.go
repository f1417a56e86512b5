package conform

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

func TestExpiryIdle(t *testing.T) {
	tcp := func(timeout int32) *cluster.ServicePort {
		return &cluster.ServicePort{Name: cluster.ServicePortName{Protocol: corev1.ProtocolTCP}, ClientIPAffinity: true, AffinityTimeout: timeout}
	}
	udp := tcp(3)
	udp.Name.Protocol = corev1.ProtocolUDP
	for _, tc := range []struct {
		mode    cluster.Mode
		sp      *cluster.ServicePort
		idle    time.Duration
		checked bool
	}{
		{"iptables", tcp(3), 4 * time.Second, true},
		{"iptables", tcp(60), 61 * time.Second, false},
		// The template's timer fires at 3 s while the probe's connection
		// (CLOSE, 10 s) still lives: re-armed for 60 s.
		{"ipvs", tcp(3), 63*time.Second + oracle.IPVSTimerSlack, true},
		{"ipvs", tcp(10), 70*time.Second + oracle.IPVSTimerSlack, true},
		// Longer timeouts are not checked in any mode.
		{"ipvs", tcp(60), 61 * time.Second, false},
		// UDP connections live 300 s: beyond the bound.
		{"ipvs", udp, 303*time.Second + oracle.IPVSTimerSlack, false},
	} {
		s := &suite{o: Options{Mode: tc.mode}}
		idle, checked := s.expiryIdle(tc.sp)
		if idle != tc.idle || checked != tc.checked {
			t.Errorf("%s %s timeout %d: idle %s checked %v, want %s %v", tc.mode, tc.sp.Name.Protocol, tc.sp.AffinityTimeout, idle, checked, tc.idle, tc.checked)
		}
	}
}

// TestBestShift: in ipvs mode the rr expiry round starts where the
// rotation's prediction moves every client away from its bound endpoint
// (the first round gave client j rot[j%k], the pointer sits n further),
// so that a surviving template is always seen.
func TestBestShift(t *testing.T) {
	rot := []string{"a", "b", "c", "d", "e"}
	for _, tc := range []struct{ n, k int }{{60, 3}, {61, 3}, {300, 3}, {10, 2}, {11, 2}, {4, 2}, {5, 2}, {12, 5}} {
		a := &affinityCheck{sched: tc.n}
		before := map[netip.Addr]string{}
		for j := 0; j < tc.n; j++ {
			ip := netip.AddrFrom4([4]byte{10, 0, byte(j >> 8), byte(j)})
			a.bound = append(a.bound, affinityAddr{0, ip})
			before[ip] = rot[j%tc.k]
		}
		sh := a.bestShift(rot[:tc.k], before)
		moved := 0
		for j := 0; j < tc.n; j++ {
			if rot[(a.sched+j)%tc.k] != before[a.bound[(j+sh)%tc.n].ip] {
				moved++
			}
		}
		if moved != tc.n {
			t.Errorf("n %d k %d: shift %d moves %d clients, want all", tc.n, tc.k, sh, moved)
		}
	}
}

func TestIPVSExtraUnits(t *testing.T) {
	sc := &scenario.Scenario{
		Cluster: scenario.Cluster{Nodes: []scenario.NodeSpec{{Name: "a"}, {Name: "b"}}},
		Traffic: &scenario.Traffic{Clients: []scenario.Client{{Name: "c", Nodes: []string{"a", "b"}}}},
		Checks:  []scenario.Check{{Type: scenario.CheckDistribution}, {Type: scenario.CheckAffinity}},
	}
	nodes := func(c *scenario.Check) []string { return clientNodes(sc, c, []string{"a", "b"}, nil) }
	for sched, want := range map[string]int{"rr": 2, "wrr": 2, "mh": 2, "sh": 0, "dh": 0, "lc": 0, "wlc": 0} {
		sc.Proxy.IPVSScheduler = sched
		if got := ipvsExtraUnits("ipvs", sc, nodes); got != want {
			t.Errorf("%s: %d extra verdicts, want %d", sched, got, want)
		}
	}
	if ipvsExtraUnits("iptables", sc, nodes) != 0 {
		t.Error("iptables mode has extra verdicts")
	}
}
