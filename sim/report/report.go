// Package report is the simulator's report: the figures `sim run` computes
// per kube-proxy mode, the verdicts of the scenario's checks, and the
// writers for them (report.json, report.md, a terminal table and PNG plots).
//
// report.json is a pure function of the scenario and the seed: it holds no
// timestamp, no wall-clock figure and no host detail, so the same seed gives
// the same bytes. Wall time belongs to the printed summary only.
package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

// Check verdicts.
const (
	Pass  = "pass"
	Fail  = "fail"
	Error = "error" // the check could not be evaluated (no traffic reached it, too few connections)
	// NotTested: the engine self-check does not test the mode (its
	// choice is not a draw from the oracle's shares); Reason says why.
	NotTested = "not tested"
)

// Report is one simulation of a scenario in one or more modes.
type Report struct {
	Scenario string `json:"scenario"`
	File     string `json:"file"`
	Seed     uint64 `json:"seed"`
	// Cluster is the cluster the scenario expands to, as the informers see
	// it (what `sim run` printed before it simulated).
	Cluster *apiserver.Summary `json:"cluster"`
	Traffic Traffic            `json:"traffic"`
	// Steps are the API writes of the events timeline.
	Steps []Step `json:"steps"`
	Modes []Mode `json:"modes"`
	// External is the traffic from outside the cluster (nil without
	// external clients).
	External *External `json:"external,omitempty"`
	// Checks are the scenario's checks, one entry per mode and check.
	Checks []Check `json:"checks"`
	// Failed names the failed checks as "mode/check" ("mode/engine-self-check"
	// for the engine self-check).
	Failed []string `json:"failed"`
	// Family is the one Holm family of the report's statistical tests.
	Family Family `json:"holmFamily"`
	// Calibrations are the sync-time models used, with their sources.
	Calibrations []cost.Calibration `json:"calibrations"`
	// Model states what is modelled and how, in sentences.
	Model []string `json:"model"`
}

// Traffic is the traffic section as simulated.
type Traffic struct {
	Connections int64 `json:"connections"`
	// SpanSeconds is the virtual time over which connections arrive.
	SpanSeconds float64 `json:"spanSeconds"`
	// RatePerSecond is Connections / SpanSeconds (all client nodes).
	RatePerSecond      float64 `json:"ratePerSecond"`
	ClientNodes        int     `json:"clientNodes"`
	SourceAddresses    int     `json:"sourceAddresses"`
	ConnectionDuration string  `json:"connectionDuration"`
	// TargetServicePorts is the number of distinct service ports targeted.
	TargetServicePorts int `json:"targetServicePorts"`
	// RequestClients are the client groups with requests (their own rate,
	// over a pool of long-lived connections or a connection each).
	RequestClients []RequestClient `json:"requestClients,omitempty"`
}

// Step is one API write of the events timeline.
type Step struct {
	AtSeconds   float64 `json:"atSeconds"`
	Description string  `json:"description"`
	// ServicePorts are the service ports whose state it changed.
	ServicePorts []string `json:"servicePorts"`
}

// Mode is everything simulated for one kube-proxy mode.
type Mode struct {
	Mode        cluster.Mode  `json:"mode"`
	Connections Connections   `json:"connections"`
	Rules       Rules         `json:"rules"`
	Sync        Sync          `json:"sync"`
	FirstPacket FirstPacket   `json:"firstPacket"`
	Conntrack   Conntrack     `json:"conntrack"`
	SelfCheck   SelfCheck     `json:"engineSelfCheck"`
	Affinity    Affinity      `json:"affinity"`
	Local       InternalLocal `json:"internalTrafficPolicyLocal"`
	Flapping    Flapping      `json:"flapping"`
	Timeline    *Timeline     `json:"timeline,omitempty"`
	// Requests and LongLived are the clients with requests' (nil and empty
	// without any): their requests, and the followed service ports'.
	Requests  *Requests   `json:"requests,omitempty"`
	LongLived []LongLived `json:"longLived,omitempty"`
}

// Connections counts new connections by outcome.
type Connections struct {
	Total int64 `json:"total"`
	// Established followed a live conntrack entry (a reused tuple).
	Established int64 `json:"established"`
	Accepted    int64 `json:"accepted"`
	Dropped     int64 `json:"dropped"`
	Rejected    int64 `json:"rejected"`
}

