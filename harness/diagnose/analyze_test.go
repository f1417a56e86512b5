package diagnose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
)

// quantise is a probability as the kernel's statistic match stores it
// (iptables: lround(2^31·p), printed as /2^31).
func quantise(p float64) float64 { return math.Round(p*(1<<31)) / (1 << 31) }

// cascade is the share each of k endpoints gets from a kube-proxy cascade
// whose i-th rule has probability prob(i) (the last rule is unconditional).
func cascade(k int, prob func(i int) float64) []float64 {
	out := make([]float64, k)
	left := 1.0
	for i := 0; i < k-1; i++ {
		q := quantise(prob(i))
		out[i] = left * q
		left *= 1 - q
	}
	out[k-1] = left
	return out
}

func fairCascade(k int) []float64 {
	return cascade(k, func(i int) float64 { return 1 / float64(k-i) })
}

func uniformFault(k int) []float64 {
	return cascade(k, func(int) float64 { return 1 / float64(k) })
}

var nextIP = 10

// port builds an iptables-like service port with one endpoint per share.
func port(name string, p []float64, counts []uint64) *ServicePort {
	nextIP++
	sp := &ServicePort{Name: name, ClusterIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(nextIP)}), Port: 80, Protocol: "tcp",
		Chain: "KUBE-SVC-" + strings.ToUpper(strings.NewReplacer("/", "", ":", "").Replace(name)), Scheduler: "cascade", Exact: true,
		Evidence: []Line{{File: "dump.txt", Line: 1, Text: "-A KUBE-SERVICES -d ... -j KUBE-SVC-" + name}}}
	for i := range p {
		e := &Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}), 8080), P: p[i],
			Chain: fmt.Sprintf("KUBE-SEP-%s-%d", name, i), Evidence: Line{File: "dump.txt", Line: 10 + i, Text: fmt.Sprintf("-A KUBE-SVC-%s ... -j KUBE-SEP-%d", name, i)}}
		if counts != nil {
			e.Observed = counts[i]
		}
		sp.Endpoints = append(sp.Endpoints, e)
	}
	return sp
}

func dumpOf(counters bool, ps ...*ServicePort) *Dump {
	return &Dump{File: "dump.txt", Format: FormatIPTablesSave, Mode: "iptables", Counters: counters, Ports: ps}
}

func draw(seed uint64, n int, p []float64) []uint64 {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]int, len(p))
	stats.SampleMultinomial(r, n, p, out)
	c := make([]uint64, len(p))
	for i, x := range out {
		c[i] = uint64(x)
	}
	return c
}

func kinds(r *Report, l Level) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Level == l {
			out = append(out, f.Kind)
		}
	}
	return out
}

func has(r *Report, l Level, kind string) *Finding {
	for _, f := range r.Findings {
		if f.Level == l && f.Kind == kind {
			return f
		}
	}
	return nil
}

func TestFairSplitNoFinding(t *testing.T) {
	p := fairCascade(3)
	d := dumpOf(true, port("ns/web:http", p, draw(1, 20000, p)))
	r := Analyze(d, Options{})
	if r.Problems() {
		t.Fatalf("findings on a fair split: %v", kinds(r, LevelFinding))
	}
	pr := r.Ports[0]
	if pr.Verdict != "fair" || pr.N != 20000 || pr.Chi == nil || pr.G == nil || !pr.RulesFair {
		t.Fatalf("port %+v", pr)
	}
	// The power statement is the chi-square's at α/m for one share off by 10 %.
	want := stats.ChiSquarePower(20000, 0.01/2, 2, 0.01)
	if math.Abs(float64(pr.Power)-want) > 1e-9 || !strings.Contains(pr.Statement, "with n = 20000 connections, a share off by 10 % would be detected with probability") {
		t.Errorf("power %v want %v; %q", pr.Power, want, pr.Statement)
	}
	for _, e := range pr.Endpoints {
		if !(float64(e.Lo) <= e.Share && e.Share <= float64(e.Hi)) || e.Expected != 20000*e.Intended {
			t.Errorf("endpoint %+v", e)
		}
	}
	if has(r, LevelNote, KindCountersLimit) == nil {
		t.Error("no note on what counters cannot show")
	}
}

func TestSkewFinding(t *testing.T) {
	d := dumpOf(true, port("ns/web:http", fairCascade(3), draw(2, 20000, stats.OneOffAlternative(3, 0.2))))
	r := Analyze(d, Options{})
	f := has(r, LevelFinding, KindSkew)
	if f == nil || r.Ports[0].Verdict != "skewed" {
		t.Fatalf("no skew finding: %v", kinds(r, LevelFinding))
	}
	if len(f.Evidence) != 3 || f.Evidence[0].Line != 10 {
		t.Errorf("evidence %v", f.Evidence)
	}
	if has(r, LevelFinding, KindUnequalRules) != nil {
		t.Error("fair rules reported as unequal")
	}
}

