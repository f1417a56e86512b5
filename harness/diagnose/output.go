package diagnose

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/kpsim/kpsim/harness/report"
)

// maxEvidence is how many evidence lines a finding shows in the table.
const maxEvidence = 8

func num(f Float, format string) string {
	if !f.Valid() {
		return "-"
	}
	return fmt.Sprintf(format, float64(f))
}

func evidenceText(l Line) string {
	switch {
	case l.File != "" && l.Line > 0:
		return fmt.Sprintf("%s:%d: %s", l.File, l.Line, l.Text)
	case l.File != "":
		return fmt.Sprintf("%s: %s", l.File, l.Text)
	}
	return l.Text
}

func (r *Report) header() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s, kube-proxy mode %s)", r.File, r.Format, orDash(r.Mode))
	if r.Before != "" {
		fmt.Fprintf(&b, ", counts since %s", r.Before)
		if r.Interval > 0 {
			fmt.Fprintf(&b, " (%s earlier)", r.Interval)
		}
	}
	if r.API != "" {
		fmt.Fprintf(&b, "; API %s", r.API)
	}
	if r.Node != "" {
		fmt.Fprintf(&b, "; node %s (%s)", r.Node, r.NodeHow)
	}
	if len(r.Peers) > 0 {
		fmt.Fprintf(&b, "; other nodes %s", strings.Join(r.Peers, ", "))
	}
	if r.Conntrack != nil {
		fmt.Fprintf(&b, "; conntrack %s", r.Conntrack.File)
	}
	if r.Counters {
		fmt.Fprintf(&b, "\nverdict: Pearson %s of the counts against the intended split, Holm over %d tested port(s) at α = %g; power for a share off by %g %%", r.Test, r.Tested, r.Alpha, 100*r.MDE)
	} else {
		b.WriteString("\nno counters: structure only")
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteTable prints the report as text: one line per port, then the
// findings, explanations and notes with their evidence.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintln(w, r.header())
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PORT\tENDPOINTS\tN\tVERDICT\tP\tPOWER")
	for _, p := range r.Ports {
		n := "-"
		if r.Counters {
			n = fmt.Sprint(p.N)
			if p.Tested != "" && p.Tested != "connections" {
				n += fmt.Sprintf(" (%d %s)", p.TestN, p.Tested)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", p.Label(), len(p.Endpoints), n, p.Verdict, num(p.P, "%.3g"), num(p.Power, "%.3f"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := r.writeExternalTable(w); err != nil {
		return err
	}
	if err := r.writePlacementTable(w); err != nil {
		return err
	}
	if r.Conntrack != nil {
		if err := r.Conntrack.writeTable(w); err != nil {
			return err
		}
	}
	for _, lvl := range []Level{LevelFinding, LevelExplanation, LevelNote} {
		first := true
		for _, f := range r.Findings {
			if f.Level != lvl {
				continue
			}
			if first {
				fmt.Fprintf(w, "\n%sS\n", strings.ToUpper(string(lvl)))
				first = false
			}
			where := ""
			if f.Port != "" {
				where = f.Port + ": "
			}
			fmt.Fprintf(w, "- %s%s [%s]\n", where, f.Message, f.Kind)
			for i, l := range f.Evidence {
				if i == maxEvidence {
					fmt.Fprintf(w, "    … %d more lines (-o json or -o markdown list them all)\n", len(f.Evidence)-maxEvidence)
					break
				}
				fmt.Fprintf(w, "    %s\n", evidenceText(l))
			}
		}
	}
	if !r.Problems() {
		fmt.Fprintln(w, "\nnothing wrong found")
	}
	return nil
}

// WriteJSON prints the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteMarkdown prints the report as Markdown: the ports table, each
// port's endpoints with shares and intervals, then the findings.
func (r *Report) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "# sim diagnose: %s\n\n", r.File)
	for _, l := range strings.Split(r.header(), "\n") {
		fmt.Fprintf(w, "%s\n\n", l)
	}
	fmt.Fprintln(w, "| port | endpoints | n | verdict | p | Holm p | power |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, p := range r.Ports {
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s |\n", p.Label(), len(p.Endpoints), p.N, p.Verdict, num(p.P, "%.3g"), num(p.Adjusted, "%.3g"), num(p.Power, "%.3f"))
	}
	for _, lvl := range []Level{LevelFinding, LevelExplanation, LevelNote} {
		first := true
		for _, f := range r.Findings {
			if f.Level != lvl {
				continue
			}
			if first {
				fmt.Fprintf(w, "\n## %ss\n\n", strings.ToUpper(string(lvl[:1]))+string(lvl[1:]))
				first = false
			}
			where := ""
			if f.Port != "" {
				where = "**" + f.Port + "**: "
			}
			fmt.Fprintf(w, "- %s%s (`%s`)\n", where, f.Message, f.Kind)
			if len(f.Evidence) > 0 {
				fmt.Fprintln(w, "\n  ```")
				for _, l := range f.Evidence {
					fmt.Fprintf(w, "  %s\n", evidenceText(l))
				}
				fmt.Fprintln(w, "  ```")
			}
		}
	}
	fmt.Fprintln(w, "\n## Ports")
	for _, p := range r.Ports {
		fmt.Fprintf(w, "\n### %s\n\n", p.Label())
		fmt.Fprintf(w, "%s, chain `%s`, scheduler %s", p.Key, p.Chain, p.Scheduler)
		if p.Affinity != "" {
			fmt.Fprintf(w, ", affinity %s", p.Affinity)
		}
		if p.LocalOnly {
			fmt.Fprint(w, ", Local endpoints only")
		}
		fmt.Fprintln(w)
		if p.Statement != "" {
			fmt.Fprintf(w, "\n%s\n", p.Statement)
		}
		fmt.Fprintln(w, "\n| endpoint | P (rules) | intended | observed | expected | share | interval |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		for _, e := range p.Endpoints {
			iv := "-"
			if e.Lo.Valid() && e.Hi.Valid() {
				iv = fmt.Sprintf("[%.4f, %.4f]", float64(e.Lo), float64(e.Hi))
			}
			fmt.Fprintf(w, "| %s | %.6f | %.6f | %d | %.1f | %.4f | %s |\n", e.Addr, e.P, e.Intended, e.Observed, e.Expected, e.Share, iv)
		}
	}
	r.writeExternalMarkdown(w)
	if r.Conntrack != nil {
		r.Conntrack.writeMarkdown(w)
	}
	return nil
}