// Rules are the objects each node programs (sim/cost Count), over nodes.
type Rules struct {
	// Measure names what Objects counts in this mode.
	Measure      string `json:"measure"`
	ObjectsMax   int    `json:"objectsMax"`
	ObjectsTotal int    `json:"objectsTotal"`
	// MaxNode is the node with the most objects, and Counts its breakdown.
	MaxNode string      `json:"maxNode"`
	Counts  cost.Counts `json:"counts"`
}

// Sync is the sync loop's work: one full sync per node at start (before
// traffic), then the runs the events caused, paced by the sync runner.
type Sync struct {
	// Variant names the calibration used (with Mode, see cost.Find);
	// Calibration describes it.
	Variant     string `json:"variant"`
	Calibration string `json:"calibration"`
	// Syncs counts every sync over all nodes; Full, Partial and Periodic
	// break it down.
	Syncs    int `json:"syncs"`
	Full     int `json:"full"`
	Partial  int `json:"partial"`
	Periodic int `json:"periodic"`
	// Seconds are quantiles of the sync time over every sync.
	P50Seconds float64 `json:"p50Seconds"`
	P99Seconds float64 `json:"p99Seconds"`
	MaxSeconds float64 `json:"maxSeconds"`
	// FullSeconds is the largest node's full sync time.
	FullSeconds float64 `json:"fullSeconds"`
	// FullEstimate and PartialEstimate are the cost model's figures for
	// that node, with their band and whether they are extrapolated (nil
	// when the sync times did not come from a cost model). When one is
	// extrapolated the quantiles above rest on extrapolated figures too.
	FullEstimate    *cost.Estimate `json:"fullEstimate,omitempty"`
	PartialEstimate *cost.Estimate `json:"partialEstimate,omitempty"`
}

// Extrapolated says whether the sync figures rest on the cost model
// outside its measured range.
func (s Sync) Extrapolated() bool {
	return (s.FullEstimate != nil && s.FullEstimate.Extrapolated) || (s.PartialEstimate != nil && s.PartialEstimate.Extrapolated)
}

// FirstPacket is the rule-walking work of a new connection's first packet.
type FirstPacket struct {
	RulesP50 float64 `json:"rulesP50"`
	RulesP99 float64 `json:"rulesP99"`
	// ClusterIP, NodePort and LoadBalancer (load-balancer and external
	// IPs) are the same by path, each the worst node's; nil when no new
	// connection took it (sim/cost's FirstPackets).
	ClusterIP    *cost.PathWalk `json:"clusterIP,omitempty"`
	NodePort     *cost.PathWalk `json:"nodePort,omitempty"`
	LoadBalancer *cost.PathWalk `json:"loadBalancer,omitempty"`
	Note         string         `json:"note"`
}

// Conntrack is the conntrack table at its peak, on the busiest node.
type Conntrack struct {
	PeakEntries int64  `json:"peakEntries"`
	Bytes       int64  `json:"bytes"`
	Node        string `json:"node"`
	EntryBytes  int    `json:"entryBytes"`
}

// SelfCheckWhat is what the engine self-check is, as every writer labels it.
const SelfCheckWhat = "engine self-check: the simulator's engines' draws against the oracle"

// Self-check methods.
const (
	// MethodChiSquare: the mode draws at random (iptables statistic
	// cascade, nftables numgen, ipvs mh): a stratified chi-square per
	// service port, and the uniformity of the p-values.
	MethodChiSquare = "chi-square"
	// MethodRotation: ipvs rr and wrr rotate deterministically; a
	// chi-square against uniform shares would pass by construction.
	MethodRotation = "rotation"
	// MethodNone: the mode's choice is not a draw from the oracle's shares
	// (ipvs sh, dh: hashes; lc, wlc, sed, nq: held connections).
	MethodNone = "not tested"
)

