//go:build clustertest

package cluster_test

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/kpsim/kpsim/harness/report"
)

// TestSameVerdicts compares two conformance reports (test-cluster.sh: the
// run on a cluster, KPSIM_VERDICTS_A, and the namespace run of the same
// scenarios, KPSIM_VERDICTS_B): every check made in A must be made in B
// with the same verdict. Checks A did not make (not run on a cluster) are
// counted, not compared.
func TestSameVerdicts(t *testing.T) {
	a, b := os.Getenv("KPSIM_VERDICTS_A"), os.Getenv("KPSIM_VERDICTS_B")
	if a == "" || b == "" {
		t.Fatal("set KPSIM_VERDICTS_A and KPSIM_VERDICTS_B to two sim conform --json reports")
	}
	ra, rb := readRun(t, a), readRun(t, b)
	type key struct{ scenario, check, phase, node string }
	verdicts := func(r *report.Run) map[key]string {
		out := map[key]string{}
		for _, s := range r.Suites {
			for _, c := range s.Checks {
				out[key{s.Scenario, c.Name, c.Phase, c.ClientNode}] = c.Verdict
			}
		}
		return out
	}
	va, vb := verdicts(ra), verdicts(rb)
	same, notRun := 0, 0
	for k, v := range va {
		if v == report.NotRun {
			notRun++
			continue
		}
		w, ok := vb[k]
		switch {
		case !ok:
			t.Errorf("%s / %s %s @ %s: %s on the cluster, absent from the namespace run", k.scenario, k.check, k.phase, k.node, v)
		case v != w:
			t.Errorf("%s / %s %s @ %s: %s on the cluster, %s in the namespace run", k.scenario, k.check, k.phase, k.node, v, w)
		default:
			same++
		}
	}
	if same == 0 {
		t.Errorf("no check made in both reports")
	}
	t.Logf("%d checks made in both: same verdict; %d not run on the cluster", same, notRun)
}

func readRun(t *testing.T, path string) *report.Run {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r report.Run
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &r
}
