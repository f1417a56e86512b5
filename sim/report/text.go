package report

import (
	"fmt"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

// row is one line of the per-mode summary: a label and one cell per mode.
type row struct {
	label string
	cells func(m *Mode) string
}

func (r *Report) rows() []row {
	rows := []row{
		{"connections", func(m *Mode) string { return count(m.Connections.Total) }},
		{"accepted / dropped / rejected", func(m *Mode) string {
			c := m.Connections
			return fmt.Sprintf("%s / %s / %s", count(c.Accepted), count(c.Dropped), count(c.Rejected))
		}},
		{"rules or objects: max node / total", func(m *Mode) string {
			return fmt.Sprintf("%s / %s", count(int64(m.Rules.ObjectsMax)), count(int64(m.Rules.ObjectsTotal)))
		}},
		{"sync time p50 / p99", func(m *Mode) string {
			s := fmt.Sprintf("%s / %s", dur(m.Sync.P50Seconds), dur(m.Sync.P99Seconds))
			if m.Sync.Extrapolated() {
				s += " (cost model extrapolated)"
			}
			return s
		}},
		{"full sync (largest node)", func(m *Mode) string { return syncCell(m.Sync.FullSeconds, m.Sync.FullEstimate, m.Sync.Calibration) }},
		{"syncs: full / partial / periodic", func(m *Mode) string {
			return fmt.Sprintf("%d / %d / %d", m.Sync.Full, m.Sync.Partial, m.Sync.Periodic)
		}},
		{"first packet: rules p50 / p99", func(m *Mode) string {
			return fmt.Sprintf("%s / %s", num(m.FirstPacket.RulesP50), num(m.FirstPacket.RulesP99))
		}},
		{"  via node port p50 / p99", func(m *Mode) string { return walkCell(m.FirstPacket.NodePort) }},
		{"  via LB or external IP p50 / p99", func(m *Mode) string { return walkCell(m.FirstPacket.LoadBalancer) }},
		{"conntrack peak (busiest node)", func(m *Mode) string {
			return fmt.Sprintf("%s entries, %s", count(m.Conntrack.PeakEntries), byteSize(m.Conntrack.Bytes))
		}},
		{"engine self-check (simulator, not dataplane)", func(m *Mode) string { return selfCheckCell(&m.SelfCheck) }},
		{"self-check p-values: KS D / p", func(m *Mode) string {
			u := m.SelfCheck.Uniformity
			if u == nil || u.N == 0 {
				return "-"
			}
			return fmt.Sprintf("%.3f / %.3g", u.D, u.P)
		}},
		{"self-check p ≤ .05 / p ≥ .95 (expected)", func(m *Mode) string {
			u := m.SelfCheck.Uniformity
			if u == nil || u.N == 0 {
				return "-"
			}
			return fmt.Sprintf("%d / %d (%.1f each)", u.AtMost05, u.AtLeast95, u.Expected)
		}},
		{"self-check worst p", func(m *Mode) string {
			d := m.SelfCheck
			if d.Method != MethodChiSquare || d.ServicePorts == 0 {
				return "-"
			}
			return fmt.Sprintf("%.3g %s", d.WorstP, d.WorstPServicePort)
		}},
		{"self-check worst |obs−exp| share", func(m *Mode) string {
			d := m.SelfCheck
			if d.ServicePorts == 0 {
				return "-"
			}
			return fmt.Sprintf("%.4f %s", d.WorstDeviation, d.WorstDeviationServicePort)
		}},
		{"affinity stickiness (bound conns)", func(m *Mode) string {
			a := m.Affinity
			if a.Bound == 0 {
				return "-"
			}
			return fmt.Sprintf("%.4f (%s)", a.Stickiness, count(a.Bound))
		}},
		{"affinity: recent-list losses", func(m *Mode) string {
			if m.Mode != cluster.ModeIPTables {
				return "n/a"
			}
			return count(m.Affinity.RecentEvictedLive)
		}},
		{"Local black-holed: max / mean node", func(m *Mode) string {
			return fmt.Sprintf("%s / %s", pct(m.Local.MaxFraction), pct(m.Local.MeanFraction))
		}},
		{"Local refused (DROP+REJECT): max", func(m *Mode) string { return pct(m.Local.MaxRefusedFraction) }},
		{"exposure window p50 / max", func(m *Mode) string {
			if len(m.Flapping.Steps) == 0 {
				return "-"
			}
			return fmt.Sprintf("%s / %s", dur(m.Flapping.WindowP50Seconds), dur(m.Flapping.WindowMaxSeconds))
		}},
		{"in window: conns / misrouted", func(m *Mode) string {
			return fmt.Sprintf("%s / %s", count(m.Flapping.ConnectionsInWindow), count(m.Flapping.Misrouted))
		}},
		{"mismatched after sync", func(m *Mode) string { return count(m.Flapping.MismatchedAfterSync) }},
	}
	rows = append(rows, r.externalRows()...)
	return append(rows, r.longLivedRows()...)
}

// walkCell is a path's first-packet rules p50 / p99, "-" without traffic.
func walkCell(p *cost.PathWalk) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%s / %s", num(p.RulesP50), num(p.RulesP99))
}