// SelfCheck is the engine self-check of one mode: the simulator's engines
// (sim/engine) held against the oracle's shares (sim/oracle) on the
// connections they decided afresh. It tests the simulator's code, not a
// dataplane: a correct engine passes it by construction, except with
// probability about the family's α; it exists to catch a bug in an engine
// (or the oracle), and says nothing about any kernel.
type SelfCheck struct {
	// What is SelfCheckWhat.
	What string `json:"what"`
	// Method is MethodChiSquare, MethodRotation or MethodNone; Reason says
	// why for the last two.
	Method string `json:"method"`
	Reason string `json:"reason,omitempty"`
	// Verdict is Pass or Fail (a port rejected, a rotation broken, or
	// p-values that are not uniform).
	Verdict string `json:"verdict"`
	// ServicePorts were checked; Skipped were not (fewer than two eligible
	// endpoints or too few connections in every stratum, or MethodNone).
	ServicePorts int `json:"servicePorts"`
	Skipped      int `json:"skipped"`
	// Strata are the (node, version) samples tested, merged over the nodes
	// where every node has the same expectation (a sum of multinomials
	// with the same shares is one multinomial); LeftOut counts the
	// connections of strata too small for a chi-square.
	Strata  int   `json:"strata"`
	LeftOut int64 `json:"connectionsLeftOut,omitempty"`
	// Rejected counts the service ports that failed: rejected by Holm in
	// the report's family (chi-square) or outside the rotation's bound.
	Rejected             int      `json:"rejected"`
	RejectedServicePorts []string `json:"rejectedServicePorts,omitempty"`
	// WorstP is the smallest p-value (chi-square) and WorstPServicePort its
	// service port.
	WorstP            float64 `json:"worstP,omitempty"`
	WorstPServicePort string  `json:"worstPServicePort,omitempty"`
	// WorstDeviation is the largest |observed − expected| share of one
	// endpoint in one stratum, over every checked service port.
	WorstDeviation            float64 `json:"worstDeviation"`
	WorstDeviationServicePort string  `json:"worstDeviationServicePort,omitempty"`
	// Uniformity is the p-values' uniformity test (chi-square only).
	Uniformity *Uniformity `json:"pValueUniformity,omitempty"`
	// Rotation is the rotation check (rr, wrr only).
	Rotation *Rotation `json:"rotation,omitempty"`
	// Histogram bins the per-service-port largest deviation.
	Histogram []Bin `json:"deviationHistogram"`
	// Findings say in plain words what the self-check found.
	Findings []string `json:"findings"`
	Note     string   `json:"note,omitempty"`
}

// Uniformity tests that a mode's per-service-port p-values are uniform on
// (0, 1), as they are when every engine draws from the oracle's shares:
// too many small ones say the draws differ, too many large ones that the
// test is conservative (or the draws too even).
type Uniformity struct {
	Test string `json:"test"`
	N    int    `json:"n"`
	// D is the Kolmogorov-Smirnov distance, P its p-value.
	D float64 `json:"d"`
	P float64 `json:"p"`
	// AtMost05 and AtLeast95 count p ≤ 0.05 and p ≥ 0.95; Expected is
	// 0.05·N, the count of each under uniformity.
	AtMost05  int     `json:"atMost05"`
	AtLeast95 int     `json:"atLeast95"`
	Expected  float64 `json:"expectedEach"`
	// Rejected: Holm rejects uniformity in the report's family.
	Rejected bool `json:"rejected"`
	// Histogram bins the p-values in 20 bins of 0.05.
	Histogram []Bin `json:"histogram"`
}

// Rotation checks ipvs rr and wrr: in each (node, version) stratum the
// counts of the eligible endpoints differ by at most Bound (1 for a strict
// rotation; wrr adds one per restart the engine can make inside a
// stratum).
type Rotation struct {
	Scheduler string `json:"scheduler"`
	// Strata are the (node, version) samples with at least two eligible
	// endpoints and two connections.
	Strata int `json:"strata"`
	// Spread is the max − min count of the stratum that exceeds its bound
	// the most (or comes closest to it), Bound that stratum's bound and
	// ServicePort its service port.
	Spread      int    `json:"spread"`
	Bound       int    `json:"bound"`
	ServicePort string `json:"servicePort,omitempty"`
	// Forbidden counts fresh connections to endpoints the oracle excludes.
	Forbidden int64 `json:"forbidden"`
}

// Family is the report's one Holm family: every chi-square unit of the
// distribution checks, every service port the engine self-check tests by
// chi-square and each mode's p-value uniformity test, in every mode, at
// Alpha. The rotation checks and the exact checks have no α to spend.
type Family struct {
	Alpha float64 `json:"alpha"`
	// Size is m; CheckUnits, SelfCheckPorts and UniformityTests break it
	// down.
	Size            int `json:"size"`
	CheckUnits      int `json:"checkUnits"`
	SelfCheckPorts  int `json:"selfCheckServicePorts"`
	UniformityTests int `json:"uniformityTests"`
	// Rejected counts the members Holm rejected.
	Rejected int `json:"rejected"`
}

// Bin is one histogram bin [Lo, Hi).
type Bin struct {
	Lo    float64 `json:"lo"`
	Hi    float64 `json:"hi"`
	Count int     `json:"count"`
}

