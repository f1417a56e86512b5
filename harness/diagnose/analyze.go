package diagnose

// The analysis: what a node's dump says about each service port's split,
// in plain words, with the lines that show it. It reads only the model
// (model.go), never rule text, and the API objects (api.go).
//
//	Dump (+ Before) ──► per port: endpoints, P (rules), intended split, observed (deltas)
//	                     │  rule-level: P against the intended split (beyond the kernel's quantisation)
//	                     │  counters:   Pearson chi-square of observed against intended (the verdict),
//	                     │              G beside it; Holm over the dump's tested ports at Alpha;
//	                     │              power at a 10 % one-off; simultaneous intervals
//	                     │  affinity:   fresh choices tested instead of connections; clients
//	                     │  API:        names, stale / missing endpoints, Local policy, timeouts
//	                     ▼
//	                   Report: ports, findings (exit 1), explanations and notes (not findings)

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kpsim/kpsim/harness/stats"
)

// Options of an analysis.
type Options struct {
	// Alpha is the family-wise level of the dump's tests, controlled with
	// Holm over every tested port (DefaultAlpha when 0).
	Alpha float64
	// Before is an earlier dump of the same node in the same format: the
	// counts are then the deltas (see Analyze for counters that went down).
	Before *Dump
	// API is the cluster's objects (LoadAPI); nil when not given.
	API *API
	// Node is the node the dump was taken on; "" to infer it from the API.
	Node string
	// MDE is the relative deviation of one share the power statement is
	// about (DefaultMDE when 0).
	MDE float64
	// Conntrack is the node's conntrack table (ReadConntrack), taken with
	// the dump; nil when not given.
	Conntrack *Conntrack
	// Peers are other nodes' dumps of the same cluster, in the same
	// format and taken at about the same time: under externalTrafficPolicy
	// Local each pod's count is held against its node's share
	// (placement.go).
	Peers []Peer
}

// Peer is another node's dump.
type Peer struct {
	// Node names it; "" to infer it from the API, else the file's name.
	Node string
	Dump *Dump
}

// Defaults of an analysis.
const (
	DefaultAlpha = 0.01
	DefaultMDE   = 0.10
	// XtRecentListTot is xt_recent's default ip_list_tot: each endpoint's
	// recent list remembers at most this many clients, the oldest entry is
	// dropped for a new one.
	XtRecentListTot = 100
	// VerdictTest names the test whose p-value decides a port's verdict.
	VerdictTest = "chi-square"
)

// quantTol is how far a rule's probability may be from the intended share
// and still be the same split: the kernel stores a cascade probability as
// a 31-bit fraction (iptables prints it with 11 decimals, 0.33333333349),
// so k chained rules move a share by at most about k·2⁻³¹. 1e-6 is far
// above that and far below any split that matters.
func quantTol(k int) float64 { return 1e-6 + float64(k)*math.Ldexp(1, -30) }

// Report is what Analyze says about one dump.
type Report struct {
	File        string        `json:"file"`
	Format      Format        `json:"format"`
	Mode        string        `json:"mode"`
	Before      string        `json:"before,omitempty"`
	API         string        `json:"api,omitempty"`
	Node        string        `json:"node,omitempty"`
	NodeHow     string        `json:"nodeHow,omitempty"`
	Counters    bool          `json:"counters"`
	Alpha       float64       `json:"alpha"`
	MDE         float64       `json:"mde"`
	Test        string        `json:"test"`
	Tested      int           `json:"tested"`
	Ports       []*PortReport `json:"ports"`
	Findings    []*Finding    `json:"findings"`
	Ignored     []Ignored     `json:"ignored,omitempty"`
	Skipped     []Skipped     `json:"skipped,omitempty"`
	Interval    time.Duration `json:"interval,omitempty"`
	CountsSince string        `json:"countsSince"`
	// Conntrack is the analysis of the node's conntrack table
	// (Options.Conntrack), nil without one.
	Conntrack *ConntrackReport `json:"conntrack,omitempty"`
	// External is each service port's traffic from outside the cluster
	// (external.go); Placement, under externalTrafficPolicy Local, each
	// pod's share against what its node's share predicts, over this node
	// and the Peers (placement.go).
	External  []*ExternalReport  `json:"external,omitempty"`
	Placement []*PlacementReport `json:"placement,omitempty"`
	Peers     []string           `json:"peers,omitempty"`

	api      *API
	apiCache map[string]*apiPort // api.ports(), made on first use
	idle     []string            // ports with nothing counted
	zone     string
	// peerSplits and peerExternal are the peers' Local external splits
	// and reports: their tests join this report's Holm family.
	peerSplits   []*PortReport
	peerExternal []*ExternalReport
}

// Level says whether a finding makes the dump abnormal.
type Level string

const (
	// LevelFinding is something wrong: exit 1.
	LevelFinding Level = "finding"
	// LevelExplanation clears what would otherwise look wrong (affinity
	// with few clients): reported, not a finding.
	LevelExplanation Level = "explanation"
	// LevelNote is what the dump cannot show or what was left out.
	LevelNote Level = "note"
)

