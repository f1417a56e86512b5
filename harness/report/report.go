// Package report holds the results of a conformance run and writes them for
// CI: one JUnit file (a testcase per check, properties for mode, kernel,
// iptables backend and seed, a testcase even when setup fails), a JSON file
// with every figure, and a Markdown summary that fits $GITHUB_STEP_SUMMARY.
package report

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Verdicts.
const (
	Pass  = "pass"
	Fail  = "fail"
	Error = "error" // the check could not run (setup, settle timeout)
	// NotRun is a verdict that tested nothing (say, an affinity expiry
	// whose timeout is too long to wait for); Message gives the reason. It
	// is neither a pass nor a failure, and stays out of Holm's family.
	NotRun = "not-run"
)

// KindEnvironment is the ErrorKind of an error of the machine or of the
// observation (a settle timeout, probes the observer missed, probes that
// were not independent), not of the dataplane under test.
const KindEnvironment = "environment"

// Run is a whole conformance run: one suite per scenario.
type Run struct {
	Mode string `json:"mode"`
	// Subject is the proxy the run checked ("kpsim" or "kube-proxy") and
	// SubjectVersion its version (the sim version, or kube-proxy's).
	Subject         string        `json:"subject,omitempty"`
	SubjectVersion  string        `json:"subjectVersion,omitempty"`
	Layout          string        `json:"layout,omitempty"`
	IPTablesBackend string        `json:"iptablesBackend,omitempty"`
	Kernel          string        `json:"kernel"`
	Seed            uint64        `json:"seed"`
	Faults          []string      `json:"faults,omitempty"`
	FamilyAlpha     float64       `json:"familyAlpha"`
	Started         time.Time     `json:"started"`
	Duration        time.Duration `json:"durationNs"`
	Suites          []*Suite      `json:"suites"`
}

// Suite is one scenario.
type Suite struct {
	Scenario   string `json:"scenario"`
	File       string `json:"file"`
	SetupError string `json:"setupError,omitempty"`
	// SetupErrorKind is KindEnvironment when the setup error is the
	// machine's (a namespace that could not be built, a tool missing);
	// empty, it counts as a failure of the subject (a first sync that
	// failed).
	SetupErrorKind string         `json:"setupErrorKind,omitempty"`
	Duration       time.Duration  `json:"durationNs"`
	Checks         []*Check       `json:"checks"`
	Deviations     []Deviation    `json:"knownDeviations,omitempty"`
	Figures        map[string]any `json:"figures,omitempty"`
}

// Check is one verdict with its statistics.
type Check struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Service    string `json:"service"`
	ClientNode string `json:"clientNode,omitempty"`
	Phase      string `json:"phase,omitempty"`
	Verdict    string `json:"verdict"`
	// SpecVerdict says whether the observed behaviour meets the documented
	// Service semantics, where kube-proxy's mode departs from them.
	SpecVerdict string `json:"specVerdict,omitempty"`
	Message     string `json:"message,omitempty"`

	Test          string  `json:"test,omitempty"`
	Statistic     float64 `json:"statistic"`
	DF            int     `json:"df,omitempty"`
	P             float64 `json:"p"`
	N             int     `json:"n"`
	EffectSize    float64 `json:"effectSize"`
	Alpha         float64 `json:"alpha"`
	MDE           float64 `json:"mde,omitempty"`
	Power         float64 `json:"power,omitempty"`
	AchievedPower float64 `json:"achievedPower,omitempty"`
	Seed          uint64  `json:"seed"`
	Table         []Row   `json:"table,omitempty"`
	// Witness compares the rule counters with what the backends counted.
	Witness string `json:"witness,omitempty"`
	// Loss accounts for the probes nobody saw end.
	Loss *Loss `json:"loss,omitempty"`
	// Independence is the run-time proof that the probes were fresh NAT
	// decisions (conntrack entries counted per block of probes).
	Independence string `json:"independence,omitempty"`
	// Looks are the cumulative sample sizes a sequential test looked at
	// (empty for a fixed-size test).
	Looks []int `json:"looks,omitempty"`
	// ErrorKind is KindEnvironment for an Error of the machine or the
	// observation; empty for any other error.
	ErrorKind string        `json:"errorKind,omitempty"`
	Duration  time.Duration `json:"durationNs"`
}