// Affinity is ClientIP stickiness over every affinity service port.
type Affinity struct {
	ServicePorts int `json:"servicePorts"`
	// Bound counts new connections of clients bound to an endpoint (inside
	// the timeout, the endpoint still programmed); Kept those that reached it.
	Bound      int64   `json:"bound"`
	Kept       int64   `json:"kept"`
	Stickiness float64 `json:"stickiness"`
	// CILow and CIHigh are the 99 % Clopper-Pearson interval of Stickiness.
	CILow  float64 `json:"ciLow"`
	CIHigh float64 `json:"ciHigh"`
	// RecentEvictedLive counts clients an iptables recent list forgot while
	// still inside the timeout (ip_list_tot): a known deviation.
	RecentEvictedLive int64  `json:"recentEvictedLive"`
	Note              string `json:"note,omitempty"`
}

// InternalLocal is what internalTrafficPolicy Local does to each client
// node's connections.
type InternalLocal struct {
	ServicePorts int `json:"servicePorts"`
	// MaxFraction is the largest share of a node's connections black-holed
	// (DROP), MeanFraction the mean over client nodes.
	MaxFraction  float64 `json:"maxFraction"`
	MeanFraction float64 `json:"meanFraction"`
	// MaxRefusedFraction is the largest share of a node's connections to
	// Local service ports dropped or rejected (ipvs rejects where the
	// others drop: its documented deviation).
	MaxRefusedFraction float64     `json:"maxRefusedFraction"`
	Nodes              []LocalNode `json:"nodes"`
}

// LocalNode is one client node.
type LocalNode struct {
	Node        string `json:"node"`
	Connections int64  `json:"connections"`
	// ToLocal counts connections to Local service ports; Dropped and
	// Rejected those refused.
	ToLocal  int64 `json:"toLocal"`
	Dropped  int64 `json:"dropped"`
	Rejected int64 `json:"rejected"`
	// Fraction is Dropped / Connections; FractionOfLocal Dropped / ToLocal.
	Fraction        float64 `json:"fraction"`
	FractionOfLocal float64 `json:"fractionOfLocal"`
}

// Flapping is the exposure window: from an API change to the end of the
// first sync that picked it up, a node's rules still send traffic to the old
// endpoints.
type Flapping struct {
	// WindowP50Seconds and WindowMaxSeconds are over every (step, node).
	WindowP50Seconds float64 `json:"windowP50Seconds"`
	WindowMaxSeconds float64 `json:"windowMaxSeconds"`
	// ConnectionsInWindow were decided by stale rules; Misrouted of them
	// reached an endpoint the API no longer allowed (not ready, removed).
	ConnectionsInWindow int64 `json:"connectionsInWindow"`
	Misrouted           int64 `json:"misrouted"`
	// Refused in the window were dropped or rejected though the API had an
	// endpoint for them.
	Refused int64 `json:"refused"`
	// MismatchedAfterSync counts connections whose outcome disagreed with
	// the oracle while the rules were up to date: 0 on a correct engine.
	MismatchedAfterSync int64        `json:"mismatchedAfterSync"`
	Steps               []StepWindow `json:"steps"`
}

// StepWindow is the exposure of one timeline step.
type StepWindow struct {
	Step             int     `json:"step"`
	AtSeconds        float64 `json:"atSeconds"`
	WindowP50Seconds float64 `json:"windowP50Seconds"`
	WindowMaxSeconds float64 `json:"windowMaxSeconds"`
	// Open counts nodes whose window was still open when traffic ended.
	Open                int   `json:"open,omitempty"`
	ConnectionsInWindow int64 `json:"connectionsInWindow"`
	Misrouted           int64 `json:"misrouted"`
}

// Timeline follows one service port over virtual time.
type Timeline struct {
	ServicePort string  `json:"servicePort"`
	BinSeconds  float64 `json:"binSeconds"`
	// Eligible is the number of endpoints the API allows at the start of
	// each bin; Connections and Misrouted count per bin over all nodes.
	Eligible    []int   `json:"eligible"`
	Connections []int64 `json:"connections"`
	Misrouted   []int64 `json:"misrouted"`
}

// Check is one scenario check in one mode.
type Check struct {
	Mode        cluster.Mode `json:"mode"`
	Name        string       `json:"name"`
	Type        string       `json:"type"`
	ServicePort string       `json:"servicePort"`
	Verdict     string       `json:"verdict"`
	Message     string       `json:"message,omitempty"`
	// Alpha is the family-wise level of the report's Holm family, which
	// holds the check's chi-square units (distribution checks).
	Alpha      float64  `json:"alpha,omitempty"`
	Units      []Unit   `json:"units"`
	Deviations []string `json:"knownDeviations,omitempty"`
}