// Finding kinds.
const (
	KindUnequalRules     = "unequal-rule-shares"
	KindRulesLoseTraffic = "rules-lose-traffic"
	KindSkew             = "skew"
	KindStarved          = "endpoint-received-nothing"
	KindAffinity         = "affinity-explains-skew"
	KindXtRecentLimit    = "xt-recent-limit"
	KindCountersLimit    = "counters-cannot-show"
	KindNoCounters       = "no-counters"
	KindCountersReset    = "counters-reset"
	KindSkippedRule      = "skipped-construct"
	KindNotTested        = "not-tested"
	KindTooFew           = "too-few-connections"
	KindStale            = "stale-endpoint"
	KindMissing          = "missing-endpoint"
	KindStaleService     = "stale-service"
	KindMissingService   = "missing-service"
	KindNoLocal          = "no-local-endpoint"
	KindLocalToRemote    = "local-traffic-to-other-node"
	KindLocalIgnored     = "local-policy-not-applied"
	KindAffinityTimeout  = "affinity-timeout-differs"
	KindAffinityForever  = "affinity-without-timeout"
	KindAffinityMissing  = "affinity-differs"
	KindNodeUnknown      = "node-unknown"
	KindGraceful         = "graceful-termination"
	KindAPIIncomplete    = "api-incomplete"
)

// What a finding is about.
const (
	// AboutRules: the rules are not what kube-proxy should have written
	// (unequal shares, stale or missing endpoints, policies or affinity
	// not applied): a dataplane fault or a kube-proxy that lags the API.
	AboutRules = "rules"
	// AboutTraffic: the rules are right but the counters are not what
	// they imply (a skew, an endpoint that got nothing, xt_recent's list
	// overflowing).
	AboutTraffic = "traffic"
	// AboutCluster: the rules do what the API says, and what the API says
	// leaves this node's traffic without a backend (internalTrafficPolicy
	// Local without a local endpoint).
	AboutCluster = "cluster"
)

var aboutOf = map[string]string{
	KindUnequalRules: AboutRules, KindRulesLoseTraffic: AboutRules, KindStale: AboutRules, KindMissing: AboutRules,
	KindStaleService: AboutRules, KindMissingService: AboutRules, KindLocalToRemote: AboutRules, KindLocalIgnored: AboutRules,
	KindAffinityTimeout: AboutRules, KindAffinityMissing: AboutRules, KindAffinityForever: AboutRules,
	KindSkew: AboutTraffic, KindStarved: AboutTraffic, KindXtRecentLimit: AboutTraffic,
	KindNoLocal: AboutCluster,
}

// Finding is one statement about the dump, with its evidence.
type Finding struct {
	Level Level  `json:"level"`
	Kind  string `json:"kind"`
	// About says whether a finding is about the rules, the traffic or the
	// cluster's state (AboutRules, AboutTraffic, AboutCluster); "" for
	// explanations and notes.
	About    string `json:"about,omitempty"`
	Port     string `json:"port,omitempty"`
	Message  string `json:"message"`
	Evidence []Line `json:"evidence,omitempty"`
}

// PortReport is one service port's analysis.
type PortReport struct {
	Name string `json:"name"`
	// Via names the external destination a port's own address is (see
	// Label), "" for a cluster IP.
	Via       string            `json:"via,omitempty"`
	Key       string            `json:"key"` // ClusterIP:port/protocol
	Chain     string            `json:"chain"`
	Scheduler string            `json:"scheduler"`
	LocalOnly bool              `json:"localOnly,omitempty"`
	Affinity  string            `json:"affinity,omitempty"`
	Endpoints []*EndpointReport `json:"endpoints"`
	// RulesFair reports that the rules' P equals the intended split within
	// the kernel's quantisation.
	RulesFair bool `json:"rulesFair"`
	// N is the number of new connections counted (the deltas with Before).
	N uint64 `json:"n"`
	// Tested names what the verdict tested: "connections", "fresh choices"
	// (affinity with the split known), "clients", or "" (no test).
	Tested string `json:"tested,omitempty"`
	// TestN is the count the test used (N, the fresh choices or clients).
	TestN uint64 `json:"testN,omitempty"`
	// Verdict: "fair", "skewed", "explained", "rules unequal",
	// "no verdict", "no counters", "not tested".
	Verdict string `json:"verdict"`
	// Chi and G are the tests of the tested counts against the intended
	// split; P is the verdict's p-value (Chi's), Adjusted Holm's.
	Chi      *stats.Result `json:"chiSquare,omitempty"`
	G        *stats.Result `json:"g,omitempty"`
	P        Float         `json:"p"`
	Adjusted Float         `json:"holmAdjustedP"`
	Rejected bool          `json:"rejected"`
	// AgainstRules is the p-value of the tested counts against the rules'
	// own P when that differs from the intended split (does the kernel do
	// what the rules say?), NaN otherwise.
	AgainstRules Float `json:"pAgainstRules"`
	// Power is the probability that a share off by MDE (relative, on the
	// smallest share) would be detected at this n, at Holm's first step.
	Power Float `json:"power"`
	// Need is the count that reaches power 0.99 at that effect, and
	// NeedForTest the count below which no verdict is given.
	Need        int    `json:"need"`
	NeedForTest int    `json:"needForTest"`
	Statement   string `json:"statement,omitempty"`
	Evidence    []Line `json:"evidence,omitempty"`

	port      *ServicePort
	oneActive bool
	// external marks an external split (external.go); rulesOnly one
	// whose rules are read but whose counts are not its own.
	external, rulesOnly bool
	// onNode names a peer's node for its ports that join this report.
	onNode string
}

// counted reports whether the port's counts are its own counters'.
func (pr *PortReport) counted(r *Report) bool { return r.Counters && !pr.rulesOnly }

