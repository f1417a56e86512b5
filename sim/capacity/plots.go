package capacity

import (
	"fmt"
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

const (
	plotW = 7 * vg.Inch
	plotH = 4.5 * vg.Inch
)

type plotFile struct {
	name string
	draw func(io.Writer) error
}

// series is one variant's metric against size: the value, its band and
// whether each point is extrapolated.
type series struct {
	x, y, lo, hi []float64
	ex           []bool
}

type metricPlot struct {
	file, title, unit string
	log               bool
	// at returns a row's value, band and extrapolation; ok false skips it.
	at func(r *Row) (y, lo, hi float64, ex, ok bool)
}

var metricPlots = []metricPlot{
	{"objects.png", "Objects per node (rules, elements, servers)", "objects", true, func(r *Row) (float64, float64, float64, bool, bool) {
		v := float64(r.Objects)
		return v, v, v, false, true
	}},
	{"full-sync.png", "Full sync time", "seconds", true, func(r *Row) (float64, float64, float64, bool, bool) {
		e := r.FullSync
		return e.Seconds, e.Low, e.High, e.Extrapolated, e.Seconds > 0
	}},
	{"partial-sync.png", "Partial sync time", "seconds", true, func(r *Row) (float64, float64, float64, bool, bool) {
		e := r.PartialSync
		return e.Seconds, e.Low, e.High, e.Extrapolated, e.Seconds > 0
	}},
	{"programming-latency.png", "Network programming latency p99", "seconds", true, func(r *Row) (float64, float64, float64, bool, bool) {
		l := r.Latency
		if l == nil || l.P99 <= 0 {
			return 0, 0, 0, false, false
		}
		return l.P99, l.P99Low, l.P99High, l.Extrapolated, true
	}},
	{"first-packet.png", "Rules a first packet walks, p99", "rules", true, func(r *Row) (float64, float64, float64, bool, bool) {
		v := r.FirstPacket.RulesP99
		return v, v, v, false, v > 0
	}},
	{"first-packet-node-port.png", "Rules a node port's first packet walks, p99", "rules", true, func(r *Row) (float64, float64, float64, bool, bool) {
		if r.FirstPacket.NodePort == nil {
			return 0, 0, 0, false, false
		}
		v := r.FirstPacket.NodePort.RulesP99
		return v, v, v, false, v > 0
	}},
}

func (res *Result) plots() []plotFile {
	var out []plotFile
	for _, mp := range metricPlots {
		out = append(out, plotFile{mp.file, func(w io.Writer) error { return res.plot(mp, w) }})
	}
	return out
}

func (res *Result) seriesOf(mp metricPlot, vi int) series {
	var s series
	for _, sz := range res.Sizes {
		y, lo, hi, ex, ok := mp.at(&sz.Rows[vi])
		if !ok || y <= 0 {
			continue
		}
		s.x = append(s.x, float64(sz.Services))
		s.y, s.lo, s.hi, s.ex = append(s.y, y), append(s.lo, math.Max(lo, y*1e-3)), append(s.hi, math.Max(hi, y)), append(s.ex, ex)
	}
	return s
}

// plot draws one metric against the Service count: a line per variant,
// solid where the figure lies in the calibrated range and dashed where it
// is extrapolated, its band shaded, and each variant's measured range of
// Services shaded behind.
func (res *Result) plot(mp metricPlot, w io.Writer) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("could not draw %q: %v", mp.title, v)
		}
	}()
	p := plot.New()
	p.Title.Text = mp.title + " (dashed: extrapolated; shaded: calibrated Services)"
	p.X.Label.Text, p.Y.Label.Text = "Services", mp.unit
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	all := make([]series, len(res.Models))
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for vi := range res.Models {
		all[vi] = res.seriesOf(mp, vi)
		for i := range all[vi].y {
			ymin, ymax = math.Min(ymin, all[vi].lo[i]), math.Max(ymax, all[vi].hi[i])
		}
	}
	if math.IsInf(ymin, 0) {
		ymin, ymax = 1, 10
	}
	if mp.log {
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	}
	for vi, m := range res.Models {
		if err := res.shadeRange(p, vi, m, ymin, ymax); err != nil {
			return err
		}
	}
	for vi, m := range res.Models {
		if err := drawSeries(p, vi, m.Variant.String(), all[vi]); err != nil {
			return err
		}
	}
	wt, err := p.WriterTo(plotW, plotH, "png")
	if err != nil {
		return fmt.Errorf("could not draw %q: %w", mp.title, err)
	}
	_, err = wt.WriteTo(w)
	return err
}

func translucent(i int, a uint8) color.Color {
	r, g, b, _ := plotutil.Color(i).RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: a}
}

// shadeRange shades the Services a variant's calibration measured.
func (res *Result) shadeRange(p *plot.Plot, vi int, m Model, ymin, ymax float64) error {
	if m.MaxServices <= 0 || m.MinServices <= 0 {
		return nil
	}
	lo, hi := float64(m.MinServices), float64(m.MaxServices)
	if hi == lo {
		lo, hi = lo*0.97, hi*1.03
	}
	poly, err := plotter.NewPolygon(plotter.XYs{{X: lo, Y: ymin}, {X: hi, Y: ymin}, {X: hi, Y: ymax}, {X: lo, Y: ymax}})
	if err != nil {
		return err
	}
	poly.Color = translucent(vi, 28)
	poly.LineStyle.Width = 0
	p.Add(poly)
	p.Legend.Add(fmt.Sprintf("%s calibrated %d-%d", m.Variant, m.MinServices, m.MaxServices), poly)
	return nil
}

// drawSeries draws a variant's band and its line, dashed on each segment
// that reaches an extrapolated point.
func drawSeries(p *plot.Plot, vi int, name string, s series) error {
	if len(s.y) == 0 {
		return nil
	}
	if len(s.y) > 1 {
		var band plotter.XYs
		for i := range s.x {
			band = append(band, plotter.XY{X: s.x[i], Y: s.hi[i]})
		}
		for i := len(s.x) - 1; i >= 0; i-- {
			band = append(band, plotter.XY{X: s.x[i], Y: s.lo[i]})
		}
		poly, err := plotter.NewPolygon(band)
		if err != nil {
			return err
		}
		poly.Color = translucent(vi, 50)
		poly.LineStyle.Width = 0
		p.Add(poly)
	}
	var first *plotter.Scatter
	for i := range s.x {
		seg := plotter.XYs{{X: s.x[i], Y: s.y[i]}}
		if i+1 < len(s.x) {
			seg = append(seg, plotter.XY{X: s.x[i+1], Y: s.y[i+1]})
		}
		dashed := s.ex[i] || (i+1 < len(s.x) && s.ex[i+1])
		pts, err := plotter.NewScatter(seg[:1])
		if err != nil {
			return err
		}
		pts.Color = plotutil.Color(vi)
		p.Add(pts)
		if first == nil {
			first = pts
		}
		if len(seg) < 2 {
			continue
		}
		l, err := plotter.NewLine(seg)
		if err != nil {
			return err
		}
		l.Color, l.Width = plotutil.Color(vi), vg.Points(1.5)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
	}
	// The legend shows the variant's colour, not a line style: a variant's
	// line is solid in one part and dashed in another.
	p.Legend.Add(name, first)
	return nil
}
