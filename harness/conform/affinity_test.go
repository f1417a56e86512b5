package conform

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Toy dataplane faults of fakeMachine, after the named dataplane faults.
const (
	fakeCorrect      = "correct"
	fakeLeak         = "affinity-leak"            // a tenth of the clients never bind
	fakeOverstay     = "affinity-overstay"        // half the clients' bindings last 2T
	fakeUniformProb  = "uniform-probability"      // shares 1/3, 2/9, 4/9
	fakeSkewAtMDE    = "skew-at-first-choice-mde" // shares 1/2, 1/4, 1/4: the first-choice MDE
	fakeTemplates    = "surviving-templates"      // 60 % of ipvs templates outlive their timeout
	fakeProbeSpacing = 100 * time.Microsecond
)

// fakeMachine is a machine with a virtual clock and a toy dataplane for one
// service port with ClientIP affinity, with iptables semantics: a new
// connection of a client seen less than the timeout ago (last-seen
// refresh) reaches its endpoint, any other draws an endpoint at random
// from the shares and binds the client. Which clients a fault touches is
// drawn per address with the machine's generator (a seeded address hash).
type fakeMachine struct {
	cl      []*netns.Client
	eps     []netip.AddrPort
	shares  []float64
	timeout time.Duration
	fault   string
	rng     *rand.Rand
	clock   time.Duration
	binds   map[netip.Addr]*fakeBinding
	touched map[netip.Addr]bool
	counts  Counts
	// rr makes a fresh choice the next endpoint of a rotation (ipvs rr)
	// instead of a random draw.
	rr  bool
	ptr int
}

type fakeBinding struct {
	ep   netip.AddrPort
	last time.Duration
}

var _ machine = (*fakeMachine)(nil)

func (f *fakeMachine) clients() []*netns.Client { return f.cl }
func (f *fakeMachine) phase() {
	f.counts = Counts{Arrivals: map[Key]int{}, Rejects: map[netip.Addr]int{}}
}
func (f *fakeMachine) flush()                                        {}
func (f *fakeMachine) counters(string) []dataplane.Counter           { return nil }
func (f *fakeMachine) now() time.Duration                            { return f.clock }
func (f *fakeMachine) quiesce()                                      {}
func (f *fakeMachine) idle(_ context.Context, d time.Duration) error { f.clock += d; return nil }
func (f *fakeMachine) apply(context.Context, apiserver.Step) (map[string]time.Duration, error) {
	return nil, errors.New("the fake machine has no timeline")
}

func (f *fakeMachine) collect(int) Counts {
	c := Counts{Arrivals: map[Key]int{}, Rejects: map[netip.Addr]int{}, Seen: f.counts.Seen}
	for k, v := range f.counts.Arrivals {
		c.Arrivals[k] = v
	}
	return c
}

func (f *fakeMachine) send(_ context.Context, b Probe, _ *rand.Rand) (int, error) {
	for range b.N {
		ep := f.choose(b.Src)
		f.counts.Arrivals[Key{Endpoint: ep, Client: b.Src}]++
		f.counts.Seen++
		f.clock += fakeProbeSpacing
	}
	return b.N, nil
}

// touchedBy says whether the fault applies to client a (drawn once per
// address with probability frac).
func (f *fakeMachine) touchedBy(a netip.Addr, frac float64) bool {
	t, ok := f.touched[a]
	if !ok {
		t = f.rng.Float64() < frac
		f.touched[a] = t
	}
	return t
}

func (f *fakeMachine) choose(src netip.Addr) netip.AddrPort {
	life := f.timeout
	switch {
	case f.fault == fakeLeak && f.touchedBy(src, affinityLeakFraction):
		return f.draw()
	case f.fault == fakeOverstay && f.touchedBy(src, 0.5):
		life = 2 * f.timeout
	case f.fault == fakeTemplates && f.touchedBy(src, 0.6):
		life = time.Hour
	}
	if b := f.binds[src]; b != nil && f.clock-b.last < life {
		b.last = f.clock
		return b.ep
	}
	ep := f.draw()
	f.binds[src] = &fakeBinding{ep: ep, last: f.clock}
	return ep
}

func (f *fakeMachine) draw() netip.AddrPort {
	if f.rr {
		f.ptr++
		return f.eps[(f.ptr-1)%len(f.eps)]
	}
	u := f.rng.Float64()
	for i, p := range f.shares {
		if u < p {
			return f.eps[i]
		}
		u -= p
	}
	return f.eps[len(f.eps)-1]
}

