package simulate

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/report"
)

// longLivedFile is the example scenario: demo/aged (pools, maxAge 30 s),
// demo/kept (pools, no maxAge) and demo/short (a connection per request)
// scaled from 3 to 6 pods at 60 s; demo/mixed (light and heavy clients)
// not scaled.
const longLivedFile = "../../scenarios/long-lived.yaml"

// chiAlpha is the level of the tests' chi-square against an even spread.
const chiAlpha = 0.001

func followedPort(t *testing.T, m *report.Mode, port string) *report.LongLived {
	t.Helper()
	for i := range m.LongLived {
		if m.LongLived[i].ServicePort == port {
			return &m.LongLived[i]
		}
	}
	t.Fatalf("%s: no figures for %s", m.Mode, port)
	return nil
}

// TestLongLivedScaleUp: after the scale-up from 3 to 6 pods, in every
// mode, the pooled port with a maxAge has a request imbalance that decays
// (within the even-spread bound at the end of the run, and before every
// connection has been replaced, 1.1 × maxAge); the pooled port without one
// keeps it to the end (the new pods never get a request); the port with a
// connection per request shows none beyond sampling noise once the sync
// has put the new pods in the rules (its per-pod requests from the next
// bin on pass a chi-square against even shares at α = 0.001).
func TestLongLivedScaleUp(t *testing.T) {
	r := simulate(t, longLivedFile, nil, Options{})
	const maxAge = 30 * time.Second
	for i := range r.Modes {
		m := &r.Modes[i]
		if m.Requests == nil || m.Requests.Failed != 0 {
			t.Fatalf("%s: requests %+v, want some and none failed", m.Mode, m.Requests)
		}
		aged := followedPort(t, m, "demo/aged:http")
		if d := aged.Scale; d == nil || d.PodsBefore != 3 || d.PodsAfter != 6 || d.Peak < 1.8 || !d.Decayed || d.DecaySeconds > 1.1*maxAge.Seconds() {
			t.Errorf("%s demo/aged: %d → %d pods, peak %.2f, decayed %v after %.2f s; want 3 → 6 pods, a peak near 2 and a decay within 1.1 × maxAge", m.Mode, d.PodsBefore, d.PodsAfter, d.Peak, d.Decayed, d.DecaySeconds)
		}
		kept := followedPort(t, m, "demo/kept:http")
		if d := kept.Scale; d == nil || d.Decayed || d.Last < 1.8 || slices.ContainsFunc(d.NewPodsShare, func(x float64) bool { return x != 0 }) {
			t.Errorf("%s demo/kept: decayed %v, last %.2f, new pods' shares %v; want the imbalance to the end and no request on a new pod", m.Mode, d.Decayed, d.Last, d.NewPodsShare)
		}
		short := followedPort(t, m, "demo/short:http")
		d := short.Scale
		window := scaleWindow(t, r, m, short.ServicePort)
		if d == nil || !d.Decayed || d.DecaySeconds > window+short.BinSeconds {
			t.Errorf("%s demo/short: decayed %v after %.2f s; want within the bound by the end of the sync's exposure window (%.3f s) and one bin", m.Mode, d.Decayed, d.DecaySeconds, window)
			continue
		}
		obs := make([]float64, len(short.Pods))
		synced := int(math.Ceil((d.AtSeconds + window) / short.BinSeconds)) // the first bin after every node's sync
		for b := synced; b < len(short.PerBin); b++ {
			for ep, n := range short.PerBin[b] {
				obs[ep] += float64(n)
			}
		}
		exp := make([]float64, len(obs))
		for ep := range exp {
			exp[ep] = 1 / float64(len(exp))
		}
		res, err := stats.ChiSquareGOF(obs, exp)
		if err != nil {
			t.Fatal(err)
		}
		if res.P < chiAlpha {
			t.Errorf("%s demo/short after the sync: requests per pod %v are not even (chi-square p = %.3g < %g)", m.Mode, obs, res.P, chiAlpha)
		}
	}
}

// scaleWindow is the longest exposure window of the step that scaled a
// service port's Service.
func scaleWindow(t *testing.T, r *report.Report, m *report.Mode, port string) float64 {
	t.Helper()
	for k, st := range r.Steps {
		if slices.Contains(st.ServicePorts, port) {
			return m.Flapping.Steps[k].WindowMaxSeconds
		}
	}
	t.Fatalf("no step changed %s", port)
	return 0
}

