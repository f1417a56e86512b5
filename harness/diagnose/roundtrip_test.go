package diagnose_test

import (
	"math"
	"testing"

	"github.com/kpsim/kpsim/harness/diagnose"
	"github.com/kpsim/kpsim/harness/internal/diagnosetest"
)

// TestRoundTripCommitted: on every committed dump (make diagnose-dumps),
// sim diagnose reaches the run's verdict for every check (RoundTrip).
func TestRoundTripCommitted(t *testing.T) {
	for _, archive := range diagnose.DumpArchives(t) {
		config, name := diagnose.CaseOf(t, archive)
		t.Run(config+"/"+name, func(t *testing.T) {
			dir := diagnose.ExtractDumps(t, archive)
			res, err := diagnosetest.RoundTrip(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(res) == 0 {
				t.Fatal("no decided check in the dump")
			}
			caught := 0
			for _, r := range res {
				if r.Mismatch != "" {
					t.Errorf("%s (%s, %s): %s", r.Check.Dir, r.Check.ServicePort, r.Format, r.Mismatch)
				}
				if r.Failed {
					caught++
				}
			}
			if name != "correct" && caught == 0 {
				t.Errorf("fault %s: no check failed in the dump", name)
			}
		})
	}
}

// TestRoundTripMustShow: the must-show on the committed dumps of a
// real kernel (iptables, nft backend): the fair split is fair; the
// uniform-probability fault is a rule-level finding with p near 0; the
// affinity Service with a few clients raises no finding; keep-not-ready's
// endpoint is stale against the API.
func TestRoundTripMustShow(t *testing.T) {
	find := func(t *testing.T, archive, port string) (*diagnose.DumpedCheck, *diagnose.Report) {
		t.Helper()
		dir := diagnose.ExtractDumps(t, diagnose.DumpsDir+"/"+archive)
		m, err := diagnose.ReadManifest(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, dc := range m.Checks {
			if dc.ServicePort != port {
				continue
			}
			after, err := diagnosetest.ReadDumped(dir, dc, dc.After, diagnose.FormatIPTablesSave)
			if err != nil {
				t.Fatal(err)
			}
			before, err := diagnosetest.ReadDumped(dir, dc, dc.Before, diagnose.FormatIPTablesSave)
			if err != nil {
				t.Fatal(err)
			}
			api, err := diagnose.LoadAPI(dir + "/" + dc.Dir + "/" + dc.API)
			if err != nil {
				t.Fatal(err)
			}
			return dc, diagnose.Analyze(after, diagnose.Options{Before: before, API: api, Node: dc.Node})
		}
		t.Fatalf("%s: no check of %s", archive, port)
		return nil, nil
	}
	portOf := func(t *testing.T, r *diagnose.Report, name string) *diagnose.PortReport {
		t.Helper()
		for _, p := range r.Ports {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("%s: no port %s in the analysis", r.File, name)
		return nil
	}
	t.Run("fair", func(t *testing.T) {
		for _, port := range []string{"demo/web:http", "demo/wide:http"} {
			_, r := find(t, "iptables-nft-correct.tar.gz", port)
			if p := portOf(t, r, port); p.Verdict != "fair" || !p.RulesFair {
				t.Errorf("%s: verdict %q (rules fair %v, p %v, n %d), want fair", port, p.Verdict, p.RulesFair, p.P, p.N)
			}
		}
	})
	t.Run("uniform-probability", func(t *testing.T) {
		_, r := find(t, "iptables-nft-uniform-probability.tar.gz", "demo/web:http")
		p := portOf(t, r, "demo/web:http")
		if p.RulesFair || !hasKind(r, "demo/web:http", diagnose.KindUnequalRules) {
			t.Errorf("rules fair %v, findings %v: want %s", p.RulesFair, findingKinds(r), diagnose.KindUnequalRules)
		}
		if !p.P.Valid() || math.IsNaN(float64(p.P)) || p.P > 1e-4 {
			t.Errorf("p %v (n %d), want about 0", p.P, p.N)
		}
	})
	t.Run("affinity", func(t *testing.T) {
		_, r := find(t, "iptables-nft-correct.tar.gz", "demo/sticky:http")
		p := portOf(t, r, "demo/sticky:http")
		if hasLevel(r, "demo/sticky:http", diagnose.LevelFinding) || p.Verdict != "fair" && p.Verdict != "explained" {
			t.Errorf("verdict %q, findings %v: want fair or explained, no finding", p.Verdict, findingKinds(r))
		}
		t.Logf("affinity port: verdict %q, tested %q n %d", p.Verdict, p.Tested, p.TestN)
	})
	t.Run("stale", func(t *testing.T) {
		for _, c := range []string{"iptables-nft-keep-not-ready.tar.gz", "iptables-nft-keep-deleted-endpoint.tar.gz"} {
			dir := diagnose.ExtractDumps(t, diagnose.DumpsDir+"/"+c)
			res, err := diagnosetest.RoundTrip(dir)
			if err != nil {
				t.Fatal(err)
			}
			stale := false
			for _, x := range res {
				for _, f := range x.Findings {
					stale = stale || x.Failed && f.Kind == diagnose.KindStale
				}
			}
			if !stale {
				t.Errorf("%s: no stale endpoint found on a check the run failed", c)
			}
		}
	})
}

func hasKind(r *diagnose.Report, port, kind string) bool {
	for _, f := range r.Findings {
		if f.Port == port && f.Kind == kind {
			return true
		}
	}
	return false
}

func hasLevel(r *diagnose.Report, port string, l diagnose.Level) bool {
	for _, f := range r.Findings {
		if f.Port == port && f.Level == l {
			return true
		}
	}
	return false
}

func findingKinds(r *diagnose.Report) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, string(f.Level)+" "+f.Kind+" "+f.Port)
	}
	return out
}
