package conform

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/report"
)

// fakeFlow is a flow whose datagrams were sent every flowInterval from t0
// and arrived where at(seq) says ("" nowhere).
func fakeFlow(t0 time.Time, n int, at func(seq int) string) *flow {
	f := &flow{arrived: map[uint32]netip.AddrPort{}}
	for i := 0; i < n; i++ {
		f.sent = append(f.sent, t0.Add(time.Duration(i)*flowInterval))
		if e := at(i); e != "" {
			f.arrived[uint32(i)] = netip.MustParseAddrPort(e)
		}
	}
	return f
}

func TestJudgeFlow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	old, live := "10.244.1.54:5353", "10.244.0.53:5353"
	serving := map[netip.AddrPort]bool{netip.MustParseAddrPort(live): true}
	// The change at datagram 100, settled at 300, grace to 500, window 500-700.
	stage := stageResult{what: "remove", t0: t0.Add(100 * flowInterval), w0: t0.Add(500 * flowInterval), w1: t0.Add(700 * flowInterval),
		allowed: serving, winFrom: 500, winTo: 700}
	for _, c := range []struct {
		name    string
		at      func(int) string
		fail    bool
		message string
	}{
		{"cleaned at the sync", func(i int) string {
			if i < 300 {
				return old
			}
			return live
		}, false, "reached an allowed endpoint 500ms after the change (200 datagrams before it reached the old endpoint or nowhere)"},
		{"stale entry kept", func(int) string { return old }, true, "200 of 200 datagrams sent 1s after the settle reached an endpoint the client may not use"},
		{"black hole", func(i int) string {
			if i < 100 {
				return old
			}
			return ""
		}, true, "200 of 200 datagrams in the window arrived nowhere (at most 2 may)"},
		{"two lost in the window", func(i int) string {
			if i == 600 || i == 650 {
				return ""
			}
			return live
		}, false, "reached an allowed endpoint 0s after the change (0 datagrams before it reached the old endpoint or nowhere)"},
	} {
		rc := &report.Check{P: 1}
		judgeFlow(rc, fakeFlow(t0, 800, c.at), netip.MustParseAddrPort(old), []stageResult{stage})
		if failed := rc.P == 0; failed != c.fail || !strings.Contains(rc.Message, c.message) {
			t.Errorf("%s: failed %v (want %v): %s", c.name, failed, c.fail, rc.Message)
		}
		if rc.N != 200 || rc.Loss == nil || rc.Loss.Sent != 200 {
			t.Errorf("%s: n %d, loss %+v", c.name, rc.N, rc.Loss)
		}
	}
}

func TestJudgeFlowNoEndpoints(t *testing.T) {
	t0 := time.Unix(1000, 0)
	old := "10.244.1.54:5353"
	stage := stageResult{what: "not ready", t0: t0, w0: t0.Add(200 * flowInterval), w1: t0.Add(400 * flowInterval),
		allowed: map[netip.AddrPort]bool{}, winFrom: 200, winTo: 400}
	rc := &report.Check{P: 1}
	judgeFlow(rc, fakeFlow(t0, 500, func(i int) string {
		if i < 150 {
			return old
		}
		return ""
	}), netip.MustParseAddrPort(old), []stageResult{stage})
	if rc.P != 1 {
		t.Errorf("rejected flow failed: %s", rc.Message)
	}
	rc = &report.Check{P: 1}
	judgeFlow(rc, fakeFlow(t0, 500, func(int) string { return old }), netip.MustParseAddrPort(old), []stageResult{stage})
	if rc.P != 0 {
		t.Errorf("a flow still arriving while no endpoint serves passed: %s", rc.Message)
	}
}

func TestJudgeMove(t *testing.T) {
	a, b, c := netip.MustParseAddrPort("10.244.0.82:8080"), "10.244.1.82:8080", "10.244.1.83:8080"
	r := stageResult{what: "remove", allowed: map[netip.AddrPort]bool{netip.MustParseAddrPort(b): true, netip.MustParseAddrPort(c): true}}
	for _, x := range []struct {
		name  string
		after []string
		fail  bool
	}{
		{"sticks to b", []string{b, b, b, b}, false},
		{"chooses afresh", []string{b, c, b, b}, true},
		{"stays on the deleted one", []string{a.String(), a.String()}, true},
		{"rejected", []string{"REJECT", "REJECT"}, true},
	} {
		rc := &report.Check{P: 1}
		judgeMove(rc, nil, r, a, x.after)
		if failed := rc.P == 0; failed != x.fail {
			t.Errorf("%s: failed %v, want %v: %s", x.name, failed, x.fail, rc.Message)
		}
	}
}

// A flow that ended before its window, or whose observers dropped packets,
// decides nothing.
func TestJudgeFlowIncomplete(t *testing.T) {
	t0 := time.Unix(1000, 0)
	live := "10.244.0.53:5353"
	stage := stageResult{what: "remove", t0: t0, w0: t0.Add(400 * flowInterval), w1: t0.Add(600 * flowInterval),
		allowed: map[netip.AddrPort]bool{netip.MustParseAddrPort(live): true}, winFrom: 400, winTo: 600}
	short := fakeFlow(t0, 450, func(int) string { return live })
	rc := &report.Check{P: 1}
	judgeFlow(rc, short, netip.MustParseAddrPort(live), []stageResult{stage})
	if rc.Verdict != report.Error || rc.ErrorKind != report.KindEnvironment {
		t.Errorf("a flow that ended 50 datagrams into its window: %s %q", rc.Verdict, rc.Message)
	}
	dropped := fakeFlow(t0, 800, func(int) string { return live })
	dropped.drops = 3
	rc = &report.Check{P: 1}
	judgeFlow(rc, dropped, netip.MustParseAddrPort(live), []stageResult{stage})
	if rc.Verdict != report.Error || !strings.Contains(rc.Message, "dropped 3 packets") {
		t.Errorf("observer drops: %s %q", rc.Verdict, rc.Message)
	}
}