// EndpointReport is one endpoint of a port.
type EndpointReport struct {
	Addr     netip.AddrPort `json:"addr"`
	Chain    string         `json:"chain,omitempty"`
	P        float64        `json:"p"`
	Intended float64        `json:"intended"`
	Observed uint64         `json:"observed"`
	Fresh    uint64         `json:"fresh,omitempty"`
	Sticky   uint64         `json:"sticky,omitempty"`
	Clients  int            `json:"clients,omitempty"`
	Expected float64        `json:"expected"`
	Share    float64        `json:"share"`
	Lo       Float          `json:"lo"`
	Hi       Float          `json:"hi"`
	Evidence Line           `json:"evidence"`
}

// Float is a number that encodes NaN (not computed) as JSON null.
type Float float64

var nan = Float(math.NaN())

// MarshalJSON encodes NaN and infinities as null.
func (f Float) MarshalJSON() ([]byte, error) {
	x := float64(f)
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(x)
}

// Valid reports whether the number was computed.
func (f Float) Valid() bool { return !math.IsNaN(float64(f)) }

// Problems reports whether the report holds a finding (exit 1).
func (r *Report) Problems() bool {
	for _, f := range r.Findings {
		if f.Level == LevelFinding {
			return true
		}
	}
	return false
}

// Key is a port's identity across dumps and the API: ClusterIP:port/protocol.
func Key(addr netip.Addr, port int, proto string) string {
	return netip.AddrPortFrom(addr, uint16(port)).String() + "/" + strings.ToLower(proto)
}

// Analyze reads a dump (and, in opt, an earlier dump and the API) and says
// whether each port's split is normal.
//
// With Before, the counts are after minus before per port and endpoint;
// an endpoint new in the later dump counts from zero. If any counter of a
// port went down, the rules were rewritten or the counters reset between
// the dumps: that port uses the later dump's counts alone (counted since
// the reset, still a valid sample of the current rules) and a note says
// so.
//
// The verdict of a port is Pearson's chi-square of the tested counts
// against the intended split (uniform over the endpoints the rules list;
// IPVS by weight), with G reported beside it; Holm over the dump's tested
// ports at Alpha decides. A port is tested only when every endpoint's
// expected count reaches stats.MinExpected.
func Analyze(d *Dump, opt Options) *Report {
	if opt.Alpha <= 0 || opt.Alpha >= 1 {
		opt.Alpha = DefaultAlpha
	}
	if opt.MDE <= 0 {
		opt.MDE = DefaultMDE
	}
	r := &Report{File: d.File, Format: d.Format, Mode: d.Mode, Counters: d.Counters, Alpha: opt.Alpha, MDE: opt.MDE,
		Test: VerdictTest, Ignored: d.Ignored, Skipped: d.Skipped, Findings: []*Finding{}, CountsSince: "the rules were written or the counters last zeroed"}
	if opt.Before != nil {
		r.Before = opt.Before.File
		r.CountsSince = "the earlier dump " + opt.Before.File
		if !d.Captured.IsZero() && !opt.Before.Captured.IsZero() && d.Captured.After(opt.Before.Captured) {
			r.Interval = d.Captured.Sub(opt.Before.Captured)
		}
	}
	before := map[string]*ServicePort{}
	if opt.Before != nil {
		for _, p := range opt.Before.Ports {
			before[spKey(p)] = p
		}
	}
	for _, p := range d.Ports {
		pr := newPortReport(p)
		if xp := p.External; xp != nil && xp.Chain != "" && xp.Chain == p.Chain {
			pr.Via = "external address " + destWords(p.ClusterIP, p.Port)
			if r.firewalled(p) {
				pr.Via = "load-balancer IP " + destWords(p.ClusterIP, p.Port)
			}
		}
		r.Ports = append(r.Ports, pr)
	}
	if opt.API != nil {
		// First: it names the ports every later finding refers to.
		r.API, r.api = opt.API.File, opt.API
		checkAPI(r, d, opt)
	} else if opt.Node != "" {
		r.Node, r.NodeHow = opt.Node, "given with --node"
	}
	r.externals(d, opt.Before)
	r.peers(opt)
	r.externalAPI(d, r.zone)
	for _, pr := range r.Ports {
		if bp := before[pr.Key]; opt.Before != nil && d.Counters {
			if reset := applyDelta(pr, bp); reset != "" {
				r.add(LevelNote, KindCountersReset, pr, reset, pr.Evidence...)
			}
		}
	}
	for _, pr := range r.tests() {
		r.rules(pr)
	}
	r.test(opt)
	r.externalVerdicts()
	r.placement()
	if opt.Conntrack != nil {
		r.analyzeConntrack(opt.Conntrack)
	}
	r.limits(d)
	return r
}

func spKey(p *ServicePort) string { return Key(p.ClusterIP, p.Port, p.Protocol) }

// Label is how a port is named in the report: its name, else its key;
// a port whose own address is an external destination (nftables external
// and load-balancer IPs, IPVS virtual servers on them or on node ports)
// says which ("demo/web:http via load-balancer IP 192.0.2.130:80").
func (p *PortReport) Label() string {
	l := p.Name
	if l == "" {
		l = p.Key
	}
	if p.Via != "" {
		l += " via " + p.Via
	}
	if p.onNode != "" {
		l += " on " + p.onNode
	}
	return l
}

