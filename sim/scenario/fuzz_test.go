package scenario

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzLoad feeds arbitrary bytes to the loader and validator. Seeds:
// testdata/fuzz/FuzzLoad (every scenario of the repository and every invalid
// case of testdata/invalid). Properties:
//   - Load never panics;
//   - a rejection is an ErrorList of FieldErrors, each naming the file and a
//     position inside it (line 1..lines+1, column >= 1), sorted;
//   - an accepted scenario has its defaults (a seed) and loads again to the
//     same positions, and a small one expands without panicking (an
//     expansion error is an ErrorList too).
func FuzzLoad(f *testing.F) {
	f.Add([]byte("apiVersion: kpsim.dev/v1alpha1\nkind: Scenario\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const file = "fuzz.yaml"
		l, err := Load(file, data)
		if err != nil {
			requirePositioned(t, err, file, data)
			return
		}
		if l.Scenario == nil || l.Scenario.Seed == nil {
			t.Fatalf("accepted scenario without defaults: %+v", l.Scenario)
		}
		again, err := Load(file, data)
		if err != nil {
			t.Fatalf("the same bytes loaded once and failed the second time: %v", err)
		}
		if len(again.pos) != len(l.pos) {
			t.Fatalf("loading twice recorded %d then %d positions", len(l.pos), len(again.pos))
		}
		if small(l.Scenario) {
			if _, err := Expand(l, nil); err != nil {
				requirePositioned(t, err, file, data)
			}
		}
	})
}

// small bounds what the fuzzer expands: a generator of 100,000 Services is
// valid and slow, not interesting.
func small(sc *Scenario) bool {
	if sc.Cluster.NodeCount > 50 {
		return false
	}
	if g := sc.Generate; g != nil {
		d := g.EndpointsPerService
		if g.Services > 50 || d.Value > 50 || d.Max > 50 || d.Kind == "zipf" || d.Kind == "lognormal" {
			return false
		}
	}
	return true
}

// yamlLines counts the lines of data as YAML does (and as the positions the
// loader reports do): LF, CRLF and a bare CR each end a line (YAML 1.2,
// 5.4 Line Break Characters). Found by FuzzLoad and FuzzImport: "\r\r0" is
// three lines to YAML and one to a count of "\n".
func yamlLines(data []byte) int {
	crlf := bytes.Count(data, []byte("\r\n"))
	return bytes.Count(data, []byte("\n")) + bytes.Count(data, []byte("\r")) - crlf + 1
}

func requirePositioned(t *testing.T, err error, file string, data []byte) {
	t.Helper()
	var list ErrorList
	if !errors.As(err, &list) || len(list) == 0 {
		t.Fatalf("error is not a non-empty ErrorList: %T %v", err, err)
	}
	if !IsInvalid(err) {
		t.Fatalf("IsInvalid is false for %v", err)
	}
	lines := yamlLines(data)
	for i, e := range list {
		if e == nil {
			t.Fatalf("error %d is nil", i)
		}
		if e.File != file {
			t.Errorf("error %q names file %q, want %q", e.Error(), e.File, file)
		}
		if e.Pos.Line < 1 || e.Pos.Line > lines+1 || e.Pos.Column < 1 {
			t.Errorf("error %q has position %d:%d outside the %d-line input", e.Error(), e.Pos.Line, e.Pos.Column, lines)
		}
		if e.Message == "" {
			t.Errorf("error %d has no message: %+v", i, e)
		}
		if i > 0 {
			p := list[i-1]
			if p.Pos.Line > e.Pos.Line || (p.Pos.Line == e.Pos.Line && p.Pos.Column > e.Pos.Column) {
				t.Errorf("errors out of order: %q before %q", p.Error(), e.Error())
			}
		}
	}
}

// FuzzImport feeds arbitrary bytes to sim import's writer. Seeds:
// testdata/fuzz/FuzzImport (the real cluster dumps of
// scenarios/testdata/import, whole and one object at a time, and kubectl's
// other shapes). Properties: Import never panics; a rejection is bad input
// (an ErrorList, positioned) or the writer's own consistency error, which
// must never happen; an accepted dump gives a Scenario that loads again
// with the same number of objects and the same checks.
func FuzzImport(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: List\nitems: []\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const file = "dump.yaml"
		text, l, err := Import(file, data, "out.yaml")
		if err != nil {
			if !IsInvalid(err) {
				t.Fatalf("import failed on its own output: %v", err)
			}
			requirePositioned(t, err, file, data)
			return
		}
		again, err := Load("out.yaml", text)
		if err != nil {
			t.Fatalf("the imported scenario does not load: %v", err)
		}
		if len(again.Scenario.Objects) != len(l.Scenario.Objects) || len(again.Scenario.Checks) != len(l.Scenario.Checks) {
			t.Fatalf("objects %d -> %d, checks %d -> %d", len(l.Scenario.Objects), len(again.Scenario.Objects), len(l.Scenario.Checks), len(again.Scenario.Checks))
		}
	})
}