// Loss is a check's accounting of its probes: sent, seen to end (arrived,
// rejected, other ICMP) and lost, the kernel's decisions (rule counters),
// the observers' socket drops and the probes that could not be sent.
type Loss struct {
	Sent          int       `json:"sent"`
	Arrived       int       `json:"arrived"`
	Rejected      int       `json:"rejected"`
	OtherICMP     int       `json:"otherICMP"`
	Lost          int       `json:"lost"`
	Decided       int64     `json:"decided"` // -1: unknown
	ObserverDrops uint64    `json:"observerDrops"`
	SendErrors    int       `json:"sendErrors"`
	Missed        int       `json:"missed"` // lost after a kernel decision: an environment error
	Text          string    `json:"text,omitempty"`
	_             [0]func() // not comparable: compare fields
}

// Row is one cell of the observed-against-expected table.
type Row struct {
	Outcome  string  `json:"outcome"` // ip:port, DROP or REJECT
	Observed float64 `json:"observed"`
	Expected float64 `json:"expected"`
	Counter  float64 `json:"ruleCounter,omitempty"`
	// CILow and CIHigh bound the outcome's share (of n) with the check's
	// simultaneous confidence level; both 0 when not computed.
	CILow  float64 `json:"ciLow,omitempty"`
	CIHigh float64 `json:"ciHigh,omitempty"`
}

// Deviation is a known difference between kube-proxy's mechanism and the
// documented semantics, with its measured evidence. It never fails a run.
type Deviation struct {
	Name     string `json:"name"`
	Evidence string `json:"evidence"`
}

// Failed lists the checks that failed or errored for a reason other than
// the environment, and setup errors not marked as the environment's, as
// "scenario/check". A check that was not run is not a failure.
func (r *Run) Failed() []string {
	var out []string
	for _, s := range r.Suites {
		if s.SetupError != "" && s.SetupErrorKind != KindEnvironment {
			out = append(out, s.Scenario+"/setup")
		}
		for _, c := range s.Checks {
			switch {
			case c.Verdict == Pass || c.Verdict == NotRun:
			case c.Verdict == Error && c.ErrorKind == KindEnvironment:
			default:
				out = append(out, s.Scenario+"/"+c.Name)
			}
		}
	}
	return out
}

// EnvironmentErrors lists what the machine or the observation lacked or
// lost, one line per check ("scenario/check: message") and per setup error
// of the environment's kind.
func (r *Run) EnvironmentErrors() []string {
	var out []string
	for _, s := range r.Suites {
		if s.SetupError != "" && s.SetupErrorKind == KindEnvironment {
			out = append(out, s.Scenario+"/setup: "+s.SetupError)
		}
		for _, c := range s.Checks {
			if c.Verdict == Error && c.ErrorKind == KindEnvironment {
				out = append(out, s.Scenario+"/"+c.Name+": "+c.Message)
			}
		}
	}
	return out
}

// Verdicts counts the checks that ran (any verdict but NotRun) and those
// that did not.
func (r *Run) Verdicts() (ran, notRun int) {
	for _, s := range r.Suites {
		for _, c := range s.Checks {
			if c.Verdict == NotRun {
				notRun++
			} else {
				ran++
			}
		}
	}
	return ran, notRun
}

// NotRunReasons lists the checks that were not run with the reason,
// "scenario/check: reason".
func (r *Run) NotRunReasons() []string {
	var out []string
	for _, s := range r.Suites {
		for _, c := range s.Checks {
			if c.Verdict == NotRun {
				out = append(out, s.Scenario+"/"+c.Name+": "+c.Message)
			}
		}
	}
	return out
}