func newPortReport(p *ServicePort) *PortReport {
	pr := &PortReport{Name: p.Name, Key: spKey(p), Chain: p.Chain, Scheduler: p.Scheduler, LocalOnly: p.LocalOnly,
		Evidence: p.Evidence, port: p, AgainstRules: nan, P: nan, Adjusted: nan, Power: nan}
	if p.Affinity != nil {
		pr.Affinity = fmt.Sprintf("ClientIP %s (%s)", p.Affinity.Timeout, p.Affinity.Mechanism)
	}
	intended := intendedSplit(p)
	for i, e := range p.Endpoints {
		pe := e.P
		if !(pe >= 0 && pe <= 1) {
			pe = 0 // not a probability (NaN, negative): no share
		}
		er := &EndpointReport{Addr: e.Addr, Chain: e.Chain, P: pe, Lo: nan, Hi: nan, Intended: intended[i], Observed: e.Observed,
			Fresh: e.Fresh, Sticky: e.Sticky, Clients: len(e.Clients), Evidence: e.Evidence}
		pr.Endpoints = append(pr.Endpoints, er)
	}
	return pr
}

// intendedSplit is what kube-proxy means by the rules it wrote: every
// endpoint the rules list gets the same share, except in IPVS, where each
// real server gets its weight's share (weight 0: quiesced, no new
// connection).
func intendedSplit(p *ServicePort) []float64 {
	k := len(p.Endpoints)
	out := make([]float64, k)
	if k == 0 {
		return out
	}
	if isIPVS(p) {
		// kube-proxy writes weight 1 for every endpoint it uses and 0
		// only while one drains: what it means is an even split over the
		// real servers of positive weight, whatever weights the dump has.
		active := 0
		for _, e := range p.Endpoints {
			if e.Weight > 0 {
				active++
			}
		}
		for i, e := range p.Endpoints {
			if e.Weight > 0 {
				out[i] = 1 / float64(active)
			}
		}
		return out
	}
	for i := range out {
		out[i] = 1 / float64(k)
	}
	return out
}

// allQuiesced reports that no real server of the port has a positive weight.
func allQuiesced(pr *PortReport) bool {
	for _, e := range pr.Endpoints {
		if e.Intended > 0 {
			return false
		}
	}
	return true
}

func isIPVS(p *ServicePort) bool { return p.Scheduler != "cascade" && p.Scheduler != "numgen" }

// applyDelta turns the port's counts into after minus before. It returns a
// note when a counter went down (the later dump's counts are kept).
func applyDelta(pr *PortReport, bp *ServicePort) string {
	if bp == nil {
		return ""
	}
	prev := map[netip.AddrPort]*Endpoint{}
	for _, e := range bp.Endpoints {
		prev[e.Addr] = e
	}
	var down []string
	for _, er := range pr.Endpoints {
		b := prev[er.Addr]
		if b == nil {
			continue
		}
		if er.Observed < b.Observed || er.Fresh < b.Fresh || er.Sticky < b.Sticky {
			down = append(down, fmt.Sprintf("%s %d -> %d", er.Addr, b.Observed, er.Observed))
		}
	}
	if len(down) > 0 {
		return fmt.Sprintf("counters went down between the dumps (%s): the rules were rewritten or the counters reset; this port uses the later dump's counts alone, counted since then", strings.Join(down, ", "))
	}
	for _, er := range pr.Endpoints {
		if b := prev[er.Addr]; b != nil {
			er.Observed -= b.Observed
			er.Fresh -= b.Fresh
			er.Sticky -= b.Sticky
		}
	}
	return ""
}

func (r *Report) add(l Level, kind string, pr *PortReport, msg string, ev ...Line) *Finding {
	f := &Finding{Level: l, Kind: kind, Message: msg}
	seen := map[Line]bool{}
	for _, e := range ev {
		if !seen[e] { // inline maps give every endpoint the same line
			seen[e] = true
			f.Evidence = append(f.Evidence, e)
		}
	}
	if l == LevelFinding {
		f.About = aboutOf[kind]
	}
	if pr != nil {
		f.Port = pr.Label()
	}
	r.Findings = append(r.Findings, f)
	return f
}

func endpointLines(pr *PortReport) []Line {
	var out []Line
	for _, e := range pr.Endpoints {
		if e.Evidence.Line > 0 {
			out = append(out, e.Evidence)
		}
	}
	return out
}

// rules compares the rules' probabilities with the intended split, and
// checks that affinity has a timeout (kube-proxy always writes one).
func (r *Report) rules(pr *PortReport) {
	k := len(pr.Endpoints)
	pr.RulesFair = true
	if a := pr.port.Affinity; a != nil && a.Timeout <= 0 {
		r.add(LevelFinding, KindAffinityForever, pr, "ClientIP affinity is written without a timeout: a client stays with its endpoint for as long as the kernel remembers it (kube-proxy always writes sessionAffinityConfig.clientIP.timeoutSeconds, default 10800 s)", a.Evidence)
	}
	if k == 0 {
		return
	}
	if !pr.port.Exact {
		return
	}
	if isIPVS(pr.port) && allQuiesced(pr) {
		r.add(LevelNote, KindGraceful, pr, "every real server has weight 0: kube-proxy's IPVS graceful termination keeps them for their open connections while no endpoint serves; a new connection finds no destination", endpointLines(pr)...)
		return
	}
	var sum, worst float64
	wi := 0
	for i, e := range pr.Endpoints {
		sum += e.P
		if d := math.Abs(e.P - e.Intended); d > worst {
			worst, wi = d, i
		}
	}
	tol := quantTol(k)
	if 1-sum > tol {
		pr.RulesFair = false
		r.add(LevelFinding, KindRulesLoseTraffic, pr,
			fmt.Sprintf("the rules send only %.6g of new connections to an endpoint: %.6g match no endpoint rule", sum, 1-sum),
			append(slices.Clone(pr.Evidence), endpointLines(pr)...)...)
	}
	if worst <= tol {
		return
	}
	pr.RulesFair = false
	var parts []string
	for _, e := range pr.Endpoints {
		parts = append(parts, fmt.Sprintf("%s %.4f", e.Addr, e.P))
	}
	parts = capList(parts)
	e := pr.Endpoints[wi]
	r.add(LevelFinding, KindUnequalRules, pr,
		fmt.Sprintf("the rules give unequal shares: %s, where kube-proxy means %.4f each (%s); %s gets %.4f instead of %.4f",
			strings.Join(parts, ", "), e.Intended, intendedWords(pr), e.Addr, e.P, e.Intended),
		append(slices.Clone(pr.Evidence), endpointLines(pr)...)...)
}