// Unit is a check's verdict for one client node.
type Unit struct {
	ClientNode string `json:"clientNode"`
	Verdict    string `json:"verdict"`
	Message    string `json:"message,omitempty"`
	// Expected is the oracle's outcome when the rules are up to date
	// ("ENDPOINTS", "DROP", "REJECT"; "mixed" when it changed over time).
	Expected string `json:"expected"`
	// Decisions are new connections decided by up-to-date rules;
	// Mismatched of them disagreed with the oracle.
	Decisions  int64 `json:"decisions"`
	Mismatched int64 `json:"mismatched"`
	// In-window figures (flapping).
	InWindow  int64 `json:"inWindow,omitempty"`
	Misrouted int64 `json:"misrouted,omitempty"`
	// Chi-square (distribution): the sum of one chi-square per version of
	// the service port (Strata), with their summed df; in ipvs rr and wrr
	// the rotation check instead (Test "rotation", Statistic the largest
	// max − min count of a version, no p-value).
	Test            string  `json:"test,omitempty"`
	Strata          int     `json:"strata,omitempty"`
	Statistic       float64 `json:"statistic,omitempty"`
	DF              int     `json:"df,omitempty"`
	P               float64 `json:"p,omitempty"`
	N               int64   `json:"n,omitempty"`
	MaxAbsDeviation float64 `json:"maxAbsDeviation,omitempty"`
	// Power is the power at the check's minimum detectable effect at Holm's
	// first step (α/m, m the report's family size), and RequiredN the
	// sample it would need for the check's power.
	Power     float64 `json:"power,omitempty"`
	RequiredN int     `json:"requiredN,omitempty"`
	// Affinity.
	Bound      int64 `json:"bound,omitempty"`
	Violations int64 `json:"violations,omitempty"`
	Known      int64 `json:"knownDeviations,omitempty"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("could not encode the report: %w", err)
	}
	return nil
}

// Files names what WriteFiles writes in the output folder.
var Files = struct{ JSON, Markdown, Rules, SyncTime, Deviation, PValues, Flapping, Requests, External string }{
	JSON: "report.json", Markdown: "report.md", Rules: "rules.png", SyncTime: "sync-time.png",
	Deviation: "deviation.png", PValues: "p-values.png", Flapping: "flapping.png", Requests: "requests.png",
	External: "external.png",
}

// WriteFiles writes report.json, report.md and the plots into dir, creating
// it. It returns the paths written.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("could not create the output folder: %w", err)
	}
	var written []string
	write := func(name string, f func(io.Writer) error) error {
		p := filepath.Join(dir, name)
		tmp, err := os.CreateTemp(dir, "."+name+".*")
		if err != nil {
			return fmt.Errorf("could not write %s: %w", p, err)
		}
		if err := f(tmp); err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			return fmt.Errorf("could not write %s: %w", p, err)
		}
		if err := tmp.Close(); err != nil {
			os.Remove(tmp.Name())
			return fmt.Errorf("could not write %s: %w", p, err)
		}
		if err := os.Chmod(tmp.Name(), 0o644); err != nil {
			os.Remove(tmp.Name())
			return fmt.Errorf("could not write %s: %w", p, err)
		}
		if err := os.Rename(tmp.Name(), p); err != nil {
			os.Remove(tmp.Name())
			return fmt.Errorf("could not write %s: %w", p, err)
		}
		written = append(written, p)
		return nil
	}
	if err := write(Files.JSON, r.WriteJSON); err != nil {
		return written, err
	}
	if err := write(Files.Markdown, r.WriteMarkdown); err != nil {
		return written, err
	}
	// The plots are drawn concurrently (each takes a tenth of a second),
	// then written in order.
	plots := r.plots()
	images := make([]bytes.Buffer, len(plots))
	errs := make([]error, len(plots))
	var wg sync.WaitGroup
	for i, p := range plots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.draw(&images[i])
		}()
	}
	wg.Wait()
	for i, p := range plots {
		if errs[i] != nil {
			return written, fmt.Errorf("could not write %s: %w", filepath.Join(dir, p.name), errs[i])
		}
		if err := write(p.name, func(w io.Writer) error { _, err := images[i].WriteTo(w); return err }); err != nil {
			return written, err
		}
	}
	return written, nil
}
