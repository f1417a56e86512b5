package netns

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFindRunCgroups walks folders standing in for two hierarchies: a
// run's cgroup is found wherever it sits (up to the depth bound), its own
// tree is not searched, and a run prefix selects only its run.
func TestFindRunCgroups(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk("memory/process_api/abc/kpsim-3fa9c1/node-a/pods/kubepods")
	mk("memory/process_api/abc/kpsim-3fa9c1/node-a/kpsim-000000") // inside a run: not a run of its own
	mk("cpu/process_api/abc/kpsim-3fa9c1/node-a")
	mk("cpu/kpsim-0a0b0c")
	mk("cpu/kpsim-nothex")
	mk("cpu/a/b/c/d/e/f/kpsim-dddddd") // deeper than the bound
	hs := []hierarchy{{Mount: filepath.Join(root, "memory"), Controllers: []string{"memory"}}, {Mount: filepath.Join(root, "cpu"), Controllers: []string{"cpu"}}}
	got := findRunCgroups(hs, Prefix)
	want := map[string]string{"3fa9c1": "/process_api/abc/kpsim-3fa9c1", "0a0b0c": "/kpsim-0a0b0c"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("findRunCgroups (-want +got):\n%s", diff)
	}
	got = findRunCgroups(hs, RunPrefix("0a0b0c"))
	if diff := cmp.Diff(map[string]string{"0a0b0c": "/kpsim-0a0b0c"}, got); diff != "" {
		t.Errorf("findRunCgroups with a run prefix (-want +got):\n%s", diff)
	}
}

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		p, root string
		want    bool
	}{
		{"/a/kpsim-1", "/a/kpsim-1", true},
		{"/a/kpsim-1/node-a", "/a/kpsim-1", true},
		{"/a/kpsim-10", "/a/kpsim-1", false},
		{"/a", "/a/kpsim-1", false},
	} {
		if got := within(c.p, c.root); got != c.want {
			t.Errorf("within(%q, %q) = %v", c.p, c.root, got)
		}
	}
}

// TestHierarchies reads this machine's cgroup mounts (no root needed).
func TestHierarchies(t *testing.T) {
	hs, err := hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if !within(h.Mount, cgroupRoot) || (!h.V2 && len(h.Controllers) == 0) {
			t.Errorf("hierarchy %+v", h)
		}
	}
	if _, err := ownCgroup(); err != nil {
		t.Error(err)
	}
}
