package nftables

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
)

func TestZZDumpText(t *testing.T) {
	cfg := Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-1", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}, Layout: LayoutKubeProxy}
	st := calibrate.Synthetic(1000, 10)
	for i := 0; i < 3; i++ {
		r, _ := NewRenderer(cfg)
		s := time.Now()
		tx, _, err := r.Render(st, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		d1 := time.Since(s)
		s = time.Now()
		x := tx.String()
		t.Logf("render %v string %v (%d)", d1, time.Since(s), len(x))
	}
}