func TestUniformProbabilityFault(t *testing.T) {
	p := uniformFault(4)
	// Structure alone: a rule-level finding.
	r := Analyze(dumpOf(false, port("ns/web:http", p, nil)), Options{})
	if has(r, LevelFinding, KindUnequalRules) == nil || r.Ports[0].Verdict != "rules unequal" {
		t.Fatalf("no rule-level finding: %v", r.Findings)
	}
	if has(r, LevelNote, KindNoCounters) == nil {
		t.Error("no note about the missing counters")
	}
	// With counters drawn from the faulty rules: p ≈ 0 against the intended
	// split, and the counts fit the rules' own shares.
	r = Analyze(dumpOf(true, port("ns/web:http", p, draw(3, 20000, p))), Options{})
	pr := r.Ports[0]
	if !(pr.P < 1e-12) || !pr.Rejected || !(pr.AgainstRules > 1e-4) {
		t.Fatalf("p %v rejected %v against rules %v", pr.P, pr.Rejected, pr.AgainstRules)
	}
	n := 0
	for _, f := range r.Findings {
		if f.Kind == KindUnequalRules {
			n++
		}
	}
	if n != 2 || has(r, LevelFinding, KindSkew) != nil {
		t.Errorf("want the rule finding and its confirmation, no separate skew: %v", kinds(r, LevelFinding))
	}
	// The fair cascade as the kernel quantises it is no finding.
	r = Analyze(dumpOf(false, port("ns/web:http", fairCascade(7), nil)), Options{})
	if r.Problems() {
		t.Errorf("quantised fair cascade: %v", r.Findings)
	}
}

func TestAffinityFewClientsExplained(t *testing.T) {
	// Three clients: two chose endpoint 0, one endpoint 1; their thousands
	// of connections followed.
	sp := port("ns/aff:http", fairCascade(3), []uint64{6000, 3100, 0})
	sp.Affinity = &Affinity{Timeout: 10800 * time.Second, Mechanism: "recent", Evidence: Line{File: "dump.txt", Line: 5, Text: "-m recent --rcheck --seconds 10800"}}
	sp.SplitKnown = true
	for i, f := range []uint64{2, 1, 0} {
		sp.Endpoints[i].Fresh = f
		sp.Endpoints[i].Sticky = sp.Endpoints[i].Observed - f
	}
	r := Analyze(dumpOf(true, sp), Options{})
	if r.Problems() {
		t.Fatalf("affinity with 3 clients is not a finding: %v", r.Findings)
	}
	f := has(r, LevelExplanation, KindAffinity)
	if f == nil || r.Ports[0].Verdict != "explained" || !strings.Contains(f.Message, "3 fresh choices") {
		t.Fatalf("no explanation: %+v", r.Findings)
	}
	// Known clients (IPVS persistence templates): the same.
	sp2 := port("ns/aff2:http", []float64{0.5, 0.5}, []uint64{9000, 10})
	sp2.Scheduler, sp2.Endpoints[0].Weight, sp2.Endpoints[1].Weight = "rr", 1, 1
	sp2.Affinity = &Affinity{Timeout: 3 * time.Hour, Mechanism: "persistence", ClientsKnown: true}
	sp2.Endpoints[0].Clients = []Client{{Addr: netip.MustParseAddr("10.0.0.1")}, {Addr: netip.MustParseAddr("10.0.0.2")}}
	sp2.Endpoints[1].Clients = []Client{{Addr: netip.MustParseAddr("10.0.0.3")}}
	r = Analyze(&Dump{File: "ipvs.txt", Format: FormatIPVSAdm, Mode: "ipvs", Counters: true, Ports: []*ServicePort{sp2}}, Options{})
	if r.Problems() || has(r, LevelExplanation, KindAffinity) == nil {
		t.Fatalf("clients: %+v", r.Findings)
	}
	// Fresh choices that are skewed are a finding: affinity does not bias them.
	sp3 := port("ns/aff3:http", fairCascade(2), []uint64{30000, 10000})
	sp3.Affinity, sp3.SplitKnown = sp.Affinity, true
	sp3.Endpoints[0].Fresh, sp3.Endpoints[1].Fresh = 3000, 1000
	r = Analyze(dumpOf(true, sp3), Options{})
	if has(r, LevelFinding, KindSkew) == nil || r.Ports[0].Tested != "fresh choices" {
		t.Fatalf("skewed fresh choices: %+v", r.Findings)
	}
}

func TestStarvedEndpoint(t *testing.T) {
	d := dumpOf(true, port("ns/web:http", fairCascade(4), []uint64{6700, 6600, 6700, 0}))
	r := Analyze(d, Options{})
	f := has(r, LevelFinding, KindStarved)
	if f == nil || f.Evidence[0].Line != 13 {
		t.Fatalf("no starved finding: %+v", r.Findings)
	}
	// Four connections over four endpoints: nothing improbable.
	r = Analyze(dumpOf(true, port("ns/web:http", fairCascade(4), []uint64{2, 1, 1, 0})), Options{})
	if has(r, LevelFinding, KindStarved) != nil || r.Ports[0].Verdict != "no verdict" {
		t.Fatalf("few counts: %+v %s", r.Findings, r.Ports[0].Verdict)
	}
	// ... and the note says how many it would take.
	note := has(r, LevelNote, KindTooFew)
	if note == nil || !strings.Contains(note.Message, "a test needs 20") {
		t.Fatalf("too-few note: %+v", note)
	}
}

