package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLongLivedWriters: a report with clients with requests writes their
// section in report.md, its rows in the summary and requests.png.
func TestLongLivedWriters(t *testing.T) {
	r := sample()
	r.Traffic.RequestClients = []RequestClient{{Name: "grpc", Clients: 4, Pool: 2, MaxAgeSeconds: 30, Pick: "round-robin", RatePerSecond: 10, Duration: "pareto, mean 20ms, alpha 1.5"}}
	pods := []string{"10.244.0.10:8080", "10.244.1.10:8080"}
	r.Modes[0].Requests = &Requests{Total: 40}
	r.Modes[0].LongLived = []LongLived{{
		ServicePort: "a/b:http", Clients: []string{"grpc"}, Pods: pods, BinSeconds: 1, Requests: 40,
		Before:   Balance{ToSeconds: 2, Connections: Spread{MaxOverFair: 1, Bound: 1.5, Even: true}, Requests: Spread{MaxOverFair: 1.4, Bound: 1.1}},
		Scale:    &Decay{AtSeconds: 2, Replicas: 2, PodsBefore: 1, PodsAfter: 2, FromBin: 2, Imbalance: []float64{2, 1}, Bound: []float64{1.2, 1.2}, Peak: 2, Decayed: true, DecaySeconds: 1, Last: 1},
		Eligible: []int{1, 1, 2, 2}, PerBin: [][]int64{{10, 0}, {10, 0}, {10, 0}, {5, 5}},
		InFlight: [][]float64{{1, 0}, {1, 0}, {1, 0}, {0.5, 0.5}}, Connections: [][]float64{{2, 0}, {2, 0}, {2, 0}, {1, 1}},
		Findings: []string{"connections are even, requests are not: over the run"},
	}}
	var md, table bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Long-lived connections and requests", "- grpc: 4 clients, a pool of 2 per target (maxAge 30.00 s, round-robin)", "### a/b:http",
		"peak 2.00, within bound after 1.00 s, last 1.00", "- nftables: connections are even, requests are not", "![request share per pod](requests.png)"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "a/b:http: after the scale event") {
		t.Errorf("table lacks the scale row:\n%s", table.String())
	}
	dir := t.TempDir()
	if _, err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, Files.Requests)); !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Error("requests.png is not a PNG")
	}
}
