package differential

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func testSvc(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: name}}
}

func testSlice(svc, name string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
}

// describe prints a round as "+svc" / "+slice" / "-svc" / "-slice" names.
func describe(rs []writeSet) [][]string {
	var out [][]string
	for _, r := range rs {
		var l []string
		for _, s := range r.svcs {
			l = append(l, "+svc "+s.Name)
		}
		for _, s := range r.slices {
			l = append(l, "+slice "+s.Name)
		}
		for _, d := range r.delSvc {
			l = append(l, "-svc "+d.Name)
		}
		for _, d := range r.delSl {
			l = append(l, "-slice "+d.Name)
		}
		out = append(out, l)
	}
	return out
}

func TestRounds(t *testing.T) {
	nn := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "n", Name: n} }
	live := map[string]bool{"svc n/a": true, "svc n/b": true, "svc n/d": true}
	owner := map[string]string{"n/a-1": "n/a", "n/b-0": "n/b", "n/b-1": "n/b", "n/d-0": "n/d"}
	w := writeSet{
		// a: updated, one slice written, one deleted; b: deleted with
		// its slices; c: created with two slices; d: one slice written.
		svcs:   []*corev1.Service{testSvc("a"), testSvc("c")},
		slices: []*discoveryv1.EndpointSlice{testSlice("a", "a-0"), testSlice("c", "c-0"), testSlice("c", "c-1"), testSlice("d", "d-0")},
		delSvc: []types.NamespacedName{nn("b")},
		delSl:  []types.NamespacedName{nn("a-1"), nn("b-0"), nn("b-1")},
	}
	want := [][]string{
		{"+svc a", "+slice c-0", "+slice c-1", "+slice d-0", "-svc b"},
		{"+svc c", "+slice a-0", "-slice b-0", "-slice b-1"},
		{"-slice a-1"},
	}
	if d := cmp.Diff(want, describe(rounds(w, live, owner))); d != "" {
		t.Errorf("rounds (-want +got):\n%s", d)
	}
}

// TestRoundsCover checks, over the large regime's plan, that rounds keep
// every write of a step exactly once.
func TestRoundsCover(t *testing.T) {
	plan := PlanRandom(1, RandomScenarios, DefaultGenConfig())
	total, steps, most := 0, 0, 0
	for _, b := range plan[1].Batches {
		live, owner := map[string]bool{}, map[string]string{}
		for k := 0; ; k++ {
			var w writeSet
			for _, sc := range b {
				if k < len(sc.Steps) {
					st := sc.Steps[k]
					w.add(writeSet{svcs: st.Services, slices: st.Slices, delSvc: st.DeleteServices, delSl: st.DeleteSlices})
				}
			}
			if w.empty() {
				break
			}
			rs := rounds(w, live, owner)
			var all writeSet
			for _, r := range rs {
				all.add(r)
			}
			if n, m := len(all.svcs)+len(all.slices)+len(all.delSvc)+len(all.delSl), len(w.svcs)+len(w.slices)+len(w.delSvc)+len(w.delSl); n != m {
				t.Errorf("step %d: %d writes in rounds, %d in the step", k, n, m)
			}
			track(live, owner, w)
			total += len(rs)
			steps++
			most = max(most, len(rs))
		}
	}
	t.Logf("large regime: %d steps in %d rounds (at most %d a step)", steps, total, most)
}