func TestBeforeAfterDeltas(t *testing.T) {
	p := fairCascade(2)
	before := dumpOf(true, port("ns/web:http", p, []uint64{1_000_000, 10}))
	after := dumpOf(true, port("ns/web:http", p, []uint64{1_005_000, 5_010}))
	after.Ports[0].ClusterIP = before.Ports[0].ClusterIP
	before.File, after.File = "before.txt", "after.txt"
	// Alone, the later dump is skewed (a long-gone imbalance); the deltas are fair.
	if r := Analyze(after, Options{}); has(r, LevelFinding, KindSkew) == nil {
		t.Fatalf("the cumulative counts should look skewed: %+v", r.Findings)
	}
	r := Analyze(after, Options{Before: before})
	if r.Problems() || r.Ports[0].N != 10000 || r.Ports[0].Endpoints[1].Observed != 5000 {
		t.Fatalf("deltas: n %d, %+v", r.Ports[0].N, r.Findings)
	}
	// A counter that went down: the later dump alone, with a note.
	reset := dumpOf(true, port("ns/web:http", p, []uint64{5000, 5020}))
	reset.Ports[0].ClusterIP = before.Ports[0].ClusterIP
	r = Analyze(reset, Options{Before: before})
	if has(r, LevelNote, KindCountersReset) == nil || r.Ports[0].N != 10020 || r.Problems() {
		t.Fatalf("reset: n %d %+v", r.Ports[0].N, r.Findings)
	}
}

func TestXtRecentLimit(t *testing.T) {
	sp := port("ns/aff:http", fairCascade(2), []uint64{500, 480})
	sp.Affinity = &Affinity{Timeout: 10800 * time.Second, Mechanism: "recent"}
	sp.SplitKnown = true
	sp.Endpoints[0].Fresh, sp.Endpoints[1].Fresh = 150, 140
	before := dumpOf(true, port("ns/aff:http", fairCascade(2), []uint64{0, 0}))
	before.Ports[0].ClusterIP = sp.ClusterIP
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	before.Captured = now.Add(-10 * time.Minute)
	d := dumpOf(true, sp)
	d.Captured = now
	r := Analyze(d, Options{Before: before})
	if f := has(r, LevelFinding, KindXtRecentLimit); f == nil || !strings.Contains(f.Message, "150 fresh choices in 10m0s") {
		t.Fatalf("no xt_recent finding: %+v", r.Findings)
	}
	// Without the interval it can only be a possibility.
	r = Analyze(d, Options{})
	if has(r, LevelFinding, KindXtRecentLimit) != nil || has(r, LevelNote, KindXtRecentLimit) == nil {
		t.Fatalf("no interval: %+v", r.Findings)
	}
}

func TestHolmOverPorts(t *testing.T) {
	p := fairCascade(2)
	var ports []*ServicePort
	for i := range 5 {
		ports = append(ports, port(fmt.Sprintf("ns/s%d:p", i), p, draw(uint64(10+i), 2000, p)))
	}
	// One port mildly off: its own p below α, above α/5 after Holm.
	ports[0].Endpoints[0].Observed, ports[0].Endpoints[1].Observed = 1060, 940
	r := Analyze(dumpOf(true, ports...), Options{})
	pr := r.Ports[0]
	if r.Tested != 5 || !(pr.P < 0.01) || pr.Rejected || !(pr.Adjusted > pr.P) {
		t.Fatalf("tested %d p %v adjusted %v rejected %v", r.Tested, pr.P, pr.Adjusted, pr.Rejected)
	}
	if r.Problems() {
		t.Errorf("Holm should clear it: %+v", r.Findings)
	}
}

// TestCalibration: on fair rules with multinomial counts, a dump has a
// finding in about α of the seeds; at a 10 % one-off the detection rate is
// the power the report states.
func TestCalibration(t *testing.T) {
	const runs = 400
	p := fairCascade(3)
	false1 := 0
	for s := range runs {
		if Analyze(dumpOf(true, port("ns/a:p", p, draw(uint64(100+s), 5000, p))), Options{}).Problems() {
			false1++
		}
	}
	lo, hi := stats.ClopperPearson(false1, runs, 0.999)
	if !(lo <= 0.01) || hi < 0 {
		t.Errorf("false findings %d of %d: interval [%.4f, %.4f] excludes α = 0.01 from below", false1, runs, lo, hi)
	}
	if false1 > 12 {
		t.Errorf("false findings %d of %d at α = 0.01", false1, runs)
	}
	alt := oneOff(p, 0.1)
	n := 1600 // stated power about 0.6: the rate must track it
	detected := 0
	var power float64
	for s := range runs {
		r := Analyze(dumpOf(true, port("ns/a:p", p, draw(uint64(1000+s), n, alt))), Options{})
		power = float64(r.Ports[0].Power)
		if r.Problems() {
			detected++
		}
	}
	t.Logf("false findings %d of %d at α = 0.01; detected %d of %d at a 10 %% one-off, n = %d, stated power %.3f", false1, runs, detected, runs, n, power)
	lo, hi = stats.ClopperPearson(detected, runs, 0.999)
	if !(lo <= power+0.02 && power-0.02 <= hi) {
		t.Errorf("detected %d of %d [%.3f, %.3f], stated power %.3f", detected, runs, lo, hi, power)
	}
}

