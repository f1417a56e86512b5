package engine

import (
	"slices"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func TestSyncerBurstThenMinSyncPeriod(t *testing.T) {
	s := NewSyncer(SyncConfig{
		MinSyncPeriod: time.Second,
		Duration:      func(SyncInfo) time.Duration { return 100 * time.Millisecond },
	})
	var got []Sync
	req := func(at int64) {
		s.Request(at)
		got = append(got, s.Advance(at)...)
	}
	req(0)        // token 1 of 2: runs at once
	req(200 * ms) // token 2: runs at once
	req(400 * ms) // no token: waits
	req(500 * ms)
	req(900 * ms)
	if at, ok := s.Next(); !ok || at != 1300*ms {
		t.Fatalf("next %d ms %v, want 1300 ms (minSyncPeriod after the last run ended)", at/ms, ok)
	}
	got = append(got, s.Advance(2*sec)...)
	want := []Sync{
		{Start: 0, End: 100 * ms, Changes: 1},
		{Start: 200 * ms, End: 300 * ms, Changes: 1},
		{Start: 1300 * ms, End: 1400 * ms, Changes: 3},
	}
	if !slices.Equal(got, want) {
		t.Errorf("syncs %+v\nwant %+v", got, want)
	}
	// A change that arrived at 400 ms is in the rules from 1400 ms: the
	// exposure window of a flapping endpoint is 1 s here.
}

func TestSyncerSerialisesRuns(t *testing.T) {
	s := NewSyncer(SyncConfig{Duration: func(SyncInfo) time.Duration { return 500 * time.Millisecond }})
	s.Request(0)
	s.Request(100 * ms) // during the run
	s.Request(300 * ms)
	got := s.Advance(0)
	if at, _ := s.Next(); at != 500*ms {
		t.Errorf("next %d ms", at/ms)
	}
	got = append(got, s.Advance(2*sec)...)
	want := []Sync{{Start: 0, End: 500 * ms, Changes: 1}, {Start: 500 * ms, End: 1000 * ms, Changes: 2}}
	if !slices.Equal(got, want) {
		t.Errorf("syncs %+v, want %+v", got, want)
	}
	if _, ok := s.Next(); ok {
		t.Error("idle runner has a next event")
	}
}

func TestSyncerPeriodic(t *testing.T) {
	s := NewSyncer(SyncConfig{MinSyncPeriod: time.Second, MaxInterval: 30 * time.Second})
	s.Request(0)
	got := s.Advance(100 * sec)
	var starts []int64
	for _, x := range got {
		starts = append(starts, x.Start/sec)
	}
	if !slices.Equal(starts, []int64{0, 30, 60, 90}) {
		t.Errorf("starts %v", starts)
	}
	if got[1].Changes != 0 {
		t.Errorf("periodic run with changes %d", got[1].Changes)
	}
}

func TestSyncerNoRateLimit(t *testing.T) {
	s := NewSyncer(SyncConfig{})
	for i := range 5 {
		s.Request(int64(i) * ms)
	}
	if got := s.Advance(10 * ms); len(got) != 5 {
		t.Errorf("%d syncs, want 5 instant ones", len(got))
	}
}
