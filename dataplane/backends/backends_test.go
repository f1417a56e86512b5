package backends

import (
	"errors"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/sim/cluster"
)

// TestRender: each mode renders what its own renderer renders, with the
// settings in effect named; IPVS and unknown modes are refused.
func TestRender(t *testing.T) {
	st := calibrate.Synthetic(3, 2)
	node := dataplane.NodeConfig{NodeName: "node-1"}

	r, err := Render(cluster.ModeIPTables, st, node, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ir, err := iptables.NewRenderer(iptables.Config{NodeConfig: node})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ir.Render(st, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Settings != "affinity recent" || !strings.Contains(r.Text, "# iptables-restore --noflush input:\n"+rs.Restore) || !strings.HasSuffix(r.Text, rs.Jumps) {
		t.Errorf("iptables: settings %q, text does not hold the renderer's restore input and jumps:\n%s", r.Settings, r.Text)
	}

	r, err = Render(cluster.ModeNFTables, st, node, Options{Layout: nftables.LayoutFast})
	if err != nil {
		t.Fatal(err)
	}
	want, err := nftables.RenderForNode(st, "node-1", nftables.Config{Layout: nftables.LayoutFast})
	if err != nil {
		t.Fatal(err)
	}
	if r.Settings != "layout fast" || r.Text != want {
		t.Errorf("nftables: settings %q, text differs from RenderForNode", r.Settings)
	}

	if _, err := Render(cluster.ModeIPVS, st, node, Options{}); !errors.Is(err, ErrNoRuleset) {
		t.Errorf("ipvs: %v, want ErrNoRuleset", err)
	}
	if _, err := Render("userspace", st, node, Options{}); !errors.Is(err, cluster.ErrUnknownMode) {
		t.Errorf("userspace: %v, want ErrUnknownMode", err)
	}
	if _, err := Render(cluster.ModeIPTables, st, node, Options{Affinity: "lru"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad affinity: %v, want ErrInvalidConfig", err)
	}
}

// TestNewUnknownMode: New refuses a mode it does not know before touching
// any namespace, with a nil Backend (not a typed nil).
func TestNewUnknownMode(t *testing.T) {
	b, err := New("userspace", nil, dataplane.NodeConfig{}, Options{})
	if !errors.Is(err, cluster.ErrUnknownMode) || b != nil {
		t.Errorf("New(userspace) = %v, %v; want nil, ErrUnknownMode", b, err)
	}
	b, err = New(cluster.ModeIPTables, nil, dataplane.NodeConfig{}, Options{IPTablesVariant: "xt"})
	if err == nil || b != nil {
		t.Errorf("New with iptables variant xt = %v, %v; want nil and an error", b, err)
	}
}