// plots is the share plot input: one check per port with a finding and
// counts, its rows the endpoints' observed and intended counts with the
// simultaneous intervals.
func (r *Report) plots() *report.Run {
	flagged := map[string]bool{}
	for _, f := range r.Findings {
		if f.Level == LevelFinding && f.Port != "" {
			flagged[f.Port] = true
		}
	}
	run := &report.Run{Mode: r.Mode}
	suite := &report.Suite{Scenario: "diagnose"}
	for _, p := range r.Ports {
		if !flagged[p.Label()] || p.N == 0 || len(p.Endpoints) < 2 || !r.Counters {
			continue
		}
		c := &report.Check{Name: p.Label(), N: int(min(p.N, 1<<53)), Verdict: report.Fail}
		for _, e := range p.Endpoints {
			row := report.Row{Outcome: e.Addr.String(), Observed: float64(e.Observed), Expected: e.Expected}
			if e.Lo.Valid() && e.Hi.Valid() {
				row.CILow, row.CIHigh = float64(e.Lo), float64(e.Hi)
			}
			c.Table = append(c.Table, row)
		}
		suite.Checks = append(suite.Checks, c)
	}
	if len(suite.Checks) == 0 {
		return nil
	}
	run.Suites = []*report.Suite{suite}
	return run
}

// WriteDir writes report.json and report.md into dir (created if missing),
// and a share plot (diagnose--PORT.png) per port with a finding and counts.
func (r *Report) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("could not create the output folder: %w", err)
	}
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{{"report.json", r.WriteJSON}, {"report.md", r.WriteMarkdown}} {
		path := filepath.Join(dir, f.name)
		fh, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("could not write %s: %w", path, err)
		}
		err = f.write(fh)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("could not write %s: %w", path, err)
		}
	}
	if run := r.plots(); run != nil {
		return run.WritePlots(dir)
	}
	return nil
}
