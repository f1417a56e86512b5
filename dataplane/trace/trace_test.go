package trace

import (
	"math"
	"slices"
	"testing"
)

func TestResultHelpers(t *testing.T) {
	r := Result{{Target: "a", P: 0.25}, {Target: "a", Masquerade: true, P: 0.25}, {Target: "b", P: 0.5}, {Target: "c"}}
	if r.P("a") != 0.5 || !slices.Equal(r.Targets(), []string{"a", "b"}) {
		t.Errorf("P/Targets wrong: %v %v", r.P("a"), r.Targets())
	}
	if !math.IsInf(Uniform(r, []string{"a"}), 1) {
		t.Error("Uniform ignored an outcome outside the endpoints")
	}
	if d := Uniform(Result{{Target: "x", P: 0.5}, {Target: "y", P: 0.5}}, []string{"x", "y"}); d != 0 {
		t.Errorf("Uniform of an even split = %v, want 0", d)
	}
}

// TestResultFormats pins both printed forms: String (the trace goldens) and
// Lines (the iptables tests' failure messages).
func TestResultFormats(t *testing.T) {
	r := Result{{Target: "10.0.0.1:80", Masquerade: true, P: 1.0 / 3}, {Target: OutcomeDrop, P: 2.0 / 3}}
	if got, want := r.String(), "10.0.0.1:80 masq 0.333333, DROP 0.666667"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if got, want := r.Lines(), "10.0.0.1:80 masq=true p=0.3333333333\nDROP masq=false p=0.6666666667\n"; got != want {
		t.Errorf("Lines = %q, want %q", got, want)
	}
	if Result(nil).String() != "" || Result(nil).Lines() != "" {
		t.Error("an empty result prints something")
	}
}

// TestSort: endpoints by address then port (10.0.0.9 before 10.0.0.10),
// verdicts after them by name, unmasqueraded first.
func TestSort(t *testing.T) {
	r := Result{
		{Target: OutcomeReject},
		{Target: "10.0.0.10:80"},
		{Target: OutcomeDrop},
		{Target: "10.0.0.9:80", Masquerade: true},
		{Target: "10.0.0.9:80"},
		{Target: "10.0.0.9:8080"},
	}
	r.Sort()
	var got []string
	for _, o := range r {
		s := o.Target
		if o.Masquerade {
			s += " masq"
		}
		got = append(got, s)
	}
	want := []string{"10.0.0.9:80", "10.0.0.9:80 masq", "10.0.0.9:8080", "10.0.0.10:80", "DROP", "REJECT"}
	if !slices.Equal(got, want) {
		t.Errorf("sorted %q, want %q", got, want)
	}
}
