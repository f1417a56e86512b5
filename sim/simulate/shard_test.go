package simulate

import "testing"

// TestPlanShardsRanges: a node's shards are increasing ranges of the
// service ports it sends to, at most shardPorts each, numbered locally in
// order; a port it sends nothing to is in no shard.
func TestPlanShardsRanges(t *testing.T) {
	const n = 3000
	w := &world{svcs: make([]svcInfo, n)}
	var targets []int32
	var weights []float64
	for s := range n {
		if s%3 != 0 {
			targets = append(targets, int32(s))
			weights = append(weights, 1+float64(s%7)) // unequal shares
		}
	}
	w.tr.groups = []groupPlan{{targets: targets, weights: weights}}
	w.tr.perNode = []nodePlan{{conns: 1000, groups: []nodeGroup{{group: 0, weight: 1}}}}
	p := w.planShards(0)
	if want := (len(targets) + shardPorts - 1) / shardPorts; p.n != want {
		t.Fatalf("%d shards, want %d (the port bound)", p.n, want)
	}
	last := int32(-1)
	in := 0
	for k, ms := range p.members {
		if len(ms) == 0 || len(ms) > shardPorts {
			t.Errorf("shard %d has %d service ports, want 1 to %d", k, len(ms), shardPorts)
		}
		for i, s := range ms {
			if s <= last {
				t.Fatalf("shard %d: port %d after %d: not increasing ranges", k, s, last)
			}
			last = s
			if p.of[s] != int32(k) || p.local[s] != int32(i) {
				t.Errorf("port %d: shard %d local %d, want %d and %d", s, p.of[s], p.local[s], k, i)
			}
		}
		in += len(ms)
	}
	if in != len(targets) {
		t.Errorf("%d ports in shards, want the %d targeted", in, len(targets))
	}
	for s := 0; s < n; s += 3 {
		if p.of[s] != -1 {
			t.Fatalf("port %d gets no traffic but is in shard %d", s, p.of[s])
		}
	}
}