func TestSkippedAndIgnored(t *testing.T) {
	sp := port("ns/web:http", fairCascade(2), nil)
	d := dumpOf(false, sp)
	d.Skipped = []Skipped{{Line: Line{File: "dump.txt", Line: 40, Text: "-A " + sp.Chain + " -m foo --bar"}, Reason: "unknown match foo"}}
	d.Ignored = []Ignored{{What: "table filter chain DOCKER", Lines: 12}}
	r := Analyze(d, Options{})
	f := has(r, LevelNote, KindSkippedRule)
	if f == nil || !strings.Contains(f.Message, "touches ns/web:http") || r.Problems() {
		t.Fatalf("%+v", r.Findings)
	}
	if has(r, LevelNote, "ignored") == nil {
		t.Error("ignored parts not said")
	}
}

func TestNotExactScheduler(t *testing.T) {
	sp := port("ns/web:http", []float64{0.5, 0.5}, []uint64{900, 100})
	sp.Scheduler, sp.Exact = "lc", false
	r := Analyze(&Dump{File: "x", Format: FormatIPVSAdm, Mode: "ipvs", Counters: true, Ports: []*ServicePort{sp}}, Options{})
	if r.Problems() || r.Ports[0].Verdict != "not tested" || has(r, LevelNote, KindNotTested) == nil {
		t.Fatalf("%+v", r.Findings)
	}
}

const apiScenario = `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata:
  name: api
cluster:
  serviceCIDR: 10.96.0.0/16
  podCIDR: 10.244.0.0/16
  nodeCIDRMaskSize: 24
  nodeNetwork: 192.168.0.0/24
  nodes:
    - name: node-1
      ip: 192.168.0.2
      podCIDR: 10.244.1.0/24
    - name: node-2
      ip: 192.168.0.3
      podCIDR: 10.244.2.0/24
objects:
  - apiVersion: v1
    kind: Service
    metadata: {name: web, namespace: ns}
    spec:
      clusterIP: 10.96.0.50
      sessionAffinity: ClientIP
      sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
      ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata:
      name: web-abc
      namespace: ns
      labels: {kubernetes.io/service-name: web}
    addressType: IPv4
    ports: [{name: http, protocol: TCP, port: 8080}]
    endpoints:
      - addresses: ["10.244.1.10"]
        nodeName: node-1
        conditions: {ready: true}
      - addresses: ["10.244.1.11"]
        nodeName: node-1
        conditions: {ready: false}
      - addresses: ["10.244.2.12"]
        nodeName: node-2
        conditions: {ready: true}
  - apiVersion: v1
    kind: Service
    metadata: {name: loc, namespace: ns}
    spec:
      clusterIP: 10.96.0.60
      internalTrafficPolicy: Local
      ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata:
      name: loc-abc
      namespace: ns
      labels: {kubernetes.io/service-name: loc}
    addressType: IPv4
    ports: [{name: http, protocol: TCP, port: 8080}]
    endpoints:
      - addresses: ["10.244.2.20"]
        nodeName: node-2
        conditions: {ready: true}
      - addresses: ["10.244.1.21"]
        nodeName: node-1
        conditions: {ready: false}
`

func TestAPIStaleMissingLocal(t *testing.T) {
	api := loadAPIText(t, apiScenario)
	// The rules list 10.244.1.10 (ready), .11 (not ready) and .13 (deleted);
	// 10.244.2.12 (ready) is missing. No comments: names come from the API.
	web := port("", fairCascade(3), nil)
	web.ClusterIP = netip.MustParseAddr("10.96.0.50")
	web.Endpoints[2].Addr = netip.MustParseAddrPort("10.244.1.13:8080")
	web.Affinity = &Affinity{Timeout: 10800 * time.Second, Mechanism: "recent"}
	loc := port("", nil, nil)
	loc.ClusterIP, loc.LocalOnly, loc.NoEndpoints = netip.MustParseAddr("10.96.0.60"), true, "DROP"
	loc.Evidence = []Line{{File: "dump.txt", Line: 3, Text: "-A KUBE-SERVICES -d 10.96.0.60/32 ... -j KUBE-SVL-X"}, {File: "dump.txt", Line: 4, Text: "-A KUBE-NODEPORTS -d 192.168.0.2/32 ..."}}
	d := dumpOf(false, web, loc)
	r := Analyze(d, Options{API: api})
	if r.Node != "node-1" || !strings.Contains(r.NodeHow, "InternalIP") {
		t.Errorf("node %q (%s)", r.Node, r.NodeHow)
	}
	if r.Ports[0].Name != "ns/web:http" || r.Ports[1].Name != "ns/loc:http" {
		t.Errorf("names %q %q", r.Ports[0].Name, r.Ports[1].Name)
	}
	var msgs []string
	for _, f := range r.Findings {
		if f.Level == LevelFinding {
			msgs = append(msgs, f.Kind+": "+f.Message)
		}
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{
		"stale-endpoint: endpoint 10.244.1.11:8080 is in the rules but not serving",
		"stale-endpoint: endpoint 10.244.1.13:8080 is in the rules but in no EndpointSlice of ns/web:http: stale (deleted)",
		"missing-endpoint: endpoint 10.244.2.12:8080 is ready in the API (EndpointSlice ns/web-abc)",
		"affinity-timeout-differs: the rules' affinity timeout is 3h0m0s, the Service's sessionAffinityConfig.clientIP.timeoutSeconds 10m0s",
		"no-local-endpoint: internalTrafficPolicy Local and no serving endpoint on node node-1",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("findings lack %q:\n%s", want, all)
		}
	}
	if len(msgs) != 5 {
		t.Errorf("want 5 findings, got:\n%s", all)
	}
	// Evidence points at the API file's lines.
	f := has(r, LevelFinding, KindMissing)
	if f.Evidence[0].File != api.File || f.Evidence[0].Line == 0 {
		t.Errorf("evidence %+v", f.Evidence)
	}
	// On node-2 the Local port should list 10.244.2.20; a rule sending it to
	// node-1's endpoint is local traffic to another node.
	loc.Endpoints = []*Endpoint{{Addr: netip.MustParseAddrPort("10.244.1.21:8080"), P: 1}}
	r = Analyze(d, Options{API: api, Node: "node-2"})
	if has(r, LevelFinding, KindLocalToRemote) == nil || has(r, LevelFinding, KindMissing) == nil {
		t.Errorf("node-2: %+v", kinds(r, LevelFinding))
	}
}