// TestLongLivedConnectionsEvenRequestsNot: demo/mixed's heavy clients
// (2,000 requests per second over 2 connections each, among 384 light
// connections) leave its connections even and its requests not, in every
// mode, and the finding says so.
func TestLongLivedConnectionsEvenRequestsNot(t *testing.T) {
	r := simulate(t, longLivedFile, nil, Options{Modes: []cluster.Mode{"iptables", "ipvs"}})
	for i := range r.Modes {
		mixed := followedPort(t, &r.Modes[i], "demo/mixed:http")
		b := mixed.Before
		if !b.Connections.Even || b.Requests.Even || b.Requests.MaxOverFair < 1.2 || mixed.Scale != nil {
			t.Errorf("%s demo/mixed: connections %+v, requests %+v; want connections even, requests over 1.2 × fair", r.Modes[i].Mode, b.Connections, b.Requests)
		}
		if len(mixed.Findings) == 0 || !bytes.HasPrefix([]byte(mixed.Findings[0]), []byte("connections are even, requests are not")) {
			t.Errorf("%s demo/mixed: findings %q", r.Modes[i].Mode, mixed.Findings)
		}
	}
}

// TestLongLivedSchedulers: the same workload under IPVS rr and lc. lc
// counts connections, not requests: with pools it sends the replaced
// connections to the new pods, which have fewer, so the pooled port with a
// maxAge comes within the bound in at most three quarters of rr's time;
// the pooled port without one stays as it is under both; with a
// connection per request and heavy-tailed durations its count is the
// requests in flight, which it keeps more even bin by bin than rr does.
func TestLongLivedSchedulers(t *testing.T) {
	ipvs := []cluster.Mode{"ipvs"}
	rr := &simulate(t, longLivedFile, nil, Options{Modes: ipvs, IPVSScheduler: "rr"}).Modes[0]
	lc := &simulate(t, longLivedFile, nil, Options{Modes: ipvs, IPVSScheduler: "lc"}).Modes[0]
	ra, la := followedPort(t, rr, "demo/aged:http").Scale, followedPort(t, lc, "demo/aged:http").Scale
	if !ra.Decayed || !la.Decayed || la.DecaySeconds > 0.75*ra.DecaySeconds {
		t.Errorf("demo/aged: rr decayed %v in %.2f s, lc %v in %.2f s; want lc within 3/4 of rr's time", ra.Decayed, ra.DecaySeconds, la.Decayed, la.DecaySeconds)
	}
	if followedPort(t, lc, "demo/kept:http").Scale.Decayed {
		t.Error("demo/kept under lc: decayed, but no pooled connection is ever replaced")
	}
	rs, ls := followedPort(t, rr, "demo/short:http").Before.PerBin, followedPort(t, lc, "demo/short:http").Before.PerBin
	if ls.InFlightMean >= rs.InFlightMean {
		t.Errorf("demo/short before the scale: requests in flight bin by bin %.3f × fair under lc, %.3f × under rr; want lc below", ls.InFlightMean, rs.InFlightMean)
	}
}

// TestLongLivedModeAlone: requests are replayed from their own stream, the
// same in every mode: a mode simulated alone gives exactly its part of
// the run of all modes, and the same seed the same bytes.
func TestLongLivedModeAlone(t *testing.T) {
	all := simulate(t, longLivedFile, nil, Options{})
	alone := simulate(t, longLivedFile, nil, Options{Modes: []cluster.Mode{"nftables"}})
	if !bytes.Equal(encode(t, all.Modes[1]), encode(t, alone.Modes[0])) {
		t.Error("nftables alone differs from nftables among all modes")
	}
}

// TestLongLivedScaleAtStart: a scale event at 0 leaves an empty window
// before it, reported as such (no pods, no finding about it, no NaN in
// report.json), and the pools, opened at 0 through the rules of before
// the sync, start on the old pods.
func TestLongLivedScaleAtStart(t *testing.T) {
	data, err := os.ReadFile(longLivedFile)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(data), "{at: 60s, type: scale, service: demo/aged", "{at: 0s, type: scale, service: demo/aged", 1)
	s = strings.Replace(s, "duration: 150s", "duration: 20s", 1)
	file := filepath.Join(t.TempDir(), "at0.yaml")
	if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	r := simulate(t, file, nil, Options{Modes: []cluster.Mode{"iptables"}})
	var out bytes.Buffer
	if err := r.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	aged := followedPort(t, &r.Modes[0], "demo/aged:http")
	if len(aged.Before.Pods) != 0 || aged.Scale == nil || aged.Scale.Peak < 1.5 || len(aged.Findings) != 1 {
		t.Errorf("demo/aged scaled at 0: before %+v, scale %v, findings %q", aged.Before, aged.Scale != nil, aged.Findings)
	}
}
