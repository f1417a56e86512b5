package netns

import (
	"strings"
	"testing"
)

func TestNewRunID(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		id, err := NewRunID()
		if err != nil {
			t.Fatal(err)
		}
		if !ValidRunID(id) {
			t.Fatalf("NewRunID() = %q, not 6 lower-case hex characters", id)
		}
		seen[id] = true
	}
	if len(seen) < 45 {
		t.Errorf("50 run IDs gave only %d distinct ones", len(seen))
	}
}

func TestValidRunID(t *testing.T) {
	for id, want := range map[string]bool{
		"a1b2c3": true, "000000": true, "A1B2C3": false, "a1b2c": false, "a1b2c3d": false, "g1b2c3": false, "": false,
	} {
		if got := ValidRunID(id); got != want {
			t.Errorf("ValidRunID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestNames(t *testing.T) {
	id := "3fa9c1"
	for _, tc := range []struct{ got, want string }{
		{RunPrefix(id), "kpsim-3fa9c1-"},
		{FabricName(id), "kpsim-3fa9c1-_fabric"},
		{NodeName(id, "node-1"), "kpsim-3fa9c1-node-1"},
		{BackendName(id, "node-1"), "kpsim-3fa9c1-node-1_be"},
		{ClientName(id, "node-1", "load", 0), "kpsim-3fa9c1-node-1_c-load-0"},
		{LinkTag(id), "kp3fa9c1"},
		{bridgeLink(id), "kp3fa9c1br"},
		{fabricPortLink(id, maxLinkIndex), "kp3fa9c1f999999"},
		{clientPortLink(id, maxLinkIndex), "kp3fa9c1c999999"},
		{uplinkLink(id), "kp3fa9c1eth0"},
		{backendPortLink(id), "kp3fa9c1be"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	// IFNAMSIZ: 15 characters and a NUL.
	for _, n := range []string{fabricPortLink(id, maxLinkIndex), clientPortLink(id, maxLinkIndex), uplinkLink(id)} {
		if len(n) > 15 {
			t.Errorf("link name %q is longer than 15 characters", n)
		}
		if _, ok := MatchLink(n, nil, RunPrefix(id)); !ok {
			t.Errorf("MatchLink(%q) = false for its own run", n)
		}
	}
}

func TestRoleOf(t *testing.T) {
	id := "3fa9c1"
	for name, want := range map[string]Role{
		FabricName(id):                    RoleFabric,
		NodeName(id, "node-1"):            RoleNode,
		NodeName(id, "fabric"):            RoleNode,
		BackendName(id, "node-1"):         RoleBackend,
		ClientName(id, "node-1", "be", 2): RoleClient,
		ClientName(id, "a.b-c", "x_y", 0): RoleClient,
		"kpsim-3fa9c-node-1":              "",
		"cni-1234":                        "",
		"kpsim-3FA9C1-node":               "",
	} {
		if got := RoleOf(name); got != want {
			t.Errorf("RoleOf(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestLabel(t *testing.T) {
	for in, want := range map[string]string{
		"node-1":          "node-1",
		"ip-10-0-1-2.ec2": "ip-10-0-1-2.ec2",
	} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
	long := strings.Repeat("n", 60)
	for _, in := range []string{"Node_1", "a/b", long, long + "x", "..", ""} {
		got := Label(in)
		if len(got) > maxLabel || strings.ContainsAny(got, "_/ ") || got == "" || got == ".." {
			t.Errorf("Label(%q) = %q: not a safe label", in, got)
		}
	}
	if Label(long) == Label(long+"x") {
		t.Errorf("long names that differ share label %q", Label(long))
	}
	if Label("Node_1") == Label("node-1") {
		t.Errorf("Label(Node_1) must differ from node-1")
	}
}

func TestParseAndMatch(t *testing.T) {
	for _, tc := range []struct {
		name, prefix string
		id           string
		ok           bool
	}{
		{"kpsim-3fa9c1-node-1", "kpsim-", "3fa9c1", true},
		{"kpsim-3fa9c1-node-1", "kpsim-3fa9c1-", "3fa9c1", true},
		{"kpsim-3fa9c1-node-1", "kpsim-3fa9c1-node-1", "3fa9c1", true},
		{"kpsim-3fa9c1-node-1", "kpsim-000000-", "", false},
		{"kpsim-3fa9c1-", "kpsim-", "", false},    // no rest
		{"kpsim-3fa9c-node", "kpsim-", "", false}, // short run id
		{"kpsimx3fa9c1-node", "kpsim", "", false},
		{"cni-3fa9c1-node", "kpsim-", "", false},
	} {
		id, ok := MatchPrefix(tc.name, tc.prefix)
		if id != tc.id || ok != tc.ok {
			t.Errorf("MatchPrefix(%q, %q) = %q, %v; want %q, %v", tc.name, tc.prefix, id, ok, tc.id, tc.ok)
		}
	}
}

func TestValidCleanupPrefix(t *testing.T) {
	for p, want := range map[string]bool{
		"kpsim-":              true,
		"kpsim-3fa9c1-":       true,
		"kpsim-3fa9c1-node-1": true,
		"kpsim-3fa9c1":        false, // could select kpsim-3fa9c1x...
		"kpsim":               false,
		"k":                   false,
		"":                    false,
		"cni-":                false,
		"kpsim-3fa9c":         false,
	} {
		if got := ValidCleanupPrefix(p); got != want {
			t.Errorf("ValidCleanupPrefix(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestMatchLink(t *testing.T) {
	for _, tc := range []struct {
		name   string
		alt    []string
		prefix string
		id     string
		ok     bool
	}{
		{"kp3fa9c1eth0", nil, "kpsim-", "3fa9c1", true},
		{"kp3fa9c1f12", nil, "kpsim-3fa9c1-", "3fa9c1", true},
		{"kp3fa9c1c0", nil, "kpsim-000000-", "", false},
		{"kp3fa9c1c0", nil, "kpsim-3fa9c1-node-1", "", false},
		{"veth1234", []string{"kpsim-3fa9c1-node-1-eth0"}, "kpsim-", "3fa9c1", true},
		{"veth1234", []string{"kpsim-3fa9c1-node-1-eth0"}, "kpsim-3fa9c1-node-1", "3fa9c1", true},
		{"veth1234", []string{"something-else"}, "kpsim-", "", false},
		{"kp3fa9c1xyz", nil, "kpsim-", "", false},
		{"kpsim0", nil, "kpsim-", "", false},
		{"eth0", nil, "kpsim-", "", false},
		{"docker0", nil, "kpsim-", "", false},
	} {
		id, ok := MatchLink(tc.name, tc.alt, tc.prefix)
		if id != tc.id || ok != tc.ok {
			t.Errorf("MatchLink(%q, %v, %q) = %q, %v; want %q, %v", tc.name, tc.alt, tc.prefix, id, ok, tc.id, tc.ok)
		}
	}
}