func intendedWords(pr *PortReport) string {
	if isIPVS(pr.port) {
		return "1/k over the real servers of positive weight: kube-proxy writes weight 1, and 0 only while a server drains"
	}
	return fmt.Sprintf("1/%d over the %d endpoints the rules list", len(pr.Endpoints), len(pr.Endpoints))
}

// test runs the per-port tests, Holm over the dump, power and intervals.
func (r *Report) test(opt Options) {
	var cands []*PortReport
	all := r.tests()
	for _, pr := range all {
		if r.prepare(pr) {
			cands = append(cands, pr)
		}
	}
	r.Tested = len(cands)
	m := max(len(cands), 1)
	ps := make([]float64, len(cands))
	for i, pr := range cands {
		ps[i] = float64(pr.P)
	}
	rej := stats.Holm(ps, opt.Alpha)
	adj := stats.HolmAdjusted(ps)
	level := opt.Alpha / float64(m)
	for i, pr := range cands {
		pr.Rejected, pr.Adjusted = rej[i], Float(adj[i])
	}
	for _, pr := range all {
		r.power(pr, level, opt.MDE)
		r.judge(pr, level)
	}
}

// tests are the splits the report tests: its ports, then the external
// splits of their own (this node's and the peers').
func (r *Report) tests() []*PortReport { return append(slices.Clone(r.Ports), r.splits()...) }

// tested returns the counts a port's test uses and what they are.
func tested(pr *PortReport) (counts []float64, what string) {
	p := pr.port
	counts = make([]float64, len(pr.Endpoints))
	switch {
	case p.Affinity != nil && p.SplitKnown:
		for i, e := range pr.Endpoints {
			counts[i] = float64(e.Fresh)
		}
		return counts, "fresh choices"
	case p.Affinity != nil && p.Affinity.ClientsKnown:
		for i, e := range pr.Endpoints {
			counts[i] = float64(e.Clients)
		}
		return counts, "clients"
	case p.Affinity != nil:
		return nil, ""
	}
	for i, e := range pr.Endpoints {
		counts[i] = float64(e.Observed)
	}
	return counts, "connections"
}

