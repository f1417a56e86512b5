package proxy

import (
	"errors"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

func TestSkewFraction(t *testing.T) {
	if SkewMDE != scenario.DefaultMDE {
		t.Errorf("SkewMDE %v, scenario.DefaultMDE %v", SkewMDE, scenario.DefaultMDE)
	}
	if got := float64(skewNum)/skewDen - 1; math.Abs(got-SkewMDE) > 1e-15 {
		t.Errorf("%d/%d - 1 = %v, want SkewMDE %v", skewNum, skewDen, got, SkewMDE)
	}
}

// TestMDESkewWeights: the weights give the target shares exactly, sum to
// 10k(k-1), and the first share is (1+MDE) times 1/k.
func TestMDESkewWeights(t *testing.T) {
	if MDESkewWeights(0) != nil || MDESkewShares(0) != nil {
		t.Error("no endpoints: want nil")
	}
	if w, s := MDESkewWeights(1), MDESkewShares(1); !slices.Equal(w, []uint64{1}) || !slices.Equal(s, []float64{1}) {
		t.Errorf("one endpoint: weights %v shares %v", w, s)
	}
	for _, k := range []int{2, 3, 10, 20, 50, 200} {
		w, s := MDESkewWeights(k), MDESkewShares(k)
		var sum uint64
		for _, x := range w {
			sum += x
		}
		if sum != uint64(10*k*(k-1)) {
			t.Errorf("k=%d: weights sum %d, want %d", k, sum, 10*k*(k-1))
		}
		total := 0.0
		for i := range w {
			if got := float64(w[i]) / float64(sum); math.Abs(got-s[i]) > 1e-15 {
				t.Errorf("k=%d endpoint %d: weight share %v, target %v", k, i, got, s[i])
			}
			total += s[i]
		}
		if math.Abs(total-1) > 1e-12 {
			t.Errorf("k=%d: shares sum to %v", k, total)
		}
		if got := s[0] * float64(k); math.Abs(got-(1+SkewMDE)) > 1e-12 {
			t.Errorf("k=%d: first share is %v times 1/k, want %v", k, got, 1+SkewMDE)
		}
	}
	if w := MDESkewWeights(50); w[0] != 539 || w[1] != 489 {
		t.Errorf("k=50: weights %d, %d; want 539, 489", w[0], w[1])
	}
}

// TestClientBucket: the hash spreads a /16 of client addresses evenly over
// the buckets (a fixed input, so the counts are fixed too). The value of
// jhash_1word(0, 0) is pinned from this implementation, which
// TestClientBucketInKernel (dataplane/iptables) checks against the kernel.
func TestClientBucket(t *testing.T) {
	if got := jhash1Word(0, 0); got != 0x049396b8 {
		t.Errorf("jhash_1word(0, 0) = %#x, want 0x049396b8", got)
	}
	counts := make([]int, LeakBuckets)
	leak, stay := 0, 0
	base := netip.MustParseAddr("10.1.0.0").As4()
	for i := range 1 << 16 {
		a := base
		a[2], a[3] = byte(i>>8), byte(i)
		addr := netip.AddrFrom4(a)
		counts[ClientBucket(addr, LeakBuckets)]++
		if LeakingClient(addr) {
			leak++
		}
		if OverstayingClient(addr) {
			stay++
		}
	}
	for b, n := range counts {
		if f := float64(n) / (1 << 16); math.Abs(f-0.1) > 0.01 {
			t.Errorf("bucket %d holds %.4f of the addresses", b, f)
		}
	}
	if leak != counts[0] {
		t.Errorf("LeakingClient %d, bucket 0 %d", leak, counts[0])
	}
	if f := float64(stay) / (1 << 16); math.Abs(f-0.5) > 0.01 {
		t.Errorf("OverstayingClient holds %.4f of the addresses", f)
	}
	if ClientBucket(netip.MustParseAddr("::1"), 10) != 0 {
		t.Error("IPv6: want bucket 0")
	}
}

func TestFaultModes(t *testing.T) {
	for _, f := range AllFaults() {
		if len(f.Modes()) == 0 {
			t.Errorf("%s is built nowhere", f)
		}
	}
	if m := FaultAffinityLeak.Modes(); !slices.Equal(m, []cluster.Mode{cluster.ModeIPTables, cluster.ModeNFTables}) {
		t.Errorf("affinity-leak modes %v", m)
	}
	if FaultSkewAtMDE.NotBuilt(cluster.ModeIPVS) != "" || FaultAffinityOverstay.NotBuilt(cluster.ModeIPVS) == "" {
		t.Error("wrong IPVS metadata")
	}
	fs, _ := ParseFaults([]string{"affinity-leak"})
	err := fs.CheckModes(cluster.ModeIPVS)
	if !errors.Is(err, ErrFaultNotBuilt) || !strings.HasPrefix(err.Error(), "affinity-leak cannot be built in ipvs mode: ") {
		t.Errorf("error %v", err)
	}
	if err := fs.CheckModes(cluster.ModeNFTables); err != nil {
		t.Error(err)
	}
}