func TestAPIAllGood(t *testing.T) {
	api := loadAPIText(t, apiScenario)
	web := port("ns/web:http", fairCascade(2), nil)
	web.ClusterIP = netip.MustParseAddr("10.96.0.50")
	web.Endpoints[1].Addr = netip.MustParseAddrPort("10.244.2.12:8080")
	web.Affinity = &Affinity{Timeout: 600 * time.Second, Mechanism: "recent"}
	loc := port("ns/loc:http", []float64{1}, nil)
	loc.ClusterIP, loc.LocalOnly = netip.MustParseAddr("10.96.0.60"), true
	loc.Endpoints[0].Addr = netip.MustParseAddrPort("10.244.2.20:8080")
	r := Analyze(dumpOf(false, web, loc), Options{API: api, Node: "node-2"})
	if r.Problems() {
		t.Fatalf("%+v", kinds(r, LevelFinding))
	}
	// A stale Service: rules for a ClusterIP the API lacks.
	gone := port("ns/gone:http", fairCascade(2), nil)
	r = Analyze(dumpOf(false, web, loc, gone), Options{API: api, Node: "node-2"})
	if has(r, LevelFinding, KindStaleService) == nil {
		t.Errorf("%+v", kinds(r, LevelFinding))
	}
	// A missing Service: the API's web has no rules at all.
	r = Analyze(dumpOf(false, loc), Options{API: api, Node: "node-2"})
	if has(r, LevelFinding, KindMissingService) == nil {
		t.Errorf("%+v", kinds(r, LevelFinding))
	}
}