func sum64(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

func intendedOf(pr *PortReport) []float64 {
	out := make([]float64, len(pr.Endpoints))
	for i, e := range pr.Endpoints {
		out[i] = e.Intended
	}
	return out
}

func rulesP(pr *PortReport) []float64 {
	out := make([]float64, len(pr.Endpoints))
	var s float64
	for i, e := range pr.Endpoints {
		out[i] = e.P
		s += e.P
	}
	if s > 0 {
		for i := range out {
			out[i] /= s
		}
	}
	return out
}

// minPositive is the smallest positive share.
func minPositive(p []float64) float64 {
	m := math.Inf(1)
	for _, x := range p {
		if x > 0 && x < m {
			m = x
		}
	}
	return m
}

// prepare fills a port's counts, expected values and intervals and runs
// its tests; it reports whether the port takes part in Holm.
func (r *Report) prepare(pr *PortReport) bool {
	for _, e := range pr.Endpoints {
		pr.N += e.Observed
	}
	if len(pr.Endpoints) == 0 {
		return false
	}
	if pr.counted(r) {
		n := float64(pr.N)
		for _, e := range pr.Endpoints {
			e.Expected = n * e.Intended
			if pr.N > 0 {
				e.Share = float64(e.Observed) / n
			}
		}
		if pr.N > 0 {
			obs := make([]float64, len(pr.Endpoints))
			for i, e := range pr.Endpoints {
				obs[i] = float64(e.Observed)
			}
			lo, hi := stats.SimultaneousIntervals(obs, 1-r.Alpha)
			for i, e := range pr.Endpoints {
				e.Lo, e.Hi = Float(lo[i]), Float(hi[i])
			}
		}
	}
	if !pr.port.Exact || len(pr.Endpoints) < 2 {
		return false
	}
	counts, intended, what := r.cells(pr)
	if counts == nil {
		return false
	}
	if len(counts) < 2 {
		pr.oneActive = true // one real server takes new connections, the rest are quiesced
		return false
	}
	pr.Tested = what
	pr.TestN = uint64(sum64(counts))
	pr.NeedForTest = int(math.Ceil(stats.MinExpected / minPositive(intended)))
	if float64(pr.TestN) < float64(pr.NeedForTest) {
		return false
	}
	chi, err := stats.ChiSquareGOF(counts, intended)
	if err != nil {
		return false
	}
	pr.Chi = &chi
	pr.P = Float(chi.P)
	if g, err := stats.GTest(counts, intended); err == nil {
		pr.G = &g
	}
	if !pr.RulesFair {
		var rp []float64
		all := rulesP(pr)
		for i, e := range pr.Endpoints {
			if !quiesced(pr, e) {
				rp = append(rp, all[i])
			}
		}
		if c, err := stats.ChiSquareGOF(counts, normalise(rp)); err == nil {
			pr.AgainstRules = Float(c.P)
		}
	}
	return true
}

// quiesced reports an IPVS real server of weight 0: kube-proxy's graceful
// termination keeps it for its open connections and sends it no new ones;
// its counts are history, so it is left out of the test.
func quiesced(pr *PortReport, e *EndpointReport) bool { return isIPVS(pr.port) && e.Intended == 0 }

func normalise(p []float64) []float64 {
	s := sum64(p)
	out := make([]float64, len(p))
	for i, x := range p {
		if s > 0 {
			out[i] = x / s
		}
	}
	return out
}

// cells returns the tested counts and their intended shares (quiesced
// IPVS real servers left out), nil when nothing can be tested. The
// clients test needs no counters: the affinity state names them.
func (r *Report) cells(pr *PortReport) (counts, intended []float64, what string) {
	all, what := tested(pr)
	if all == nil || (what != "clients" && !pr.counted(r)) {
		return nil, nil, ""
	}
	for i, e := range pr.Endpoints {
		if quiesced(pr, e) {
			continue
		}
		counts = append(counts, all[i])
		intended = append(intended, e.Intended)
	}
	return counts, normalise(intended), what
}

// oneOff is the alternative where the smallest share is off by delta
// (relative) and the others move in proportion: the least favourable
// one-endpoint fault.
func oneOff(p0 []float64, delta float64) []float64 {
	j, m := 0, math.Inf(1)
	for i, x := range p0 {
		if x > 0 && x < m {
			j, m = i, x
		}
	}
	p1 := slices.Clone(p0)
	up := p0[j] * (1 + delta)
	rest := 1 - p0[j]
	for i := range p1 {
		if i == j {
			p1[i] = up
		} else if rest > 0 {
			p1[i] = p0[i] * (1 - up) / rest
		}
	}
	return p1
}

func (r *Report) power(pr *PortReport, level, mde float64) {
	if !pr.port.Exact || len(pr.Endpoints) < 2 || !(pr.counted(r) || pr.Tested == "clients") {
		return
	}
	intended := intendedOf(pr)
	var pos []float64
	for _, x := range intended {
		if x > 0 {
			pos = append(pos, x)
		}
	}
	if len(pos) < 2 {
		return
	}
	w2 := stats.EffectW2(pos, oneOff(pos, mde))
	df := len(pos) - 1
	pr.Need = stats.ChiSquareSampleSize(w2, df, level, stats.DefaultPower)
	if pr.Tested == "" {
		return
	}
	if pr.TestN > 0 {
		// Busy nodes count billions of connections; the noncentral
		// chi-square's series grows with n·w², so beyond the n that
		// reaches power 1 − 1e-9 the power is reported as that bound.
		sure := sureNoncentrality(df, level)
		words := ""
		if float64(pr.TestN)*w2 >= sure {
			pr.Power, words = Float(1-1e-9), "at least 0.999999999"
		} else {
			pr.Power = Float(stats.ChiSquarePower(int(pr.TestN), w2, df, level))
			words = fmt.Sprintf("%.3f", float64(pr.Power))
		}
		pr.Statement = fmt.Sprintf("with n = %d %s, a share off by %g %% would be detected with probability %s (at α/m = %.3g); power 0.99 needs n = %d",
			pr.TestN, pr.Tested, 100*mde, words, level, pr.Need)
	}
}

type sureKey struct {
	df    int
	level float64
}

var sureCache sync.Map // sureKey → float64

// sureNoncentrality is the noncentrality at which the chi-square test has
// power 1 − 1e-9 (cached: the root search costs milliseconds).
func sureNoncentrality(df int, level float64) float64 {
	k := sureKey{df, level}
	if v, ok := sureCache.Load(k); ok {
		return v.(float64)
	}
	v := stats.RequiredNoncentrality(df, level, 1-1e-9)
	sureCache.Store(k, v)
	return v
}

// judge turns a port's tests into its verdict and findings.
func (r *Report) judge(pr *PortReport, level float64) {
	p := pr.port
	switch {
	case len(pr.Endpoints) == 0:
		pr.Verdict = "no endpoints"
		if ownExternal(p) && p.LocalOnly && r.api == nil {
			r.add(LevelNote, KindNoLocal, pr, "externalTrafficPolicy Local and no local endpoint on this node: connections from outside that arrive here are dropped (load balancers' health checks steer away from such nodes)", p.Evidence...)
		} else if p.LocalOnly && r.api == nil {
			r.add(LevelFinding, KindNoLocal, pr, "internalTrafficPolicy Local and no local endpoint on this node: traffic from this node's pods to it is dropped", p.Evidence...)
		} else if r.api == nil {
			what := "nothing is written for it"
			if p.NoEndpoints != "" {
				what = "new connections get " + p.NoEndpoints
			}
			r.add(LevelNote, "no-endpoints", pr, "the rules list no endpoint: "+what+"; --api tells whether the Service should have some", p.Evidence...)
		}
		return
	case !pr.counted(r) && pr.Tested == "":
		pr.Verdict = "no counters"
		if !pr.RulesFair {
			pr.Verdict = "rules unequal"
		}
		return
	case !p.Exact:
		pr.Verdict = "not tested"
		r.add(LevelNote, KindNotTested, pr, fmt.Sprintf("scheduler %s splits by load or by source, not by fixed shares: its counts are shown, not tested", p.Scheduler), p.Evidence...)
		return
	case len(pr.Endpoints) == 1 || pr.oneActive:
		pr.Verdict = "single endpoint"
		if !pr.RulesFair {
			pr.Verdict = "rules unequal"
		}
		return
	}
	r.starved(pr)
	if pr.Chi == nil && pr.Tested != "" && pr.TestN == 0 {
		pr.Verdict = "no traffic"
		if !pr.RulesFair {
			pr.Verdict = "rules unequal"
		}
		r.idle = append(r.idle, pr.Label())
		return
	}
	if pr.Chi == nil {
		pr.Verdict = "no verdict"
		if !pr.RulesFair {
			pr.Verdict = "rules unequal"
		}
		if pr.Tested == "" {
			r.add(LevelNote, KindTooFew, pr, "ClientIP affinity without the fresh choices or the clients in the dump: connections from one client are not independent draws, so the split is not tested", p.Evidence...)
		} else {
			r.add(LevelNote, KindTooFew, pr, fmt.Sprintf("%d %s are too few for a verdict: a test needs %d (an expected %g per endpoint), and %d to see a share off by %g %% with probability 0.99",
				pr.TestN, pr.Tested, pr.NeedForTest, stats.MinExpected, pr.Need, 100*r.MDE), p.Evidence...)
		}
		r.affinityExplains(pr, level)
		return
	}
	if pr.Rejected {
		pr.Verdict = "skewed"
		if !pr.RulesFair {
			// The rule-level finding already names the fault; say the counters agree.
			pr.Verdict = "rules unequal"
			msg := fmt.Sprintf("the counters confirm it: %d %s against the intended split, chi-square p = %.3g (Holm-adjusted %.3g)", pr.TestN, pr.Tested, pr.P, pr.Adjusted)
			if pr.AgainstRules.Valid() {
				msg += fmt.Sprintf("; against the rules' own shares p = %.3g", pr.AgainstRules)
			}
			r.add(LevelFinding, KindUnequalRules, pr, msg, endpointLines(pr)...)
			return
		}
		r.add(LevelFinding, KindSkew, pr, fmt.Sprintf("the observed %s show a skew although the rules are fair: %d of them, %s; chi-square p = %.3g, Holm-adjusted %.3g at α = %g",
			pr.Tested, pr.TestN, shareWords(pr), pr.P, pr.Adjusted, r.Alpha), endpointLines(pr)...)
		return
	}
	pr.Verdict = "fair"
	if !pr.RulesFair {
		pr.Verdict = "rules unequal"
	}
	r.affinityExplains(pr, level)
}

// shareWords lists the observed shares against the intended ones.
func shareWords(pr *PortReport) string {
	var parts []string
	counts, _ := tested(pr)
	n := sum64(counts)
	for i, e := range pr.Endpoints {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.3f (intended %.3f)", e.Addr, counts[i]/n, e.Intended))
		}
	}
	return strings.Join(capList(parts), ", ")
}

