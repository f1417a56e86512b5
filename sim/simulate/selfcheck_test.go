package simulate

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/report"
	"github.com/kpsim/kpsim/sim/scenario"
)

// TestSelfCheckCatchesEngineFaults: each engine fault makes its mode's
// engine self-check fail on testdata/medium.yaml: Holm rejects service
// ports and the p-values are flagged as not uniform (iptables, nftables),
// or the rotation is broken (ipvs rr); the run fails with
// "<mode>/engine-self-check". The same scenario without a fault passes
// (TestMediumChecks).
func TestSelfCheckCatchesEngineFaults(t *testing.T) {
	for _, f := range []engine.Fault{engine.FaultUniformProbability, engine.FaultMovedBucket, engine.FaultRotationStall} {
		t.Run(f.String(), func(t *testing.T) {
			mode := f.Mode().String()
			r := simulate(t, "testdata/medium.yaml", nil, Options{Modes: []cluster.Mode{f.Mode().Cluster()}, Fault: f.String()})
			sc := r.Modes[0].SelfCheck
			t.Logf("%s: %d checked, %d rejected; findings %v", mode, sc.ServicePorts, sc.Rejected, sc.Findings)
			if sc.Verdict != report.Fail || sc.Rejected == 0 {
				t.Errorf("%s with fault %s: self-check %s, %d of %d service ports rejected", mode, f, sc.Verdict, sc.Rejected, sc.ServicePorts)
			}
			if !slices.Contains(r.Failed, mode+"/engine-self-check") {
				t.Errorf("failed %v, want %s/engine-self-check among them", r.Failed, mode)
			}
			switch sc.Method {
			case report.MethodChiSquare:
				if u := sc.Uniformity; u == nil || !u.Rejected || u.AtMost05 <= int(u.Expected) {
					t.Errorf("the uniformity test did not flag the fault: %+v", u)
				}
			case report.MethodRotation:
				if rt := sc.Rotation; rt == nil || rt.Spread <= rt.Bound {
					t.Errorf("rotation %+v: no spread beyond the bound", rt)
				}
			default:
				t.Errorf("method %q", sc.Method)
			}
			if !slices.ContainsFunc(r.Model, func(s string) bool { return strings.Contains(s, "engine fault injected in "+mode+": "+f.String()) }) {
				t.Errorf("the model notes do not say a fault was injected: %v", r.Model)
			}
		})
	}
}

// TestUnknownFault: an unknown fault name is an error, not a correct run.
func TestUnknownFault(t *testing.T) {
	m, err := apiserver.Open(t.Context(), "testdata/flip.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := Run(t.Context(), m, Options{Fault: "skew"}); !errors.Is(err, engine.ErrUnknownFault) {
		t.Error("an unknown fault was accepted")
	}
}

// TestSelfCheckSchedulers: in ipvs mode the self-check follows the
// scheduler: a rotation check for wrr (its bound allows the restarts a
// drained real server causes), the chi-square for mh (a hash of the source
// address and port), nothing for sh (a hash of the client address); a
// correct engine passes each, on testdata/medium.yaml.
func TestSelfCheckSchedulers(t *testing.T) {
	for sched, method := range map[string]string{"wrr": report.MethodRotation, "mh": report.MethodChiSquare, "sh": report.MethodNone} {
		t.Run(sched, func(t *testing.T) {
			l, err := scenario.LoadFile("testdata/medium.yaml")
			if err != nil {
				t.Fatal(err)
			}
			l.Scenario.Proxy.IPVSScheduler = sched
			m, err := apiserver.OpenLoaded(t.Context(), l, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			r, err := Run(t.Context(), m, Options{Modes: []cluster.Mode{"ipvs"}})
			if err != nil {
				t.Fatal(err)
			}
			sc := r.Modes[0].SelfCheck
			t.Logf("%s: %s, %d checked, %d rejected: %v", sched, sc.Verdict, sc.ServicePorts, sc.Rejected, sc.Findings)
			if sc.Method != method {
				t.Errorf("method %q, want %q", sc.Method, method)
			}
			want := report.Pass
			if method == report.MethodNone {
				want = report.NotTested
			}
			if sc.Verdict != want || slices.Contains(r.Failed, "ipvs/engine-self-check") {
				t.Errorf("a correct engine: self-check %s (want %s), failed %v", sc.Verdict, want, r.Failed)
			}
			if method != report.MethodNone && sc.ServicePorts == 0 {
				t.Error("no service port checked")
			}
		})
	}
}

// TestStratifiedPValuesUniform: two versions of a service port with
// different eligible endpoints ({0, 1} and {1, 2} of three), 500 seeded
// repetitions. Summing one chi-square per stratum gives uniform p-values;
// pooling both under one expectation, as the section did before, gives
// too many p-values near 1 (a sum of multinomials with different shares
// varies less than one multinomial with the pooled shares).
func TestStratifiedPValuesUniform(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	all := &outcome{kind: oracle.Endpoints, allowed: []uint64{0b011}, n: 2}
	other := &outcome{kind: oracle.Endpoints, allowed: []uint64{0b110}, n: 2}
	var strat, pooled []float64
	counts := make([]int, 3)
	for range 500 {
		var strata []*sample
		pool := newSample(3)
		for _, o := range []*outcome{all, other} {
			p := []float64{0, 0, 0}
			for id := range 3 {
				if o.allows(int32(id)) {
					p[id] = 0.5
				}
			}
			stats.SampleMultinomial(r, 300, p, counts)
			cell := func(id int) float64 { return float64(counts[id]) }
			strata = append(strata, versionSample(3, 300, cell, o))
			pool.add(300, cell, o)
		}
		st, tested, err := testStrata(strata, 0)
		if err != nil || !tested || st.df != 2 || st.strata != 2 {
			t.Fatalf("stratified: %+v tested %v err %v", st, tested, err)
		}
		strat = append(strat, st.p)
		pr, err := stats.ChiSquareGOF(pool.obs, pool.exp)
		if err != nil {
			t.Fatal(err)
		}
		pooled = append(pooled, pr.P)
	}
	d, p := stats.KSUniform(strat)
	t.Logf("stratified: KS D %.3f, p %.3g", d, p)
	if p < 0.001 {
		t.Errorf("stratified p-values are not uniform: KS D %.3f, p %.3g", d, p)
	}
	d, p = stats.KSUniform(pooled)
	t.Logf("pooled: KS D %.3f, p %.3g", d, p)
	if p > 1e-6 {
		t.Errorf("pooled p-values look uniform (KS D %.3f, p %.3g): the test cannot tell the two apart", d, p)
	}
}