// WriteJSON writes every figure.
func (r *Run) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Time       string          `xml:"time,attr"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name       string          `xml:"name,attr"`
	Classname  string          `xml:"classname,attr"`
	Time       string          `xml:"time,attr"`
	Properties []junitProperty `xml:"properties>property,omitempty"`
	Failure    *junitFailure   `xml:"failure,omitempty"`
	Error      *junitFailure   `xml:"error,omitempty"`
	Skipped    *junitSkipped   `xml:"skipped,omitempty"`
	SystemOut  string          `xml:"system-out,omitempty"`
}

type junitSkipped struct {
	Message string `xml:"message,attr"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Body    string `xml:",chardata"`
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// WriteJUnit writes one JUnit file: a testsuite per scenario, a testcase per
// check, and a "setup" testcase (in error) for a scenario that could not run.
func (r *Run) WriteJUnit(w io.Writer) error {
	js := junitSuites{Name: "kpsim conformance (" + r.Mode + ")", Time: secs(r.Duration)}
	props := []junitProperty{
		{"mode", r.Mode}, {"kernel", r.Kernel}, {"seed", fmt.Sprint(r.Seed)},
		{"familyAlpha", fmt.Sprint(r.FamilyAlpha)}, {"faults", strings.Join(r.Faults, ",")},
	}
	if r.Subject != "" {
		props = append(props, junitProperty{"subject", r.Subject}, junitProperty{"subjectVersion", r.SubjectVersion})
	}
	if r.IPTablesBackend != "" {
		props = append(props, junitProperty{"iptablesBackend", r.IPTablesBackend})
	}
	if r.Layout != "" {
		props = append(props, junitProperty{"layout", r.Layout})
	}
	for _, s := range r.Suites {
		su := junitSuite{Name: s.Scenario, Time: secs(s.Duration), Properties: append(props, junitProperty{"file", s.File})}
		if s.SetupError != "" {
			typ := "setup"
			if s.SetupErrorKind != "" {
				typ = s.SetupErrorKind
			}
			su.Cases = append(su.Cases, junitCase{Name: "setup", Classname: s.Scenario, Time: "0",
				Error: &junitFailure{Message: s.SetupError, Type: typ}})
			su.Errors++
		}
		for _, c := range s.Checks {
			jc := junitCase{Name: c.Name, Classname: s.Scenario, Time: secs(c.Duration),
				Properties: []junitProperty{{"type", c.Type}, {"p", fmt.Sprintf("%.4g", c.P)}, {"n", fmt.Sprint(c.N)},
					{"alpha", fmt.Sprintf("%.4g", c.Alpha)}, {"statistic", fmt.Sprintf("%.4g", c.Statistic)}, {"seed", fmt.Sprint(c.Seed)}},
				SystemOut: c.Summary()}
			switch c.Verdict {
			case Fail:
				jc.Failure = &junitFailure{Message: c.Message, Type: c.Type, Body: c.Summary()}
				su.Failures++
			case Error:
				typ := c.Type
				if c.ErrorKind != "" {
					typ = c.ErrorKind
				}
				jc.Error = &junitFailure{Message: c.Message, Type: typ, Body: c.Summary()}
				su.Errors++
			case NotRun:
				jc.Skipped = &junitSkipped{Message: c.Message}
				su.Skipped++
			}
			su.Cases = append(su.Cases, jc)
		}
		su.Tests = len(su.Cases)
		js.Tests += su.Tests
		js.Failures += su.Failures
		js.Errors += su.Errors
		js.Skipped += su.Skipped
		js.Suites = append(js.Suites, su)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(js); err != nil {
		return fmt.Errorf("could not write JUnit: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// Summary is the check's verdict with its statistics and table, as text.
func (c *Check) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %s", c.Type, c.Name, strings.ToUpper(c.Verdict))
	if c.ErrorKind != "" {
		fmt.Fprintf(&b, " [%s]", c.ErrorKind)
	}
	if c.Message != "" {
		fmt.Fprintf(&b, " (%s)", c.Message)
	}
	b.WriteString("\n")
	if c.Test != "" {
		fmt.Fprintf(&b, "  %s: statistic %.4g, df %d, p %.4g, n %d, effect %.4g, alpha %.3g, seed %d\n",
			c.Test, c.Statistic, c.DF, c.P, c.N, c.EffectSize, c.Alpha, c.Seed)
	}
	if len(c.Looks) > 0 {
		fmt.Fprintf(&b, "  sequential looks at n = %v\n", c.Looks)
	}
	if c.SpecVerdict != "" {
		fmt.Fprintf(&b, "  documented semantics: %s\n", c.SpecVerdict)
	}
	if len(c.Table) > 0 {
		writeTable(&b, c.Table)
	}
	if c.Witness != "" {
		fmt.Fprintf(&b, "  rule counters: %s\n", c.Witness)
	}
	if c.Loss != nil {
		fmt.Fprintf(&b, "  loss: %s\n", c.Loss.Summary())
	}
	if c.Independence != "" {
		fmt.Fprintf(&b, "  probes: %s\n", c.Independence)
	}
	return b.String()
}

// writeTable writes the observed-against-expected table, with the shares'
// intervals when any row has one.
func writeTable(b *strings.Builder, rows []Row) {
	ci := false
	for _, r := range rows {
		ci = ci || r.CIHigh > 0
	}
	fmt.Fprintf(b, "  %-22s %10s %10s", "outcome", "observed", "expected")
	if ci {
		fmt.Fprintf(b, "  %-19s", "share CI")
	}
	b.WriteString("\n")
	for _, r := range rows {
		fmt.Fprintf(b, "  %-22s %10.0f %10.1f", r.Outcome, r.Observed, r.Expected)
		if ci && r.CIHigh > 0 {
			fmt.Fprintf(b, "  [%.5f, %.5f]", r.CILow, r.CIHigh)
		}
		b.WriteString("\n")
	}
}

// Summary is the loss in one line: the counts, then the classification.
func (l *Loss) Summary() string {
	dec := "unknown"
	if l.Decided >= 0 {
		dec = fmt.Sprint(l.Decided)
	}
	s := fmt.Sprintf("sent %d, arrived %d, rejected %d, other ICMP %d, lost %d (missed by the observer %d), decided %s, socket drops %d, send errors %d",
		l.Sent, l.Arrived, l.Rejected, l.OtherICMP, l.Lost, l.Missed, dec, l.ObserverDrops, l.SendErrors)
	if l.Text != "" {
		s += ": " + l.Text
	}
	return s
}

// WriteMarkdown writes a summary for $GITHUB_STEP_SUMMARY: the verdict
// counts, a line per check with its loss, the reasons of checks not run and
// of environment errors, and the tables of the checks that did not pass.
func (r *Run) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	failed := r.Failed()
	env := r.EnvironmentErrors()
	status := "passed"
	switch {
	case len(failed) > 0:
		status = fmt.Sprintf("**%d failed**", len(failed))
	case len(env) > 0:
		status = fmt.Sprintf("**%d environment errors**", len(env))
	}
	fmt.Fprintf(&b, "## kpsim conformance: %s mode, %s\n\n", r.Mode, status)
	ran, notRun := r.Verdicts()
	fmt.Fprintf(&b, "%d verdicts ran, %d not run", ran, notRun)
	if notRun > 0 {
		b.WriteString(" (reasons listed)")
	}
	b.WriteString(". ")
	if r.Subject != "" {
		fmt.Fprintf(&b, "Subject %s %s, ", r.Subject, r.SubjectVersion)
	}
	fmt.Fprintf(&b, "Kernel %s, seed %d, family α %g (Holm)", r.Kernel, r.Seed, r.FamilyAlpha)
	if r.IPTablesBackend != "" {
		fmt.Fprintf(&b, ", iptables backend %s", r.IPTablesBackend)
	}
	if r.Layout != "" {
		fmt.Fprintf(&b, ", layout %s", r.Layout)
	}
	if len(r.Faults) > 0 {
		fmt.Fprintf(&b, ", faults %s", strings.Join(r.Faults, ", "))
	}
	fmt.Fprintf(&b, ", %.1f s.\n\n", r.Duration.Seconds())
	b.WriteString("| scenario | check | verdict | test | p | n | α | lost (missed) |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Suites {
		if s.SetupError != "" {
			fmt.Fprintf(&b, "| %s | setup | error | | | | | |\n", s.Scenario)
		}
		for _, c := range s.Checks {
			v := c.Verdict
			if c.ErrorKind != "" {
				v += " (" + c.ErrorKind + ")"
			}
			if c.Verdict != Pass {
				v = "**" + v + "**"
			}
			loss := ""
			if c.Loss != nil {
				loss = fmt.Sprintf("%d (%d)", c.Loss.Lost, c.Loss.Missed)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.3g | %d | %.2g | %s |\n", s.Scenario, mdEscape(c.Name), v, c.Test, c.P, c.N, c.Alpha, loss)
		}
	}
	mdList(&b, "Not run (left out of the Holm family):", r.NotRunReasons())
	mdList(&b, "Environment errors (the machine or the observation, not the dataplane):", env)
	var devs []string
	for _, s := range r.Suites {
		for _, d := range s.Deviations {
			devs = append(devs, fmt.Sprintf("%s / %s: %s", s.Scenario, d.Name, d.Evidence))
		}
	}
	sort.Strings(devs)
	mdList(&b, "Known deviations of kube-proxy from the documented semantics (reported, not failed):", devs)
	for _, s := range r.Suites {
		for _, c := range s.Checks {
			// Every table (shares and their intervals), and every check
			// that did not pass.
			if c.Verdict != Pass && c.Verdict != NotRun || len(c.Table) > 0 {
				fmt.Fprintf(&b, "\n<details><summary>%s / %s</summary>\n\n```\n%s```\n</details>\n", s.Scenario, mdEscape(c.Name), c.Summary())
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mdList writes a titled bullet list, nothing when the list is empty.
func mdList(b *strings.Builder, title string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s\n\n", title)
	for _, it := range items {
		fmt.Fprintf(b, "- %s\n", it)
	}
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