// starved reports an endpoint that received nothing although its expected
// count made that improbable: P(0 of n) = (1-p)^n at or below the level.
func (r *Report) starved(pr *PortReport) {
	counts, what := tested(pr)
	if counts == nil {
		return
	}
	n := sum64(counts)
	for i, e := range pr.Endpoints {
		if counts[i] != 0 || e.Intended <= 0 || n == 0 {
			continue
		}
		p0 := math.Exp(n * math.Log1p(-e.Intended))
		if p0 > r.Alpha/float64(max(r.Tested, 1)) {
			continue
		}
		r.add(LevelFinding, KindStarved, pr, fmt.Sprintf("endpoint %s received none of %g %s although it was expected %.1f: the chance of that is %.3g",
			e.Addr, n, what, n*e.Intended, p0), e.Evidence)
	}
}

// affinityExplains says when affinity accounts for an uneven split of
// connections that its fresh choices or clients do not show.
func (r *Report) affinityExplains(pr *PortReport, level float64) {
	p := pr.port
	if p.Affinity == nil || pr.N == 0 || pr.Tested == "" {
		return // without fresh choices or clients nothing shows it is affinity
	}
	obs := make([]float64, len(pr.Endpoints))
	for i, e := range pr.Endpoints {
		obs[i] = float64(e.Observed)
	}
	conn, err := stats.ChiSquareGOF(obs, intendedOf(pr))
	if err != nil || conn.P > level {
		return
	}
	who := "the clients"
	switch pr.Tested {
	case "fresh choices":
		who = fmt.Sprintf("%d fresh choices (new clients or expired entries)", pr.TestN)
	case "clients":
		who = fmt.Sprintf("%d clients", pr.TestN)
	}
	verdict := "which fit the intended split"
	if pr.Chi == nil {
		verdict = "too few to show anything else"
	}
	pr.Verdict = "explained"
	r.add(LevelExplanation, KindAffinity, pr, fmt.Sprintf("ClientIP affinity explains the uneven connections (%s; chi-square over connections p = %.3g): every connection of a client goes where its first one went, so %d connections come from %s, %s; not a finding",
		shareWords0(pr), conn.P, pr.N, who, verdict), append([]Line{p.Affinity.Evidence}, endpointLines(pr)...)...)
}