// offlineSuite is a suite around a scenario without namespaces: the
// model, the oracle and the clients' addresses as netns would place them,
// for a machine that is not the kernel.
func offlineSuite(t *testing.T, file string, mode cluster.Mode) (*suite, []*netns.Client) {
	t.Helper()
	l, err := scenario.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m, err := apiserver.OpenLoaded(context.Background(), l, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	id, err := netns.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := topology.FromModel(m, id)
	if err != nil {
		t.Fatal(err)
	}
	var clients []*netns.Client
	for _, n := range cfg.Nodes {
		for _, cc := range n.Clients {
			clients = append(clients, &netns.Client{Config: cc, Node: n.Name})
		}
	}
	s := &suite{o: Options{Mode: mode}, l: l, m: m, seed: m.Expanded.Seed}
	s.or.IPVSScheduler = l.Scenario.Proxy.IPVSScheduler
	return s, clients
}

// affinityCalibration runs the real affinity check of scenarios/
// conformance/affinity.yaml through fakeMachine, runs times per dataplane
// variant, and returns the verdicts of each run.
func affinityCalibration(t *testing.T, mode cluster.Mode, variant string, runs int, alpha float64) [][]*report.Check {
	s, clients := offlineSuite(t, conformanceDir+"/affinity.yaml", mode)
	c := &s.l.Scenario.Checks[0]
	spn, sp, err := s.spn(c)
	if err != nil {
		t.Fatal(err)
	}
	var eps []netip.AddrPort
	for _, e := range oracle.Expect(cluster.ModeIPTables, sp, s.state().Endpoints[spn], "node-a", "").Endpoints() {
		eps = append(eps, netip.MustParseAddrPort(e))
	}
	shares := stats.Uniform(len(eps))
	if variant == fakeUniformProb {
		shares = []float64{1.0 / 3, 2.0 / 9, 4.0 / 9}
	}
	if variant == fakeSkewAtMDE {
		shares = oneOff(shares, affinityFirstChoiceMDE)
	}
	var out [][]*report.Check
	for i := range runs {
		f := &fakeMachine{cl: clients, eps: eps, shares: shares, timeout: time.Duration(sp.AffinityTimeout) * time.Second, fault: variant,
			rng: rand.New(rand.NewPCG(uint64(i), 0xaff1)), binds: map[netip.Addr]*fakeBinding{}, touched: map[netip.Addr]bool{},
			rr: mode == cluster.ModeIPVS, ptr: i}
		f.phase()
		s.mc, s.rng, s.alphaUnit = f, rand.New(rand.NewPCG(uint64(i), 0x5eed)), alpha
		s.out = &report.Suite{Scenario: "affinity", Figures: map[string]any{}}
		s.affinity(context.Background(), c, "node-a")
		if len(s.out.Checks) != 3 {
			t.Fatalf("%d verdicts, want 3", len(s.out.Checks))
		}
		for _, rc := range s.out.Checks {
			if rc.Verdict == report.Error {
				t.Fatalf("run %d: %s: error: %s", i, rc.Name, rc.Message)
			}
		}
		out = append(out, s.out.Checks)
	}
	return out
}

// TestAffinityCalibration runs the affinity check on a toy dataplane,
// correct and with each affinity fault at its detection limit, and holds
// each verdict's rejection rate (P <= alpha) against what the sizing
// claims: near alpha on the correct dataplane, the computed power under
// the fault it is sized for (Clopper-Pearson 99 % interval over the runs).
func TestAffinityCalibration(t *testing.T) {
	testenv.SkipIfShort(t, "runs the affinity check 1,000 times on a toy dataplane")
	const runs = 200
	alpha := stats.DefaultFamilyAlpha / 33 // the conformance suite's unit alpha in iptables mode
	verdicts := []string{"first choice", "stickiness", "expiry"}
	for _, variant := range []string{fakeCorrect, fakeLeak, fakeOverstay, fakeUniformProb, fakeSkewAtMDE} {
		t.Run(variant, func(t *testing.T) {
			res := affinityCalibration(t, cluster.ModeIPTables, variant, runs, alpha)
			for vi, name := range verdicts {
				rejected, power := 0, 0.0
				for _, run := range res {
					rc := run[vi]
					if rc.P <= alpha {
						rejected++
					}
					power += expectedRejection(variant, name, rc, alpha) / runs
				}
				lo, hi := stats.ClopperPearson(rejected, runs, 0.99)
				t.Logf("%s / %s: rejected %d of %d (CP99 %.4f-%.4f), expected rate %.4f; last: n %d, achieved power %.4g, %s",
					variant, name, rejected, runs, lo, hi, power, res[runs-1][vi].N, res[runs-1][vi].AchievedPower, res[runs-1][vi].Message)
				if power < lo || power > hi {
					t.Errorf("%s / %s: rejection rate %d/%d (CP99 %.4f-%.4f) is not consistent with the expected %.4f", variant, name, rejected, runs, lo, hi, power)
				}
			}
		})
	}
}

// expectedRejection is the probability that verdict rc rejects under the
// variant: alpha (or 0 for a deterministic verdict) where the variant is
// correct for it, its computed power under the fault it is sized for.
func expectedRejection(variant, verdict string, rc *report.Check, alpha float64) float64 {
	k := 3
	switch {
	case variant == fakeLeak && verdict == "stickiness":
		// The power formula at the check's own clients and rounds.
		return rc.AchievedPower
	case variant == fakeOverstay && verdict == "expiry":
		return stats.BinomialPower(rc.N, float64(k-1)/float64(k), float64(k-1)/float64(2*k), alpha, stats.Less)
	case variant == fakeUniformProb && verdict == "first choice":
		p0 := stats.Uniform(k)
		w2 := stats.EffectW2(p0, []float64{1.0 / 3, 2.0 / 9, 4.0 / 9})
		return stats.ChiSquarePower(rc.N, w2, k-1, alpha)
	case variant == fakeSkewAtMDE && verdict == "first choice":
		// The alternative the verdict is sized for: its achieved power.
		return rc.AchievedPower
	case rc.Test == kindDetermin:
		return 0
	}
	return alpha
}

// TestAffinityPlan pins the verdicts each mode and scheduler runs.
func TestAffinityPlan(t *testing.T) {
	short := &cluster.ServicePort{ClientIPAffinity: true, AffinityTimeout: 3}
	long := &cluster.ServicePort{ClientIPAffinity: true, AffinityTimeout: 60}
	for _, tc := range []struct {
		mode        cluster.Mode
		sched       string
		sp          *cluster.ServicePort
		eligible    int
		run, notRun int
		expiry      string
	}{
		{"iptables", "", short, 3, 3, 0, kindBinomial},
		{"nftables", "", short, 3, 3, 0, kindBinomial},
		{"iptables", "", long, 3, 2, 1, kindNotRun},
		{"iptables", "", short, 1, 2, 1, kindNotRun},
		{"ipvs", "rr", short, 3, 3, 0, kindRotation},
		{"ipvs", "", short, 3, 3, 0, kindRotation},
		{"ipvs", "mh", short, 3, 3, 0, kindBinomial},
		{"ipvs", "sh", short, 3, 2, 1, kindNotRun},
		{"ipvs", "dh", short, 3, 2, 1, kindNotRun},
		{"ipvs", "lc", short, 3, 2, 1, kindNotRun},
		{"iptables", "", short, 0, 0, 0, ""},
		{"iptables", "", &cluster.ServicePort{}, 3, 0, 0, ""},
	} {
		run, notRun := affinityVerdicts(tc.mode, tc.sched, tc.sp, tc.eligible)
		if run != tc.run || notRun != tc.notRun {
			t.Errorf("%s %s timeout %d, %d eligible: %d run, %d not run; want %d, %d", tc.mode, tc.sched, tc.sp.AffinityTimeout, tc.eligible, run, notRun, tc.run, tc.notRun)
		}
		if tc.expiry != "" {
			if got := planAffinity(tc.mode, tc.sched, tc.sp, tc.eligible).Expiry.Kind; got != tc.expiry {
				t.Errorf("%s %s: expiry %q, want %q", tc.mode, tc.sched, got, tc.expiry)
			}
		}
	}
}

// TestAffinitySizes pins the sizing arithmetic against hand-computed
// values.
func TestAffinitySizes(t *testing.T) {
	alpha := stats.DefaultFamilyAlpha / 33
	if n, _ := firstChoiceSize(stats.Uniform(3), 0.1, 0.99, alpha); n != 370 {
		t.Errorf("first choice size %d, want 370 (w^2 0.125, df 2)", n)
	}
	// 1 - (1 - 0.1 (1 - 3^-2))^60 = 1 - 0.911111^60 = 0.99625.
	if p := leakPower(0.1, 3, 60, 2); fmt.Sprintf("%.4f", p) != "0.9962" {
		t.Errorf("leak power %.6f, want 0.9962", p)
	}
	if r, c := stickySize(3, 60, 0.99); r != 2 || c != 50 {
		t.Errorf("sticky size %d rounds, %d clients; want 2, 50", r, c)
	}
	if r, c := stickySize(3, 10, 0.99); r != maxStickyRounds || c != 44 {
		t.Errorf("sticky size with 10 clients %d rounds, %d clients; want %d, 44", r, c, maxStickyRounds)
	}
	if n, _, _ := expiryTrials(3, alpha, 0.99); n != 87 {
		t.Errorf("expiry trials %d, want 87", n)
	}
	if c := expiryCycles(87, 60, 4*time.Second); c != 2 {
		t.Errorf("expiry cycles %d, want 2", c)
	}
	if c := expiryCycles(87, 10, 67*time.Second); c != 2 {
		t.Errorf("ipvs expiry cycles %d, want 2 (idle budget)", c)
	}
}

// TestAffinityRotation runs the affinity check in ipvs rr mode through a
// toy rotation: the correct one passes every verdict; with 60 % of the
// templates outliving their timeout (a fault the (k-1)/k binomial let
// through) the expiry verdict fails every time.
func TestAffinityRotation(t *testing.T) {
	alpha := stats.DefaultFamilyAlpha / 33
	for _, variant := range []string{fakeCorrect, fakeTemplates} {
		res := affinityCalibration(t, cluster.ModeIPVS, variant, 20, alpha)
		for _, rc := range res[0] {
			t.Logf("%s: %s: %s p %g: %s", variant, rc.Phase, rc.Test, rc.P, rc.Message)
		}
		for i, run := range res {
			for _, rc := range run {
				wantFail := variant == fakeTemplates && rc.Phase == "expiry"
				if (rc.P == 0) != wantFail {
					t.Errorf("%s run %d: %s: p %g (%s), want failed %v", variant, i, rc.Name, rc.P, rc.Message, wantFail)
				}
				if rc.Phase != "stickiness" && rc.Test != kindRotation {
					t.Errorf("%s: test %q, want the rotation", rc.Name, rc.Test)
				}
			}
		}
	}
}

// TestAffinityUnits counts the conformance scenarios' affinity verdicts
// the way the planner would: affinity.yaml runs its three in every mode,
// affinity-many-clients (timeoutSeconds 60) leaves its expiry out.
func TestAffinityUnits(t *testing.T) {
	for _, tc := range []struct {
		file        string
		mode        cluster.Mode
		run, notRun int
	}{
		{"affinity.yaml", cluster.ModeIPTables, 3, 0},
		{"affinity.yaml", cluster.ModeIPVS, 3, 0},
		{"affinity-many-clients.yaml", cluster.ModeNFTables, 2, 1},
	} {
		s, _ := offlineSuite(t, conformanceDir+"/"+tc.file, tc.mode)
		sc := s.l.Scenario
		c := &sc.Checks[0]
		run, notRun := affinityUnits(s.or, tc.mode, s.scheduler(), s.state(), c, clientNodes(sc, c, s.state().SortedNodes(), s.state()))
		if run != tc.run || notRun != tc.notRun {
			t.Errorf("%s in %s mode: %d run, %d not run; want %d, %d", tc.file, tc.mode, run, notRun, tc.run, tc.notRun)
		}
	}
}

// TestIPVSBalance runs the rr distribution verdict through a toy rotation
// (passes) and a toy uniform random choice, which a chi-square would pass
// and the balance check must fail.
func TestIPVSBalance(t *testing.T) {
	s, clients := offlineSuite(t, conformanceDir+"/ipvs/wrr.yaml", cluster.ModeIPVS)
	c := &s.l.Scenario.Checks[0]
	spn, sp, err := s.spn(c)
	if err != nil {
		t.Fatal(err)
	}
	var eps []netip.AddrPort
	for _, e := range oracle.Expect(cluster.ModeIPVS, sp, s.state().Endpoints[spn], "node-a", "").Endpoints() {
		eps = append(eps, netip.MustParseAddrPort(e))
	}
	for _, rr := range []bool{true, false} {
		for i := range 20 {
			f := &fakeMachine{cl: clients, eps: eps, shares: stats.Uniform(len(eps)), rng: rand.New(rand.NewPCG(uint64(i), 0xba1)),
				binds: map[netip.Addr]*fakeBinding{}, touched: map[netip.Addr]bool{}, rr: rr, ptr: i}
			f.phase()
			s.mc, s.rng, s.alphaUnit = f, rand.New(rand.NewPCG(uint64(i), 1)), 1e-4
			s.out = &report.Suite{Figures: map[string]any{}}
			s.ipvsBalance(context.Background(), c, "node-a")
			rc := s.out.Checks[0]
			if rc.Verdict == report.Error || (rc.P == 1) != rr || rc.N < 100 {
				t.Errorf("rotation %v, run %d: %s p %g n %d: %s", rr, i, rc.Test, rc.P, rc.N, rc.Message)
			}
		}
	}
}
