package report

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// shareRow is one endpoint of a share plot.
type shareRow struct {
	name                       string
	observed, expected, lo, hi float64
}

// shares returns the check's endpoint rows as shares of n: the rows the
// oracle expects a share for (Expected > 0), and any other row with
// observations (an outcome the oracle excludes). Nothing when the check
// has no distribution (fewer than two expected outcomes).
func (c *Check) shares() []shareRow {
	if c.N <= 0 {
		return nil
	}
	n := float64(c.N)
	var out []shareRow
	expected := 0
	for _, r := range c.Table {
		if r.Expected <= 0 && r.Observed == 0 {
			continue
		}
		if r.Expected > 0 {
			expected++
		}
		out = append(out, shareRow{name: r.Outcome, observed: r.Observed / n, expected: r.Expected / n, lo: r.CILow, hi: r.CIHigh})
	}
	if expected < 2 {
		return nil
	}
	return out
}

// PlotName is the file name of a check's share plot: scenario and check
// name, every character outside [A-Za-z0-9._-] replaced by '_'.
func PlotName(scenario, check string) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
				return r
			}
			return '_'
		}, s)
	}
	return clean(scenario) + "--" + clean(check) + ".png"
}

// WritePlots writes, for every check with a share table, a PNG of the
// observed share of each outcome against the expected share, with the
// share's confidence interval as error bars when the check has one. Files
// are named by PlotName, in dir (created if missing).
func (r *Run) WritePlots(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("could not create the plot folder: %w", err)
	}
	for _, s := range r.Suites {
		for _, c := range s.Checks {
			rows := c.shares()
			if rows == nil {
				continue
			}
			path := filepath.Join(dir, PlotName(s.Scenario, c.Name))
			if err := writeSharePlot(path, s.Scenario+" / "+c.Name, c, rows); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeSharePlot(path, title string, c *Check, rows []shareRow) (err error) {
	defer func() {
		// gonum/plot panics on data it cannot draw: an error instead.
		if v := recover(); v != nil {
			err = fmt.Errorf("could not draw %s: %v", path, v)
		}
	}()
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "outcome"
	p.Y.Label.Text = fmt.Sprintf("share of %d probes", c.N)
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	var obs, exp plotter.XYs
	var bars errorPoints
	names := make([]string, len(rows))
	for i, row := range rows {
		x := float64(i)
		names[i] = row.name
		obs = append(obs, plotter.XY{X: x, Y: row.observed})
		exp = append(exp, plotter.XY{X: x, Y: row.expected})
		if row.hi > 0 {
			bars = append(bars, errorPoint{x: x, y: row.observed, lo: row.observed - row.lo, hi: row.hi - row.observed})
		}
	}
	e, err := plotter.NewScatter(exp)
	if err != nil {
		return fmt.Errorf("could not plot %s: %w", path, err)
	}
	e.Shape, e.Color, e.Radius = draw.BoxGlyph{}, plotutil.Color(1), vg.Points(3)
	o, err := plotter.NewScatter(obs)
	if err != nil {
		return fmt.Errorf("could not plot %s: %w", path, err)
	}
	o.Shape, o.Color, o.Radius = draw.CircleGlyph{}, plotutil.Color(0), vg.Points(3)
	p.Add(e, o)
	p.Legend.Add("expected", e)
	p.Legend.Add("observed", o)
	if len(bars) > 0 {
		eb, err := plotter.NewYErrorBars(bars)
		if err != nil {
			return fmt.Errorf("could not plot %s: %w", path, err)
		}
		eb.Color = plotutil.Color(0)
		p.Add(eb)
		p.Title.Text += " (bars: simultaneous CI)"
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 1.2
	p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = draw.XRight, draw.YCenter
	width := max(7*vg.Inch, vg.Length(len(rows))*0.25*vg.Inch)
	if err := p.Save(width, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	return nil
}

type errorPoint struct{ x, y, lo, hi float64 }

type errorPoints []errorPoint

func (e errorPoints) Len() int                    { return len(e) }
func (e errorPoints) XY(i int) (float64, float64) { return e[i].x, e[i].y }
func (e errorPoints) YError(i int) (float64, float64) {
	return e[i].lo, e[i].hi
}