func shareWords0(pr *PortReport) string {
	var parts []string
	for _, e := range pr.Endpoints {
		parts = append(parts, fmt.Sprintf("%s %d", e.Addr, e.Observed))
	}
	return strings.Join(capList(parts), ", ")
}

// capList keeps a message readable at many endpoints: the first 8 items
// and how many more (the report's port table has them all).
func capList(parts []string) []string {
	const keep = 8
	if len(parts) <= keep {
		return parts
	}
	return append(slices.Clone(parts[:keep]), fmt.Sprintf("… %d more", len(parts)-keep))
}

// limits adds what the dump cannot show, xt_recent's list size, and the
// constructs the reader skipped.
func (r *Report) limits(d *Dump) {
	if !d.Counters {
		why := d.CountersWhy
		if why == "" {
			why = "the dump carries no counters"
		}
		r.add(LevelNote, KindNoCounters, nil, why+": the rules' structure is analysed, the split of real traffic is not")
	} else {
		r.add(LevelNote, KindCountersLimit, nil, "counters count new connections (NAT decisions, one per conntrack entry; IPVS: connections per real server), not requests: requests inside keep-alive connections are invisible, so a pod can get most requests while the connections are split fairly")
	}
	for _, pr := range r.Ports {
		p := pr.port
		if p.Affinity == nil || p.Affinity.Mechanism != "recent" || !p.SplitKnown {
			continue
		}
		for _, e := range pr.Endpoints {
			if e.Fresh <= XtRecentListTot {
				continue
			}
			switch {
			case r.Interval > 0 && r.Interval <= p.Affinity.Timeout:
				r.add(LevelFinding, KindXtRecentLimit, pr, fmt.Sprintf("endpoint %s made %d fresh choices in %s, inside the affinity timeout %s: its xt_recent list holds %d clients (ip_list_tot), so older clients lost their affinity",
					e.Addr, e.Fresh, r.Interval, p.Affinity.Timeout, XtRecentListTot), p.Affinity.Evidence, e.Evidence)
			case r.Interval > 0:
				per := float64(e.Fresh) * p.Affinity.Timeout.Seconds() / r.Interval.Seconds()
				if per <= XtRecentListTot {
					continue // the rate is known and stays below the list's size
				}
				r.add(LevelFinding, KindXtRecentLimit, pr, fmt.Sprintf("endpoint %s made %d fresh choices in %s, about %.0f per affinity timeout %s; xt_recent keeps %d clients per endpoint (ip_list_tot): above that older clients lose their affinity",
					e.Addr, e.Fresh, r.Interval, per, p.Affinity.Timeout, XtRecentListTot), p.Affinity.Evidence, e.Evidence)
			default:
				r.add(LevelNote, KindXtRecentLimit, pr, fmt.Sprintf("endpoint %s made %d fresh choices since %s: if more than %d of them fall inside one affinity timeout (%s), xt_recent's list (ip_list_tot) overflows and older clients lose their affinity; two dumps with --before tell the rate",
					e.Addr, e.Fresh, r.CountsSince, XtRecentListTot, p.Affinity.Timeout), p.Affinity.Evidence, e.Evidence)
			}
		}
	}
	if len(r.idle) > 0 {
		list := r.idle
		more := ""
		if len(list) > 20 {
			list, more = list[:20], fmt.Sprintf(" and %d more", len(r.idle)-20)
		}
		r.add(LevelNote, KindTooFew, nil, fmt.Sprintf("%d port(s) counted no new connection since %s, so no verdict: %s%s",
			len(r.idle), r.CountsSince, strings.Join(list, ", "), more))
	}
	for _, s := range d.Skipped {
		var touched []string
		for _, pr := range r.Ports {
			if touches(s.Line.Text, pr) {
				touched = append(touched, pr.Label())
			}
		}
		msg := "skipped a construct the reader does not understand: " + s.Reason
		if len(touched) > 0 {
			msg += "; it touches " + strings.Join(touched, ", ")
		} else {
			msg += "; it names no port the dump has"
		}
		r.add(LevelNote, KindSkippedRule, nil, msg, s.Line)
	}
	if len(d.Ignored) > 0 {
		var what []string
		for _, ig := range d.Ignored {
			what = append(what, fmt.Sprintf("%s (%d lines)", ig.What, ig.Lines))
		}
		r.add(LevelNote, "ignored", nil, "not kube-proxy's, ignored: "+strings.Join(what, ", "))
	}
}

// touches reports whether a skipped line names a port: its chain, an
// endpoint's chain, or its ClusterIP.
func touches(text string, pr *PortReport) bool {
	if pr.Chain != "" && strings.Contains(text, pr.Chain) {
		return true
	}
	for _, e := range pr.Endpoints {
		if e.Chain != "" && strings.Contains(text, e.Chain) {
			return true
		}
	}
	ip := pr.port.ClusterIP.String()
	if i := strings.Index(text, ip); i >= 0 {
		end := i + len(ip)
		return end == len(text) || !(text[end] >= '0' && text[end] <= '9')
	}
	return false
}

// apiPorts is the API's service ports by key (nil without --api), built
// once.
func (r *Report) apiPorts() map[string]*apiPort {
	if r.api != nil && r.apiCache == nil {
		r.apiCache = r.api.ports()
	}
	return r.apiCache
}

// ownExternal reports a port whose own address is an external destination
// with its external chain (nftables external and load-balancer IPs).
func ownExternal(p *ServicePort) bool {
	return p.External != nil && p.External.Chain != "" && p.External.Chain == p.Chain
}
