package calibrate

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
)

// TestRunUpstream: medians over the runs, the objects prepared once per
// size and released after, an error naming the size.
func TestRunUpstream(t *testing.T) {
	prepared, released := 0, 0
	samples := map[int][]UpstreamSample{
		100: {{Full: 3, Partial: 0.3}, {Full: 1, Partial: 0.1}, {Full: 2, Partial: 0.2}},
		200: {{Full: 5, Partial: 0.5}, {Full: 4, Partial: 0.9}, {Full: 6, Partial: 0.4}},
	}
	tg := UpstreamTarget{Mode: cluster.ModeNFTables, Version: "v1.37.2",
		Prepare: func(_ context.Context, n, k, runs int) (func(context.Context, int) (UpstreamSample, error), func(), error) {
			prepared++
			if k != 10 || runs != 3 {
				t.Errorf("prepare(%d, %d, %d)", n, k, runs)
			}
			return func(_ context.Context, r int) (UpstreamSample, error) { return samples[n][r], nil }, func() { released++ }, nil
		}}
	cal, err := RunUpstream(context.Background(), tg, []int{100, 200}, 10, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if prepared != 2 || released != 2 {
		t.Errorf("prepared %d, released %d: want one each per size", prepared, released)
	}
	if p := cal.Points[0]; p.FullSeconds != 2 || p.PartialSeconds != 0.2 || len(p.FullRuns) != 3 || p.Runs != 3 {
		t.Errorf("100: %+v", p)
	}
	if p := cal.Points[1]; p.FullSeconds != 5 || p.PartialSeconds != 0.5 {
		t.Errorf("200: %+v", p)
	}
	tg.Prepare = func(context.Context, int, int, int) (func(context.Context, int) (UpstreamSample, error), func(), error) {
		return nil, nil, errors.New("no apiserver")
	}
	if _, err := RunUpstream(context.Background(), tg, []int{300}, 10, 1, nil); err == nil || !strings.Contains(err.Error(), "300 services x 10") {
		t.Errorf("error %v does not name the size", err)
	}
}

// TestCompare: ours over upstream at the sizes both measured, for the
// variant asked.
func TestCompare(t *testing.T) {
	ours := []*Calibration{
		{Mode: cluster.ModeIPTables, Variant: "nft", Points: []Point{{Services: 1000, EndpointsPerService: 10, FullSeconds: 9, PartialSeconds: 1}}},
		{Mode: cluster.ModeIPTables, Variant: "legacy", Points: []Point{
			{Services: 1000, EndpointsPerService: 10, FullSeconds: 0.5, PartialSeconds: 0.1, Runs: 5},
			{Services: 2000, EndpointsPerService: 10, FullSeconds: 1, PartialSeconds: 0.2}}},
	}
	up := &UpstreamCalibration{Mode: cluster.ModeIPTables, Variant: "legacy", Version: "v1.37.2", Points: []UpstreamPoint{
		{Services: 1000, EndpointsPerService: 10, FullSeconds: 0.25, PartialSeconds: 0.05, Runs: 3},
		{Services: 5000, EndpointsPerService: 10, FullSeconds: 2, PartialSeconds: 0.5, Runs: 3}}}
	rs := Compare(ours, "legacy", up)
	if len(rs) != 1 || rs[0].Services != 1000 || rs[0].Full != 2 || rs[0].Partial != 2 {
		t.Fatalf("ratios %+v", rs)
	}
	var b strings.Builder
	if err := WriteRatios(&b, up, rs); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"iptables (legacy), kube-proxy v1.37.2", "| 1000 x 10 | legacy | 0.500 | 0.250 | 2.00 | 0.1000 | 0.0500 | 2.00 | 5 / 3 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
