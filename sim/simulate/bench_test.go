package simulate

import (
	"context"
	"testing"

	"github.com/kpsim/kpsim/sim/apiserver"
)

// BenchmarkRun1000Services simulates scenarios/1000-services.yaml (12
// million connections, 24 nodes) in all three modes, loading included.
// Run with
//
//	go test -run '^$' -bench Run1000Services -benchtime 3x -count 5 ./sim/simulate/
func BenchmarkRun1000Services(b *testing.B) {
	var conns int64
	for b.Loop() {
		m, err := apiserver.Open(context.Background(), "../../scenarios/1000-services.yaml", nil)
		if err != nil {
			b.Fatal(err)
		}
		r, err := Run(context.Background(), m, Options{})
		m.Close()
		if err != nil {
			b.Fatal(err)
		}
		conns = 0
		for _, md := range r.Modes {
			conns += md.Connections.Total
		}
	}
	b.ReportMetric(float64(conns)*float64(b.N)/b.Elapsed().Seconds(), "conns/s")
}