func TestOutputs(t *testing.T) {
	p := fairCascade(3)
	r := Analyze(dumpOf(true, port("ns/web:http", fairCascade(3), draw(2, 20000, stats.OneOffAlternative(3, 0.2))), port("ns/ok:http", p, draw(5, 9000, p))), Options{})
	var tb, js, md bytes.Buffer
	if err := r.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PORT", "ns/web:http  3          20000  skewed", "FINDINGS", "    dump.txt:10: -A KUBE-SVC-"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("json: %v", err)
	}
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| ns/web:http | 3 | 20000 | skewed |") {
		t.Errorf("markdown:\n%s", md.String())
	}
	dir := t.TempDir()
	if err := r.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	// Only the port with a finding gets a plot.
	if _, err := os.Stat(filepath.Join(dir, report.PlotName("diagnose", "ns/ok:http"))); err == nil {
		t.Error("a plot for a fair port")
	}
	for _, f := range []string{"report.json", "report.md", report.PlotName("diagnose", "ns/web:http")} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// A report with nothing computed still encodes (NaN as null).
	js.Reset()
	if err := Analyze(dumpOf(false, port("ns/x:p", fairCascade(2), nil)), Options{}).WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"p": null`) {
		t.Errorf("json without counters: %v\n%s", err, js.String())
	}
}

func TestIPVSQuiescedAndWeights(t *testing.T) {
	// Weights 2:1:1 and a quiesced server with old connections: kube-proxy
	// writes weight 1 (0 while draining), so unequal positive weights are a
	// rule-level finding, and the counts, which follow the weights, are
	// consistent with the rules as written.
	sp := port("ns/v:p", []float64{0.5, 0.25, 0.25, 0}, []uint64{5030, 2480, 2490, 7000})
	sp.Scheduler = "wrr"
	for i, w := range []int{2, 1, 1, 0} {
		sp.Endpoints[i].Weight = w
	}
	d := &Dump{File: "ipvs.txt", Format: FormatIPVSAdm, Mode: "ipvs", Counters: true, Ports: []*ServicePort{sp}}
	r := Analyze(d, Options{})
	if has(r, LevelFinding, KindUnequalRules) == nil || r.Ports[0].TestN != 10000 {
		t.Fatalf("verdict %s n %d: %+v", r.Ports[0].Verdict, r.Ports[0].TestN, r.Findings)
	}
	if got := r.Ports[0].Endpoints[0].Intended; math.Abs(got-1.0/3) > 1e-12 || r.Ports[0].Endpoints[3].Intended != 0 {
		t.Errorf("intended %v", got)
	}
	if p := float64(r.Ports[0].AgainstRules); !(p > 0.01) {
		t.Errorf("counts against the rules' own shares: p %v", p)
	}
	// Equal weights where the counts follow 2:1:1 are a skew the rules do not explain.
	for i := range 3 {
		sp.Endpoints[i].Weight, sp.Endpoints[i].P = 1, 1.0/3
	}
	r = Analyze(d, Options{})
	if has(r, LevelFinding, KindSkew) == nil || has(r, LevelFinding, KindUnequalRules) != nil {
		t.Fatalf("equal weights: %+v", r.Findings)
	}
	// Every server draining: graceful termination, not lost traffic.
	for i := range 4 {
		sp.Endpoints[i].Weight, sp.Endpoints[i].P = 0, 0
	}
	r = Analyze(d, Options{})
	if r.Problems() || has(r, LevelNote, KindGraceful) == nil {
		t.Fatalf("all draining: %+v", r.Findings)
	}
}

func TestClientsWithoutCounters(t *testing.T) {
	// nftables: no counters, but the affinity sets name the clients.
	sp := port("ns/aff:p", []float64{0.5, 0.5}, nil)
	sp.Scheduler = "numgen"
	sp.Affinity = &Affinity{Timeout: 3 * time.Hour, Mechanism: "set", ClientsKnown: true}
	for i, n := range []int{60, 20} {
		for j := range n {
			sp.Endpoints[i].Clients = append(sp.Endpoints[i].Clients, Client{Addr: netip.AddrFrom4([4]byte{10, 1, byte(i), byte(j)}), Expires: time.Hour})
		}
	}
	d := &Dump{File: "x.nft", Format: FormatNFT, Mode: "nftables", CountersWhy: "kube-proxy adds no counters in nftables mode", Ports: []*ServicePort{sp}}
	r := Analyze(d, Options{})
	if f := has(r, LevelFinding, KindSkew); f == nil || !strings.Contains(f.Message, "observed clients") || r.Ports[0].TestN != 80 {
		t.Fatalf("%+v", r.Findings)
	}
	if f := has(r, LevelNote, KindNoCounters); f == nil || !strings.Contains(f.Message, "kube-proxy adds no counters") {
		t.Errorf("%+v", r.Findings)
	}
	sp.Endpoints[1].Clients = append(sp.Endpoints[1].Clients, sp.Endpoints[0].Clients[:20]...)
	sp.Endpoints[0].Clients = sp.Endpoints[0].Clients[20:]
	if r := Analyze(d, Options{}); r.Problems() || r.Ports[0].Verdict != "fair" {
		t.Fatalf("even clients: %s %+v", r.Ports[0].Verdict, r.Findings)
	}
}

func TestLocalNoEndpointWithoutAPI(t *testing.T) {
	sp := port("ns/loc:p", nil, nil)
	sp.LocalOnly, sp.NoEndpoints = true, "DROP"
	r := Analyze(dumpOf(true, sp), Options{})
	if has(r, LevelFinding, KindNoLocal) == nil {
		t.Fatalf("%+v", r.Findings)
	}
	sp.LocalOnly = false
	sp.NoEndpoints = "REJECT"
	if r := Analyze(dumpOf(true, sp), Options{}); r.Problems() || has(r, LevelNote, "no-endpoints") == nil {
		t.Fatalf("%+v", r.Findings)
	}
}

// termAPI has two Services of one port on two nodes in zones a and b: t
// with a serving and a not-serving terminating endpoint (none ready), z
// with a ready endpoint per node, each hinted for its node's zone.
var termAPI = `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata:
  name: term
cluster:
  serviceCIDR: 10.96.0.0/16
  podCIDR: 10.244.0.0/16
  nodeCIDRMaskSize: 24
  nodes:
    - name: node-1
      zone: a
      podCIDR: 10.244.1.0/24
    - name: node-2
      zone: b
      podCIDR: 10.244.2.0/24
objects:
` + apiObjects("ns", []apiService{
	{"t", "10.96.0.70", []string{
		`{addresses: ["10.244.1.10"], nodeName: node-1, conditions: {ready: false, serving: true, terminating: true}}`,
		`{addresses: ["10.244.2.10"], nodeName: node-2, conditions: {ready: false, serving: false, terminating: true}}`,
	}},
	{"z", "10.96.0.80", []string{
		`{addresses: ["10.244.1.20"], nodeName: node-1, conditions: {ready: true}, hints: {forZones: [{name: a}]}}`,
		`{addresses: ["10.244.2.20"], nodeName: node-2, conditions: {ready: true}, hints: {forZones: [{name: b}]}}`,
	}},
})

// apiService is a Service of a test API with one TCP port http (80 to
// 8080) and its EndpointSlice <name>-1; each endpoint is a YAML flow
// mapping (addresses, nodeName, conditions, hints).
type apiService struct {
	name, clusterIP string
	endpoints       []string
}

// apiObjects prints services as items of a scenario's objects section.
func apiObjects(ns string, services []apiService) string {
	var b strings.Builder
	for _, s := range services {
		fmt.Fprintf(&b, `  - apiVersion: v1
    kind: Service
    metadata: {name: %[1]s, namespace: %[2]s}
    spec:
      clusterIP: %[3]s
      ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata:
      name: %[1]s-1
      namespace: %[2]s
      labels: {kubernetes.io/service-name: %[1]s}
    addressType: IPv4
    ports: [{name: http, protocol: TCP, port: 8080}]
    endpoints:
`, s.name, ns, s.clusterIP)
		for _, e := range s.endpoints {
			fmt.Fprintf(&b, "      - %s\n", e)
		}
	}
	return b.String()
}

// loadAPIText loads a test API from its scenario text.
func loadAPIText(t *testing.T, text string) *API {
	t.Helper()
	path := filepath.Join(t.TempDir(), "api.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	api, err := LoadAPI(path)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// TestTerminatingAndHints: serving-terminating endpoints are expected only
// when none is ready; zone hints narrow the set to the node's zone.
func TestTerminatingAndHints(t *testing.T) {
	api := loadAPIText(t, termAPI)
	term := port("", []float64{1}, nil)
	term.ClusterIP = netip.MustParseAddr("10.96.0.70")
	term.Endpoints[0].Addr = netip.MustParseAddrPort("10.244.1.10:8080")
	z := port("", []float64{1}, nil)
	z.ClusterIP = netip.MustParseAddr("10.96.0.80")
	z.Endpoints[0].Addr = netip.MustParseAddrPort("10.244.1.20:8080")
	r := Analyze(dumpOf(false, term, z), Options{API: api, Node: "node-1"})
	if r.Problems() {
		t.Fatalf("%+v", r.Findings)
	}
	// The not-serving terminating endpoint in the rules is stale; on
	// node-2 (zone b) the zone-a endpoint is outside the hints and the
	// zone-b one is missing.
	term.Endpoints[0].P = 0.5
	term.Endpoints = append(term.Endpoints, &Endpoint{Addr: netip.MustParseAddrPort("10.244.2.10:8080"), P: 0.5})
	r = Analyze(dumpOf(false, term, z), Options{API: api, Node: "node-2"})
	var got []string
	for _, f := range r.Findings {
		if f.Level == LevelFinding {
			got = append(got, f.Message)
		}
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		"endpoint 10.244.2.10:8080 is in the rules but not serving",
		"endpoint 10.244.1.20:8080 is outside zone b's topology hints",
		"endpoint 10.244.2.20:8080 is ready in the API",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("lacks %q:\n%s", want, all)
		}
	}
	if len(got) != 3 {
		t.Errorf("want 3 findings:\n%s", all)
	}
}

func TestInferNodeFromPodCIDR(t *testing.T) {
	api := loadAPIText(t, termAPI)
	loc := port("ns/z:http", []float64{1}, nil)
	loc.ClusterIP, loc.LocalOnly = netip.MustParseAddr("10.96.0.80"), true
	loc.Endpoints[0].Addr = netip.MustParseAddrPort("10.244.2.20:8080")
	r := Analyze(dumpOf(false, loc), Options{API: api})
	if r.Node != "node-2" || !strings.Contains(r.NodeHow, "podCIDR") {
		t.Fatalf("node %q %q", r.Node, r.NodeHow)
	}
	// A port without Local policy or hints needs no node: no note.
	r = Analyze(dumpOf(false, port("ns/z:http", []float64{1}, nil)), Options{API: api})
	if r.Node != "" || has(r, LevelNote, KindNodeUnknown) != nil {
		t.Fatalf("node %q %+v", r.Node, r.Findings)
	}
	// A Local-only port whose endpoint is in no node's block: the note asks for --node.
	loc.Endpoints[0].Addr = netip.MustParseAddrPort("10.99.0.1:8080")
	r = Analyze(dumpOf(false, loc), Options{API: api})
	if f := has(r, LevelNote, KindNodeUnknown); r.Node != "" || f == nil || !strings.Contains(f.Message, "of ns/z:http") {
		t.Fatalf("node %q %+v", r.Node, r.Findings)
	}
}

const nodePortAPI = `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata:
  name: np
cluster:
  serviceCIDR: 10.96.0.0/16
  podCIDR: 10.244.0.0/16
  nodeCIDRMaskSize: 24
  nodeNetwork: 192.168.0.0/24
  nodes:
    - name: node-1
      ip: 192.168.0.2
      podCIDR: 10.244.1.0/24
    - name: node-2
      ip: 192.168.0.3
      podCIDR: 10.244.2.0/24
objects:
  - apiVersion: v1
    kind: Service
    metadata: {name: np, namespace: ns}
    spec:
      type: NodePort
      clusterIP: 10.96.0.90
      externalTrafficPolicy: Local
      ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}]
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata:
      name: np-1
      namespace: ns
      labels: {kubernetes.io/service-name: np}
    addressType: IPv4
    ports: [{name: http, protocol: TCP, port: 8080}]
    endpoints:
      - addresses: ["10.244.1.30"]
        nodeName: node-1
        conditions: {ready: true}
      - addresses: ["10.244.2.30"]
        nodeName: node-2
        conditions: {ready: true}
