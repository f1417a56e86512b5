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
)

// Run is a whole conformance run: one suite per scenario.
type Run struct {
	Mode            string        `json:"mode"`
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
	Scenario   string         `json:"scenario"`
	File       string         `json:"file"`
	SetupError string         `json:"setupError,omitempty"`
	Duration   time.Duration  `json:"durationNs"`
	Checks     []*Check       `json:"checks"`
	Deviations []Deviation    `json:"knownDeviations,omitempty"`
	Figures    map[string]any `json:"figures,omitempty"`
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
	Witness  string        `json:"witness,omitempty"`
	Duration time.Duration `json:"durationNs"`
}

// Row is one cell of the observed-against-expected table.
type Row struct {
	Outcome  string  `json:"outcome"` // ip:port, DROP or REJECT
	Observed float64 `json:"observed"`
	Expected float64 `json:"expected"`
	Counter  float64 `json:"ruleCounter,omitempty"`
}

// Deviation is a known difference between kube-proxy's mechanism and the
// documented semantics, with its measured evidence. It never fails a run.
type Deviation struct {
	Name     string `json:"name"`
	Evidence string `json:"evidence"`
}

// Failed lists the checks that failed or errored, as "scenario/check".
func (r *Run) Failed() []string {
	var out []string
	for _, s := range r.Suites {
		if s.SetupError != "" {
			out = append(out, s.Scenario+"/setup")
		}
		for _, c := range s.Checks {
			if c.Verdict != Pass {
				out = append(out, s.Scenario+"/"+c.Name)
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
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
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
	SystemOut  string          `xml:"system-out,omitempty"`
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
	if r.IPTablesBackend != "" {
		props = append(props, junitProperty{"iptablesBackend", r.IPTablesBackend})
	}
	if r.Layout != "" {
		props = append(props, junitProperty{"layout", r.Layout})
	}
	for _, s := range r.Suites {
		su := junitSuite{Name: s.Scenario, Time: secs(s.Duration), Properties: append(props, junitProperty{"file", s.File})}
		if s.SetupError != "" {
			su.Cases = append(su.Cases, junitCase{Name: "setup", Classname: s.Scenario, Time: "0",
				Error: &junitFailure{Message: s.SetupError, Type: "setup"}})
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
				jc.Error = &junitFailure{Message: c.Message, Type: c.Type, Body: c.Summary()}
				su.Errors++
			}
			su.Cases = append(su.Cases, jc)
		}
		su.Tests = len(su.Cases)
		js.Tests += su.Tests
		js.Failures += su.Failures
		js.Errors += su.Errors
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
	if c.Message != "" {
		fmt.Fprintf(&b, " (%s)", c.Message)
	}
	b.WriteString("\n")
	if c.Test != "" {
		fmt.Fprintf(&b, "  %s: statistic %.4g, df %d, p %.4g, n %d, effect %.4g, alpha %.3g, seed %d\n",
			c.Test, c.Statistic, c.DF, c.P, c.N, c.EffectSize, c.Alpha, c.Seed)
	}
	if c.SpecVerdict != "" {
		fmt.Fprintf(&b, "  documented semantics: %s\n", c.SpecVerdict)
	}
	if len(c.Table) > 0 {
		fmt.Fprintf(&b, "  %-22s %10s %10s\n", "outcome", "observed", "expected")
		for _, r := range c.Table {
			fmt.Fprintf(&b, "  %-22s %10.0f %10.1f\n", r.Outcome, r.Observed, r.Expected)
		}
	}
	if c.Witness != "" {
		fmt.Fprintf(&b, "  rule counters: %s\n", c.Witness)
	}
	return b.String()
}

// WriteMarkdown writes a summary for $GITHUB_STEP_SUMMARY: a line per
// check, and the tables of the failed ones.
func (r *Run) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	failed := r.Failed()
	status := "passed"
	if len(failed) > 0 {
		status = fmt.Sprintf("**%d failed**", len(failed))
	}
	fmt.Fprintf(&b, "## kpsim conformance: %s mode, %s\n\n", r.Mode, status)
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
	b.WriteString("| scenario | check | verdict | test | p | n | α |\n|---|---|---|---|---|---|---|\n")
	for _, s := range r.Suites {
		if s.SetupError != "" {
			fmt.Fprintf(&b, "| %s | setup | error | | | | |\n", s.Scenario)
		}
		for _, c := range s.Checks {
			v := c.Verdict
			if v != Pass {
				v = "**" + v + "**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.3g | %d | %.2g |\n", s.Scenario, mdEscape(c.Name), v, c.Test, c.P, c.N, c.Alpha)
		}
	}
	var devs []string
	for _, s := range r.Suites {
		for _, d := range s.Deviations {
			devs = append(devs, fmt.Sprintf("- %s / %s: %s", s.Scenario, d.Name, d.Evidence))
		}
	}
	if len(devs) > 0 {
		sort.Strings(devs)
		b.WriteString("\nKnown deviations of kube-proxy from the documented semantics (reported, not failed):\n\n")
		b.WriteString(strings.Join(devs, "\n"))
		b.WriteString("\n")
	}
	for _, s := range r.Suites {
		for _, c := range s.Checks {
			if c.Verdict != Pass {
				fmt.Fprintf(&b, "\n<details><summary>%s / %s</summary>\n\n```\n%s```\n</details>\n", s.Scenario, mdEscape(c.Name), c.Summary())
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