// selfCheckCell is the self-check's verdict in a few words.
func selfCheckCell(d *SelfCheck) string {
	switch {
	case d.Method == MethodNone:
		return "not tested (" + d.Reason + ")"
	case d.ServicePorts == 0:
		return "nothing to test"
	case d.Method == MethodRotation:
		return fmt.Sprintf("%s: rotation, %d ports, %d broken", d.Verdict, d.ServicePorts, d.Rejected)
	}
	s := fmt.Sprintf("%s: chi-square, %d ports, %d rejected", d.Verdict, d.ServicePorts, d.Rejected)
	if u := d.Uniformity; u != nil && u.Rejected {
		s += ", p-values not uniform"
	}
	return s
}

// familyLine describes the report's Holm family in one sentence.
func (r *Report) familyLine() string {
	f := r.Family
	return fmt.Sprintf("One Holm family for the whole report: m = %d tests (%d chi-square units of the distribution checks, %d service ports of the engine self-check, %d p-value uniformity tests) at family α %g; %d rejected. Rotation and exact checks spend no α.",
		f.Size, f.CheckUnits, f.SelfCheckPorts, f.UniformityTests, f.Alpha, f.Rejected)
}

// WriteTable prints the per-mode summary and the checks for people.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	hdr := []string{"MODE"}
	for _, m := range r.Modes {
		hdr = append(hdr, string(m.Mode))
	}
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	for _, rw := range r.rows() {
		cells := []string{rw.label}
		for i := range r.Modes {
			cells = append(cells, rw.cells(&r.Modes[i]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s (it tests the simulator's code, not any dataplane).\n%s\n", upperFirst(SelfCheckWhat), r.familyLine())
	for _, m := range r.Modes {
		for _, f := range m.SelfCheck.Findings {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	if len(r.Checks) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MODE\tCHECK\tVERDICT\tDETAIL")
		for _, c := range r.Checks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Mode, c.Name, c.Verdict, checkDetail(&c))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// checkDetail is a one-line account of a check.
func checkDetail(c *Check) string {
	if c.Message != "" && c.Verdict != Pass {
		return c.Message
	}
	var dec, mis, inWin, misr, bound, viol, known int64
	minP := math.Inf(1)
	tests, rotations, spread := 0, 0, 0.0
	for _, u := range c.Units {
		dec += u.Decisions
		mis += u.Mismatched
		inWin += u.InWindow
		misr += u.Misrouted
		bound += u.Bound
		viol += u.Violations
		known += u.Known
		switch u.Test {
		case "":
		case "rotation":
			rotations++
			spread = math.Max(spread, u.Statistic)
		default:
			tests++
			minP = math.Min(minP, u.P)
		}
	}
	s := fmt.Sprintf("%d node(s), %s decisions, %s mismatched", len(c.Units), count(dec), count(mis))
	switch c.Type {
	case "distribution":
		if tests > 0 {
			s += fmt.Sprintf("; %d stratified chi-square(s), min p %.3g", tests, minP)
		}
		if rotations > 0 {
			s += fmt.Sprintf("; %d rotation check(s), largest max − min count %g", rotations, spread)
		}
	case "affinity":
		s += fmt.Sprintf("; %s bound, %d violation(s)", count(bound), viol)
		if known > 0 {
			s += fmt.Sprintf(", %d lost to a known deviation", known)
		}
	case "flapping":
		s += fmt.Sprintf("; in window %s, misrouted %s", count(inWin), count(misr))
	}
	return s
}

// WriteMarkdown writes report.md: a header, then one section after another.
func (r *Report) WriteMarkdown(w io.Writer) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	r.writeHeader(p)
	r.writeModes(p)
	r.writeChecks(p)
	r.writeSelfCheck(p)
	r.writeAffinity(p)
	r.writeSteps(p)
	r.writeExternal(p)
	r.writeLongLived(p)
	r.writeModel(p)
	return nil
}

// writeHeader writes the title, the cluster and traffic in a sentence each,
// and which checks failed.
func (r *Report) writeHeader(p func(string, ...any)) {
	p("# Simulation: %s\n\n", r.Scenario)
	p("Scenario `%s`, seed %d. Generated by `sim run`; do not edit.\n\n", r.File, r.Seed)
	if c := r.Cluster; c != nil {
		p("Cluster: %d nodes, %d Services (%d service ports), %d endpoints (%d ready); ClientIP affinity %d, internalTrafficPolicy Local %d.\n\n",
			len(c.Nodes), c.Services, c.ServicePorts, c.Endpoints.Total, c.Endpoints.Ready, c.Policies.ClientIPAffinity, c.Policies.InternalTrafficPolicyLocal)
	}
	t := r.Traffic
	p("Traffic: %s connections over %s of virtual time (%s/s) from %d client nodes and %d source addresses to %d service ports; connection duration %s.\n\n",
		count(t.Connections), dur(t.SpanSeconds), count(int64(math.Round(t.RatePerSecond))), t.ClientNodes, t.SourceAddresses, t.TargetServicePorts, t.ConnectionDuration)
	if n := len(t.RequestClients); n > 0 {
		p("Besides, %d client group(s) with requests send at their own rate, over pools of long-lived connections or a connection per request (their connections are in each mode's count): see Long-lived connections and requests.\n\n", n)
	}
	if len(r.Failed) > 0 {
		p("**%d check(s) failed:** %s\n\n", len(r.Failed), strings.Join(r.Failed, ", "))
	} else if len(r.Checks) > 0 {
		p("Every check passed.\n\n")
	}
}

// writeModes writes the per-mode table, what each mode's objects count and
// which calibration its sync times come from.
func (r *Report) writeModes(p func(string, ...any)) {
	p("## Per mode\n\n| |")
	for _, m := range r.Modes {
		p(" %s |", m.Mode)
	}
	p("\n|---|")
	for range r.Modes {
		p("---|")
	}
	p("\n")
	for _, rw := range r.rows() {
		p("| %s |", strings.ReplaceAll(rw.label, "|", "\\|"))
		for i := range r.Modes {
			p(" %s |", strings.ReplaceAll(rw.cells(&r.Modes[i]), "|", "\\|"))
		}
		p("\n")
	}
	p("\nRules and objects are sim/cost's counts per node (")
	for i, m := range r.Modes {
		if i > 0 {
			p("; ")
		}
		p("%s: %s", m.Mode, m.Rules.Measure)
	}
	p("). Sync times come from the calibration of each mode:\n\n")
	for _, m := range r.Modes {
		p("- %s: %s\n", m.Mode, m.Sync.Calibration)
	}
	p("\n![rules](%s) ![sync time](%s)\n\n", Files.Rules, Files.SyncTime)
}

// writeChecks writes the checks' verdicts and the known deviations they
// met; nothing when the scenario has no checks.
func (r *Report) writeChecks(p func(string, ...any)) {
	if len(r.Checks) == 0 {
		return
	}
	p("## Checks\n\n| mode | check | verdict | detail |\n|---|---|---|---|\n")
	for _, c := range r.Checks {
		p("| %s | %s | %s | %s |\n", c.Mode, c.Name, c.Verdict, strings.ReplaceAll(checkDetail(&c), "|", "\\|"))
	}
	p("\n")
	for _, c := range r.Checks {
		for _, d := range c.Deviations {
			p("- %s (%s): known deviation: %s\n", c.Name, c.Mode, d)
		}
	}
	p("\n")
}

// writeAffinity writes each mode's ClientIP stickiness and the share of
// connections that internalTrafficPolicy Local refused.
func (r *Report) writeAffinity(p func(string, ...any)) {
	p("## Affinity and internalTrafficPolicy Local\n\n")
	for _, m := range r.Modes {
		a := m.Affinity
		p("- %s: %d ClientIP service ports; stickiness %.4f over %s connections of bound clients (99 %% CI %.4f–%.4f)", m.Mode, a.ServicePorts, a.Stickiness, count(a.Bound), a.CILow, a.CIHigh)
		if m.Mode == cluster.ModeIPTables {
			p("; recent-list losses %s", count(a.RecentEvictedLive))
		}
		p(". Local: %d service ports; black-holed (DROP) max %s, mean %s of a client node's connections (dropped or rejected: max %s).\n", m.Local.ServicePorts, pct(m.Local.MaxFraction), pct(m.Local.MeanFraction), pct(m.Local.MaxRefusedFraction))
	}
	p("\n")
}

// writeSteps writes each timeline step's exposure window and misrouted
// connections per mode; nothing when the scenario has no events.
func (r *Report) writeSteps(p func(string, ...any)) {
	if len(r.Steps) == 0 {
		return
	}
	p("## Events and exposure windows\n\nFrom each API write to the end of the sync that put it into a node's rules, that node's connections still follow the old rules. Window p50 / max over nodes; connections in the window and misrouted ones (reaching an endpoint the API no longer allows) over all nodes.\n\n")
	p("| step | at | write |")
	for _, m := range r.Modes {
		p(" %s window | %s misrouted |", m.Mode, m.Mode)
	}
	p("\n|---|---|---|")
	for range r.Modes {
		p("---|---|")
	}
	p("\n")
	for k, s := range r.Steps {
		p("| %d | %s | %s |", k+1, dur(s.AtSeconds), s.Description)
		for _, m := range r.Modes {
			sw := m.Flapping.Steps[k]
			open := ""
			if sw.Open > 0 {
				open = fmt.Sprintf(" (%d open)", sw.Open)
			}
			p(" %s / %s%s | %s of %s |", dur(sw.WindowP50Seconds), dur(sw.WindowMaxSeconds), open, count(sw.Misrouted), count(sw.ConnectionsInWindow))
		}
		p("\n")
	}
	p("\n![flapping](%s)\n\n", Files.Flapping)
}

// writeModel writes what the simulation models and the calibrations used.
func (r *Report) writeModel(p func(string, ...any)) {
	p("## What is modelled\n\n")
	for _, n := range r.Model {
		p("- %s\n", n)
	}
	p("\nCalibrations:\n\n")
	for _, c := range r.Calibrations {
		p("- %s/%s: %s (%d points)\n", c.Mode, c.Variant, c.Source, len(c.Points))
	}
}

// writeSelfCheck writes the engine self-check section of report.md.
func (r *Report) writeSelfCheck(p func(string, ...any)) {
	p("## %s\n\n", upperFirst(SelfCheckWhat))
	p("This section tests the simulator, not a dataplane: each mode's engine (sim/engine) draws the endpoint of every new connection, and the draws are held against the shares the oracle (sim/oracle) expects. A correct engine passes by construction, except with probability about α; a failure here is a bug in the simulator's engine or oracle and says nothing about any kernel. ")
	p("Random modes get a chi-square per service port, summed over its strata (one per version of the service port, per node where the expectation differs between nodes), and the per-port p-values are tested for uniformity (Kolmogorov-Smirnov against U(0,1)): too many small p-values mean the draws differ from the oracle, too many large ones a test that is too lenient. ")
	p("ipvs rr and wrr rotate deterministically, so a chi-square would pass by construction; they get a rotation check instead: in each (node, version) the eligible endpoints' counts may differ by at most the bound the scheduler allows (so their strata are per node, where the chi-square's are merged over the nodes that expect the same shares).\n\n")
	p("| mode | method | service ports checked / skipped | strata | rejected | p-values: KS D, p | p ≤ 0.05 / p ≥ 0.95 (expected each) | worst p | verdict |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range r.Modes {
		d := m.SelfCheck
		method := d.Method
		if d.Reason != "" {
			method += " (" + d.Reason + ")"
		}
		ks, tails, worst := "-", "-", "-"
		if u := d.Uniformity; u != nil && u.N > 0 {
			ks = fmt.Sprintf("%.3f, %.3g", u.D, u.P)
			tails = fmt.Sprintf("%d / %d (%.1f)", u.AtMost05, u.AtLeast95, u.Expected)
		}
		if d.Method == MethodChiSquare && d.ServicePorts > 0 {
			worst = fmt.Sprintf("%.3g (%s)", d.WorstP, d.WorstPServicePort)
		}
		if rt := d.Rotation; rt != nil {
			tails = fmt.Sprintf("closest to its bound: max − min %d, bound %d, in %s", rt.Spread, rt.Bound, rt.ServicePort)
		}
		p("| %s | %s | %d / %d | %d | %d | %s | %s | %s | %s |\n", m.Mode, method, d.ServicePorts, d.Skipped, d.Strata, d.Rejected, ks, strings.ReplaceAll(tails, "|", "\\|"), worst, d.Verdict)
	}
	p("\n")
	for _, m := range r.Modes {
		for _, f := range m.SelfCheck.Findings {
			p("- %s\n", f)
		}
		if len(m.SelfCheck.RejectedServicePorts) > 0 {
			p("- %s: rejected: %s\n", m.Mode, strings.Join(m.SelfCheck.RejectedServicePorts, ", "))
		}
	}
	p("\n%s\n\n", r.familyLine())
	if len(r.Modes) > 0 && r.Modes[0].SelfCheck.Note != "" {
		p("%s.\n\n", r.Modes[0].SelfCheck.Note)
	}
	if r.hasPValues() {
		p("![p-values](%s) ", Files.PValues)
	}
	p("![deviation](%s)\n\n", Files.Deviation)
}

// upperFirst capitalises the first letter.
func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// count prints an integer with thousands separators.
func count(n int64) string { return thousands.Sprintf("%d", n) }

// thousands prints numbers with English thousands separators.
var thousands = message.NewPrinter(language.English)

func num(x float64) string {
	if x == math.Trunc(x) {
		return count(int64(x))
	}
	return strconv.FormatFloat(x, 'f', 1, 64)
}

// syncCell prints a modelled sync time with its mark when the model
// extrapolates, and its band ("11.2 s (model, 9.1-14 s)") when it does
// not, so that no modelled figure reads as a measurement.
func syncCell(s float64, e *cost.Estimate, basis string) string {
	if e == nil {
		return dur(s)
	}
	kind := "model"
	if strings.Contains(basis, "not measured") {
		// A default that no calibration here measured (IPVS today).
		kind = "estimate, not measured"
	}
	if e.Extrapolated {
		return fmt.Sprintf("%s (%s, extrapolated, %sx the %s measured size; %s-%s)", dur(s), kind, cost.FactorString(e.Factor), where(e), dur(e.Low), dur(e.High))
	}
	return fmt.Sprintf("%s (%s, %s-%s)", dur(s), kind, dur(e.Low), dur(e.High))
}

func where(e *cost.Estimate) string {
	if e.Factor < 1 {
		return "smallest"
	}
	return "largest"
}

func dur(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1e-3:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1e3)
	case s < 120:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.1f min", s/60)
}

func pct(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) }

func byteSize(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