`

// TestNodePortVirtualServer: IPVS writes a virtual server per node address
// and NodePort; it is matched to its Service by NodePort, checked against
// externalTrafficPolicy, and names the node.
func TestNodePortVirtualServer(t *testing.T) {
	api := loadAPIText(t, nodePortAPI)
	mk := func(ip string, port int, local bool, eps ...string) *ServicePort {
		sp := &ServicePort{ClusterIP: netip.MustParseAddr(ip), Port: port, Protocol: "tcp", Scheduler: "rr", Exact: true, LocalOnly: local}
		for _, e := range eps {
			sp.Endpoints = append(sp.Endpoints, &Endpoint{Addr: netip.MustParseAddrPort(e), P: 1 / float64(len(eps)), Weight: 1})
		}
		return sp
	}
	cip := mk("10.96.0.90", 80, false, "10.244.1.30:8080", "10.244.2.30:8080")
	np := mk("192.168.0.3", 30080, true, "10.244.2.30:8080")
	d := &Dump{File: "ipvs.txt", Format: FormatIPVSAdm, Mode: "ipvs", Ports: []*ServicePort{cip, np}}
	r := Analyze(d, Options{API: api})
	if r.Problems() || r.Node != "node-2" || r.Ports[1].Label() != "ns/np:http via node port 192.168.0.3:30080" {
		t.Fatalf("node %q name %q %+v", r.Node, r.Ports[1].Label(), kinds(r, LevelFinding))
	}
	// The NodePort sending to node-1's endpoint breaks externalTrafficPolicy Local.
	np.Endpoints[0].Addr = netip.MustParseAddrPort("10.244.1.30:8080")
	r = Analyze(d, Options{API: api})
	if f := has(r, LevelFinding, KindLocalToRemote); f == nil || !strings.Contains(f.Message, "externalTrafficPolicy Local") {
		t.Fatalf("%+v", kinds(r, LevelFinding))
	}
}

func TestAffinityWithoutTimeout(t *testing.T) {
	sp := port("ns/aff:p", fairCascade(2), nil)
	sp.Affinity = &Affinity{Mechanism: "recent", Evidence: Line{File: "dump.txt", Line: 9, Text: "-m recent --rcheck --reap --name KUBE-SEP-X"}}
	r := Analyze(dumpOf(false, sp), Options{})
	if f := has(r, LevelFinding, KindAffinityForever); f == nil || f.Evidence[0].Line != 9 {
		t.Fatalf("%+v", r.Findings)
	}
	sp.Affinity.Timeout = time.Hour
	if r := Analyze(dumpOf(false, sp), Options{}); r.Problems() {
		t.Fatalf("%+v", kinds(r, LevelFinding))
	}
}

func TestIdlePortsAndAbout(t *testing.T) {
	p := fairCascade(2)
	idle1, idle2 := port("ns/a:p", p, []uint64{0, 0}), port("ns/b:p", p, []uint64{0, 0})
	busy := port("ns/c:p", p, draw(7, 4000, p))
	r := Analyze(dumpOf(true, idle1, busy, idle2), Options{})
	f := has(r, LevelNote, KindTooFew)
	if r.Problems() || f == nil || f.Port != "" || !strings.Contains(f.Message, "2 port(s) counted no new connection") || r.Ports[0].Verdict != "no traffic" || r.Tested != 1 {
		t.Fatalf("%+v %s", f, r.Ports[0].Verdict)
	}
	// Every finding says what it is about.
	sp := port("ns/loc:p", nil, nil)
	sp.LocalOnly = true
	r = Analyze(dumpOf(true, sp, port("ns/u:p", uniformFault(3), draw(8, 9000, uniformFault(3)))), Options{})
	for _, f := range r.Findings {
		want := map[string]string{KindNoLocal: AboutCluster, KindUnequalRules: AboutRules}[f.Kind]
		if f.Level == LevelFinding && f.About != want {
			t.Errorf("%s: about %q, want %q", f.Kind, f.About, want)
		}
		if f.Level != LevelFinding && f.About != "" {
			t.Errorf("%s %s: about %q", f.Level, f.Kind, f.About)
		}
	}
}

func TestIPVSOneActiveServer(t *testing.T) {
	sp := port("ns/dns:53", []float64{1, 0}, []uint64{101, 0})
	sp.Scheduler, sp.Endpoints[0].Weight = "rr", 1
	r := Analyze(&Dump{File: "ipvs.txt", Format: FormatIPVSAdm, Mode: "ipvs", Counters: true, Ports: []*ServicePort{sp}}, Options{})
	if r.Problems() || r.Ports[0].Verdict != "single endpoint" || has(r, LevelNote, KindTooFew) != nil {
		t.Fatalf("%s %+v", r.Ports[0].Verdict, r.Findings)
	}
}

func TestManyEndpointsReadable(t *testing.T) {
	sp := port("ns/wide:p", uniformFault(20), nil)
	inline := Line{File: "x.nft", Line: 7, Text: "dnat ip to numgen random mod 20 map { ... }"}
	for _, e := range sp.Endpoints {
		e.Evidence = inline
	}
	r := Analyze(dumpOf(false, sp), Options{})
	f := has(r, LevelFinding, KindUnequalRules)
	if f == nil || len(f.Evidence) != 2 || !strings.Contains(f.Message, "… 12 more") {
		t.Fatalf("%+v", f)
	}
	var b bytes.Buffer
	sp.Endpoints[0].Evidence.Line = 1
	for i, e := range sp.Endpoints {
		e.Evidence = Line{File: "x", Line: 100 + i, Text: "rule"}
	}
	if err := Analyze(dumpOf(false, sp), Options{}).WriteTable(&b); err != nil || !strings.Contains(b.String(), "… 13 more lines") {
		t.Fatalf("%v\n%s", err, b.String())
	}
}
