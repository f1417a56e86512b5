package conform

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

func TestExpiryIdle(t *testing.T) {
	tcp := func(timeout int32) *cluster.ServicePort {
		return &cluster.ServicePort{Name: cluster.ServicePortName{Protocol: corev1.ProtocolTCP}, ClientIPAffinity: true, AffinityTimeout: timeout}
	}
	udp := tcp(3)
	udp.Name.Protocol = corev1.ProtocolUDP
	for _, tc := range []struct {
		mode    string
		sp      *cluster.ServicePort
		idle    time.Duration
		checked bool
	}{
		{"iptables", tcp(3), 4 * time.Second, true},
		{"iptables", tcp(60), 61 * time.Second, false},
		// The template's timer fires at 3 s while the probe's connection
		// (CLOSE, 10 s) still lives: re-armed for 60 s.
		{"ipvs", tcp(3), 63*time.Second + expiryMargin, true},
		{"ipvs", tcp(10), 70*time.Second + expiryMargin, true},
		// Longer timeouts are not checked in any mode.
		{"ipvs", tcp(60), 61 * time.Second, false},
		// UDP connections live 300 s: beyond the bound.
		{"ipvs", udp, 303*time.Second + expiryMargin, false},
	} {
		s := &suite{o: Options{Mode: tc.mode}}
		idle, checked := s.expiryIdle(tc.sp)
		if idle != tc.idle || checked != tc.checked {
			t.Errorf("%s %s timeout %d: idle %s checked %v, want %s %v", tc.mode, tc.sp.Name.Protocol, tc.sp.AffinityTimeout, idle, checked, tc.idle, tc.checked)
		}
	}
}

// TestExpiryShift: in ipvs mode the expiry round starts s clients later,
// with (n-s) not a multiple of k, so that rr's fresh choices all differ
// from the first round's.
func TestExpiryShift(t *testing.T) {
	for _, tc := range []struct{ n, k, want int }{{60, 3, 1}, {61, 3, 2}, {300, 3, 1}, {10, 2, 1}, {11, 2, 2}, {2, 3, 0}} {
		s := &suite{o: Options{Mode: "ipvs"}}
		got := s.expiryShift(tc.n, tc.k)
		if got != tc.want {
			t.Errorf("n %d k %d: shift %d, want %d", tc.n, tc.k, got, tc.want)
		}
		// Simulate rr: the first round gives client j endpoint (p0+j)%k;
		// the pointer then sits n further; the expiry round in shifted
		// order gives rank r=(j-s) mod n endpoint (p0+n+r)%k.
		if got == 0 {
			continue
		}
		same := 0
		for j := 0; j < tc.n; j++ {
			r := (j - got + tc.n) % tc.n
			if (j)%tc.k == (tc.n+r)%tc.k {
				same++
			}
		}
		if same > got {
			t.Errorf("n %d k %d shift %d: %d clients would keep their endpoint", tc.n, tc.k, got, same)
		}
	}
	if (&suite{o: Options{Mode: "iptables"}}).expiryShift(60, 3) != 0 {
		t.Error("iptables mode shifted")
	}
}

func TestIPVSExtraUnits(t *testing.T) {
	sc := &scenario.Scenario{
		Cluster: scenario.Cluster{Nodes: []scenario.NodeSpec{{Name: "a"}, {Name: "b"}}},
		Traffic: &scenario.Traffic{Clients: []scenario.Client{{Name: "c", Nodes: []string{"a", "b"}}}},
		Checks:  []scenario.Check{{Type: scenario.CheckDistribution}, {Type: scenario.CheckAffinity}},
	}
	for sched, want := range map[string]int{"rr": 2, "wrr": 2, "mh": 2, "sh": 0, "dh": 0, "lc": 0, "wlc": 0} {
		sc.Proxy.IPVSScheduler = sched
		if got := ipvsExtraUnits("ipvs", sc); got != want {
			t.Errorf("%s: %d extra verdicts, want %d", sched, got, want)
		}
	}
	if ipvsExtraUnits("iptables", sc) != 0 {
		t.Error("iptables mode has extra verdicts")
	}
}
