package report

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// row is one line of the per-mode summary: a label and one cell per mode.
type row struct {
	label string
	cells func(m *Mode) string
}

func (r *Report) rows() []row {
	return []row{
		{"connections", func(m *Mode) string { return count(m.Connections.Total) }},
		{"accepted / dropped / rejected", func(m *Mode) string {
			c := m.Connections
			return fmt.Sprintf("%s / %s / %s", count(c.Accepted), count(c.Dropped), count(c.Rejected))
		}},
		{"rules or objects: max node / total", func(m *Mode) string {
			return fmt.Sprintf("%s / %s", count(int64(m.Rules.ObjectsMax)), count(int64(m.Rules.ObjectsTotal)))
		}},
		{"sync time p50 / p99", func(m *Mode) string {
			return fmt.Sprintf("%s / %s", dur(m.Sync.P50Seconds), dur(m.Sync.P99Seconds))
		}},
		{"full sync (largest node)", func(m *Mode) string { return dur(m.Sync.FullSeconds) }},
		{"syncs: full / partial / periodic", func(m *Mode) string {
			return fmt.Sprintf("%d / %d / %d", m.Sync.Full, m.Sync.Partial, m.Sync.Periodic)
		}},
		{"first packet: rules p50 / p99", func(m *Mode) string {
			return fmt.Sprintf("%s / %s", num(m.FirstPacket.RulesP50), num(m.FirstPacket.RulesP99))
		}},
		{"conntrack peak (busiest node)", func(m *Mode) string {
			return fmt.Sprintf("%s entries, %s", count(m.Conntrack.PeakEntries), byteSize(m.Conntrack.Bytes))
		}},
		{"distribution: tested / failed", func(m *Mode) string {
			d := m.Distribution
			return fmt.Sprintf("%d / %d (Holm α %g)", d.Tested, d.Failed, d.FamilyAlpha)
		}},
		{"distribution: worst p", func(m *Mode) string {
			d := m.Distribution
			if d.Tested == 0 {
				return "-"
			}
			return fmt.Sprintf("%.3g %s", d.WorstP, d.WorstPServicePort)
		}},
		{"distribution: worst |obs−exp|", func(m *Mode) string {
			d := m.Distribution
			if d.Tested == 0 {
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
			if m.Mode != "iptables" {
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
}

// WriteTable prints the per-mode summary and the checks for people.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	hdr := []string{"MODE"}
	for _, m := range r.Modes {
		hdr = append(hdr, m.Mode)
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
	tests := 0
	for _, u := range c.Units {
		dec += u.Decisions
		mis += u.Mismatched
		inWin += u.InWindow
		misr += u.Misrouted
		bound += u.Bound
		viol += u.Violations
		known += u.Known
		if u.Test != "" {
			tests++
			minP = math.Min(minP, u.P)
		}
	}
	s := fmt.Sprintf("%d node(s), %s decisions, %s mismatched", len(c.Units), count(dec), count(mis))
	switch c.Type {
	case "distribution":
		if tests > 0 {
			s += fmt.Sprintf("; %d chi-square(s), min p %.3g", tests, minP)
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

// WriteMarkdown writes report.md.
func (r *Report) WriteMarkdown(w io.Writer) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# Simulation: %s\n\n", r.Scenario)
	p("Scenario `%s`, seed %d. Generated by `sim run`; do not edit.\n\n", r.File, r.Seed)
	if c := r.Cluster; c != nil {
		p("Cluster: %d nodes, %d Services (%d service ports), %d endpoints (%d ready); ClientIP affinity %d, internalTrafficPolicy Local %d.\n\n",
			len(c.Nodes), c.Services, c.ServicePorts, c.Endpoints.Total, c.Endpoints.Ready, c.Policies.ClientIPAffinity, c.Policies.InternalTrafficPolicyLocal)
	}
	t := r.Traffic
	p("Traffic: %s connections over %s of virtual time (%s/s) from %d client nodes and %d source addresses to %d service ports; connection duration %s.\n\n",
		count(t.Connections), dur(t.SpanSeconds), count(int64(math.Round(t.RatePerSecond))), t.ClientNodes, t.SourceAddresses, t.TargetServicePorts, t.ConnectionDuration)
	if len(r.Failed) > 0 {
		p("**%d check(s) failed:** %s\n\n", len(r.Failed), strings.Join(r.Failed, ", "))
	} else if len(r.Checks) > 0 {
		p("Every check passed.\n\n")
	}
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

	if len(r.Checks) > 0 {
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

	p("## Distribution\n\nA chi-square test per service port with at least two eligible endpoints and enough connections, against the oracle's shares, Holm-corrected over the tested service ports.\n\n")
	for _, m := range r.Modes {
		d := m.Distribution
		p("- %s: %d tested, %d skipped, %d failed at family α %g", m.Mode, d.Tested, d.Skipped, d.Failed, d.FamilyAlpha)
		if d.Tested > 0 {
			p("; worst p %.3g (%s), worst |observed − expected| share %.4f (%s)", d.WorstP, d.WorstPServicePort, d.WorstDeviation, d.WorstDeviationServicePort)
		}
		if len(d.FailedServicePorts) > 0 {
			p("; failed: %s", strings.Join(d.FailedServicePorts, ", "))
		}
		p(".\n")
	}
	if len(r.Modes) > 0 && r.Modes[0].Distribution.Note != "" {
		p("\n%s.\n", r.Modes[0].Distribution.Note)
	}
	p("\n![deviation](%s)\n\n", Files.Deviation)

	p("## Affinity and internalTrafficPolicy Local\n\n")
	for _, m := range r.Modes {
		a := m.Affinity
		p("- %s: %d ClientIP service ports; stickiness %.4f over %s connections of bound clients (99 %% CI %.4f–%.4f)", m.Mode, a.ServicePorts, a.Stickiness, count(a.Bound), a.CILow, a.CIHigh)
		if m.Mode == "iptables" {
			p("; recent-list losses %s", count(a.RecentEvictedLive))
		}
		p(". Local: %d service ports; black-holed (DROP) max %s, mean %s of a client node's connections (dropped or rejected: max %s).\n", m.Local.ServicePorts, pct(m.Local.MaxFraction), pct(m.Local.MeanFraction), pct(m.Local.MaxRefusedFraction))
	}
	p("\n")

	if len(r.Steps) > 0 {
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
	p("## What is modelled\n\n")
	for _, n := range r.Model {
		p("- %s\n", n)
	}
	p("\nCalibrations:\n\n")
	for _, c := range r.Calibrations {
		p("- %s/%s: %s (%d points)\n", c.Mode, c.Variant, c.Source, len(c.Points))
	}
	return nil
}

// count prints an integer with thousands separators.
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func num(x float64) string {
	if x == math.Trunc(x) {
		return count(int64(x))
	}
	return strconv.FormatFloat(x, 'f', 1, 64)
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
