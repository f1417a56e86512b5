package differential

// Regime is one environment of the random comparison and the batches run
// in it. iptables mode's output depends on the history of kube-proxy's
// large-cluster mode (more than LargeClusterThreshold endpoints in total):
// a chain keeps the comments it was written with until it is rewritten,
// kube-proxy does no periodic full sync while large
// (pkg/proxy/iptables/proxier.go, syncProxyRules: doFullSync), and it
// deletes stale chains at most once per --iptables-sync-period while large.
// Since kube-proxy syncs per event and ours once per step, the two would
// cross the threshold at different moments; each regime keeps every sync
// of both sides on one side of it.
type Regime struct {
	// Name is "small" or "large".
	Name string
	// Ballast is Config.Ballast: 0 in the small regime; in the large one
	// more than LargeClusterThreshold endpoints, present before either
	// proxy's first sync.
	Ballast int
	// Batches are run in order, each cleaned up before the next (RunBatch).
	Batches [][]*Scenario
}

// Scenarios is the number of scenarios of r's batches.
func (r Regime) Scenarios() int {
	n := 0
	for _, b := range r.Batches {
		n += len(b)
	}
	return n
}

// Limits of PlanRandom.
const (
	// smallScenarioPeak is the largest Scenario.Peak the small regime
	// takes: above it a scenario leaves too little room for others.
	smallScenarioPeak = 250
	// maxBatch bounds a batch's scenarios (each step writes all of theirs).
	maxBatch = 100
	// LargeBallast is the large regime's ballast: over the threshold with
	// the apiserver's own endpoint left out.
	LargeBallast = LargeClusterThreshold + 2
)

// PlanRandom draws n scenarios (seeds first to first+n-1) and splits them
// into two regimes, in seed order:
//   - small: the scenarios with Peak at most smallScenarioPeak, except every
//     third seed, packed into batches whose summed Peak plus the
//     apiserver's kubernetes endpoint stays at or under
//     LargeClusterThreshold: no intermediate state of a batch is large;
//   - large: the others, in batches of up to maxBatch, run beside a
//     LargeBallast-endpoint ballast Service: every state is large.
//
// Every batch's seeds are distinct modulo MaxSeeds.
func PlanRandom(first uint64, n int, gc GenConfig) []Regime {
	small := Regime{Name: "small"}
	large := Regime{Name: "large", Ballast: LargeBallast}
	var sb, lb batchBuilder
	sb.budget = LargeClusterThreshold - 1
	for seed := first; seed < first+uint64(n); seed++ {
		sc := Generate(seed, gc)
		if sc.Peak() <= smallScenarioPeak && seed%3 != 0 {
			sb.add(&small, sc)
		} else {
			lb.add(&large, sc)
		}
	}
	sb.flush(&small)
	lb.flush(&large)
	return []Regime{small, large}
}

// batchBuilder packs scenarios into batches: a new batch when the current
// one is full (maxBatch), over its endpoint budget (0: none), or holds a
// seed equal modulo MaxSeeds.
type batchBuilder struct {
	budget int
	cur    []*Scenario
	peak   int
	mods   map[uint64]bool
}

func (b *batchBuilder) add(r *Regime, sc *Scenario) {
	p := sc.Peak()
	if len(b.cur) == maxBatch || b.budget > 0 && b.peak+p > b.budget || b.mods[sc.Seed%MaxSeeds] {
		b.flush(r)
	}
	if b.mods == nil {
		b.mods = map[uint64]bool{}
	}
	b.cur = append(b.cur, sc)
	b.peak += p
	b.mods[sc.Seed%MaxSeeds] = true
}

func (b *batchBuilder) flush(r *Regime) {
	if len(b.cur) > 0 {
		r.Batches = append(r.Batches, b.cur)
	}
	b.cur, b.peak, b.mods = nil, 0, nil
}

// RandomScenarios is the number of random scenarios the differential test
// runs per mode, over both regimes.
const RandomScenarios = 500
