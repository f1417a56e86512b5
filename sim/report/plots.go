package report

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/kpsim/kpsim/sim/cost"
)

// Plot sizes.
const (
	plotW = 7 * vg.Inch
	plotH = 4.5 * vg.Inch
)

type plotFile struct {
	name string
	draw func(io.Writer) error
}

// plots lists the PNG files the report draws.
func (r *Report) plots() []plotFile {
	out := []plotFile{
		{Files.Rules, r.rulesPlot},
		{Files.SyncTime, r.syncPlot},
		{Files.Deviation, r.deviationPlot},
	}
	if r.hasPValues() {
		out = append(out, plotFile{Files.PValues, r.pValuePlot})
	}
	for _, m := range r.Modes {
		if m.Timeline != nil {
			out = append(out, plotFile{Files.Flapping, r.flappingPlot})
			break
		}
	}
	if r.hasLongLived() {
		out = append(out, plotFile{Files.Requests, r.requestsPlot})
	}
	if r.External != nil && len(r.External.Services) > 0 {
		out = append(out, plotFile{Files.External, r.externalPlot})
	}
	return out
}

// curveServices are the Service counts of the cost-model curves.
var curveServices = []int{1000, 1500, 2000, 3000, 5000, 7500, 10000, 15000, 20000, 30000}

// endpointsPerService is the scenario's mean, the curves' shape parameter.
func (r *Report) endpointsPerService() int {
	if c := r.Cluster; c != nil && c.ServicePorts > 0 {
		return max(1, int(math.Round(float64(c.Endpoints.Total)/float64(c.ServicePorts))))
	}
	return 10
}

func (r *Report) services() float64 {
	if r.Cluster != nil && r.Cluster.ServicePorts > 0 {
		return float64(r.Cluster.ServicePorts)
	}
	return 1
}

func (r *Report) calibration(m *Mode) (cost.Calibration, bool) {
	return cost.Find(r.Calibrations, m.Mode, m.Sync.Variant)
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

func logAxes(p *plot.Plot) {
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
}

func save(p *plot.Plot, w io.Writer) (err error) {
	defer func() {
		// gonum/plot panics on data it cannot draw (a log axis with a
		// value <= 0): report it as an error instead.
		if v := recover(); v != nil {
			err = fmt.Errorf("could not draw %q: %v", p.Title.Text, v)
		}
	}()
	wt, err := p.WriterTo(plotW, plotH, "png")
	if err != nil {
		return fmt.Errorf("could not draw %q: %w", p.Title.Text, err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("could not write %q: %w", p.Title.Text, err)
	}
	return nil
}

func addLine(p *plot.Plot, i int, name string, xys plotter.XYs, dashed bool) error {
	return addLineW(p, i, name, xys, dashed, vg.Points(1.5))
}

func addLineW(p *plot.Plot, i int, name string, xys plotter.XYs, dashed bool, width vg.Length) error {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return fmt.Errorf("could not plot %s: %w", name, err)
	}
	l.Color = plotutil.Color(i)
	l.Width = width
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

func addPoints(p *plot.Plot, i int, name string, xys plotter.XYs, shape draw.GlyphDrawer) error {
	s, err := plotter.NewScatter(xys)
	if err != nil {
		return fmt.Errorf("could not plot %s: %w", name, err)
	}
	s.Color = plotutil.Color(i)
	s.Radius = vg.Points(4)
	s.Shape = shape
	p.Add(s)
	if name != "" {
		p.Legend.Add(name, s)
	}
	return nil
}

// rulesPlot: objects per node against the Service count, the cost model's
// curve per mode and this run's largest node.
func (r *Report) rulesPlot(w io.Writer) error {
	eps := r.endpointsPerService()
	p := newPlot(fmt.Sprintf("Rules or objects per node (%d endpoints per Service)", eps), "Services", "objects per node")
	logAxes(p)
	for i, m := range r.Modes {
		var xys plotter.XYs
		for _, s := range curveServices {
			xys = append(xys, plotter.XY{X: float64(s), Y: float64(cost.SyntheticObjects(m.Mode, s, eps))})
		}
		if err := addLine(p, i, string(m.Mode)+" (cost model)", xys, false); err != nil {
			return err
		}
		if err := addPoints(p, i, string(m.Mode)+" (this run, largest node)", plotter.XYs{{X: r.services(), Y: float64(max(1, m.Rules.ObjectsMax))}}, draw.CircleGlyph{}); err != nil {
			return err
		}
	}
	return save(p, w)
}

// syncPlot: full sync time against the Service count from each mode's
// fitted cost model (sim/cost Model): the curve solid inside the measured
// range and dashed outside it, its 95 % band shaded, the calibration's
// points as markers, the mode's other variants as thin lines, and this
// run's sync times.
func (r *Report) syncPlot(w io.Writer) error {
	eps := r.endpointsPerService()
	p := newPlot(fmt.Sprintf("Sync time per mode (%d endpoints per Service): model, band shaded, dashed = extrapolated", eps), "Services", "seconds")
	logAxes(p)
	for i, m := range r.Modes {
		cal, ok := r.calibration(&m)
		if !ok {
			continue
		}
		if err := modelCurve(p, i, fmt.Sprintf("%s/%s", m.Mode, cal.Variant), cal, eps, true); err != nil {
			return err
		}
		// The mode's other variants (iptables legacy, nftables fast).
		for _, c := range r.Calibrations {
			if c.Mode != m.Mode || c.Variant == cal.Variant {
				continue
			}
			if err := modelCurve(p, i, fmt.Sprintf("%s/%s", m.Mode, c.Variant), c, eps, false); err != nil {
				return err
			}
		}
		if m.Sync.FullSeconds > 0 {
			if err := addPoints(p, i, string(m.Mode)+" (this run: full, p50)", plotter.XYs{{X: r.services(), Y: m.Sync.FullSeconds}, {X: r.services(), Y: math.Max(m.Sync.P50Seconds, 1e-3)}}, draw.CircleGlyph{}); err != nil {
				return err
			}
		}
	}
	return save(p, w)
}

// curveGrid are the Service counts a model curve is drawn at: log-spaced
// over the plot's span plus the measured range's ends.
func curveGrid(m cost.Model) []float64 {
	lo, hi := float64(curveServices[0]), float64(curveServices[len(curveServices)-1])
	lo = math.Min(lo, float64(m.MinServices))
	var xs []float64
	for x := lo; x < hi*1.0001; x *= math.Pow(10, 0.05) {
		xs = append(xs, x)
	}
	xs = append(xs, float64(m.MinServices), float64(m.MaxServices))
	slices.Sort(xs)
	return slices.Compact(xs)
}

// modelCurve draws one calibration's fitted full sync curve: solid inside
// its measured range, dashed outside, with the band shaded and the points
// marked when main is set (thin, unshaded, and without points otherwise).
func modelCurve(p *plot.Plot, i int, name string, cal cost.Calibration, eps int, main bool) error {
	m, err := cost.NewModel(cal)
	if err != nil {
		return err
	}
	var in, below, above, lo, hi plotter.XYs
	for _, s := range curveGrid(m) {
		e := m.Full(cost.SyntheticCounts(cal.Mode, int(math.Round(s)), eps))
		if !(e.Seconds > 0) {
			continue
		}
		xy := plotter.XY{X: s, Y: e.Seconds}
		switch {
		case s < float64(m.MinServices):
			below = append(below, xy)
		case s > float64(m.MaxServices):
			above = append(above, xy)
		default:
			in = append(in, xy)
		}
		// The ends of the measured range join the dashed parts.
		if s == float64(m.MinServices) {
			below = append(below, xy)
		}
		if s == float64(m.MaxServices) {
			above = append(above, xy)
		}
		lo, hi = append(lo, plotter.XY{X: s, Y: e.Low}), append(hi, plotter.XY{X: s, Y: e.High})
	}
	if main && len(lo) > 1 {
		poly := append(slices.Clone(hi), reversed(lo)...)
		g, err := plotter.NewPolygon(poly)
		if err != nil {
			return fmt.Errorf("could not plot the band of %s: %w", name, err)
		}
		c := color.NRGBAModel.Convert(plotutil.Color(i)).(color.NRGBA)
		c.A = 50
		g.Color, g.LineStyle.Width = c, 0
		p.Add(g)
	}
	label := name + " (model, measured range)"
	if !main {
		label = name + " (model)"
	}
	for _, part := range []struct {
		xys    plotter.XYs
		name   string
		dashed bool
	}{{in, label, false}, {below, "", true}, {above, "", true}} {
		if len(part.xys) < 2 {
			continue
		}
		width := vg.Points(1.5)
		if !main {
			width = vg.Points(0.7)
		}
		if err := addLineW(p, i, part.name, part.xys, part.dashed, width); err != nil {
			return err
		}
	}
	if !main {
		return nil
	}
	// The points of the plot's shape only: a calibration may hold other
	// endpoint counts (nftables' 1 and 50), which lie off this curve.
	var pts plotter.XYs
	for _, pt := range cal.Points {
		if pt.EndpointsPerService > 0 && pt.EndpointsPerService != eps {
			continue
		}
		ratio := 1.0
		if e := cal.Emulation; e != nil && e.Ratio > 0 {
			ratio = e.At(pt.Services)
		}
		if pt.FullSeconds > 0 {
			pts = append(pts, plotter.XY{X: float64(pt.Services), Y: pt.FullSeconds / ratio})
		}
	}
	if len(pts) == 0 {
		return nil
	}
	return addPoints(p, i, name+" (measured)", pts, draw.PlusGlyph{})
}

func reversed(xys plotter.XYs) plotter.XYs {
	out := slices.Clone(xys)
	slices.Reverse(out)
	return out
}

// deviationPlot: the histogram of each tested service port's largest
// |observed − expected| endpoint share, per mode.
func (r *Report) deviationPlot(w io.Writer) error {
	p := newPlot("Engine self-check, per service port: largest |observed − expected| endpoint share", "|observed − expected| share (log scale; the first bin holds everything below it)", "service ports")
	p.Legend.Left = false
	for i, m := range r.Modes {
		h := m.SelfCheck.Histogram
		if len(h) == 0 {
			continue
		}
		var xys plotter.XYs
		for _, b := range h {
			lo := b.Lo
			if lo <= 0 {
				lo = b.Hi / 10 // a log axis has no 0
			}
			xys = append(xys, plotter.XY{X: lo, Y: float64(b.Count)})
		}
		last := h[len(h)-1]
		xys = append(xys, plotter.XY{X: last.Hi, Y: float64(last.Count)})
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("could not plot the histogram: %w", err)
		}
		l.StepStyle = plotter.PostStep
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%s, %d checked, %d rejected)", m.Mode, m.SelfCheck.Method, m.SelfCheck.ServicePorts, m.SelfCheck.Rejected), l)
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min = 0
	if p.X.Max <= 0 {
		// No mode was tested (ipvs lc, sh, ...): an empty plot over the
		// histogram's range, where the log axis would have no range at all.
		p.X.Min, p.X.Max = 1e-5, 1
	}
	return save(p, w)
}

// hasPValues reports whether a mode's self-check has p-values to plot.
func (r *Report) hasPValues() bool {
	for _, m := range r.Modes {
		if u := m.SelfCheck.Uniformity; u != nil && u.N > 0 {
			return true
		}
	}
	return false
}

// pValuePlot: the histogram of the engine self-check's per-service-port
// p-values in each mode tested by chi-square, with the count every bin
// expects when they are uniform (dashed).
func (r *Report) pValuePlot(w io.Writer) error {
	p := newPlot("Engine self-check: per-service-port p-values (uniform when the engines draw as the oracle says)", "p-value", "service ports per bin")
	p.Legend.Left, p.Legend.Top = false, false
	for i, m := range r.Modes {
		u := m.SelfCheck.Uniformity
		if u == nil || len(u.Histogram) == 0 || u.N == 0 {
			continue
		}
		var xys plotter.XYs
		for _, b := range u.Histogram {
			xys = append(xys, plotter.XY{X: b.Lo, Y: float64(b.Count)})
		}
		last := u.Histogram[len(u.Histogram)-1]
		xys = append(xys, plotter.XY{X: last.Hi, Y: float64(last.Count)})
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("could not plot the p-value histogram: %w", err)
		}
		l.StepStyle = plotter.PostStep
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%d ports, KS D %.3f, p %.3g)", m.Mode, u.N, u.D, u.P), l)
		each := float64(u.N) / float64(len(u.Histogram))
		if err := addLine(p, i, "", plotter.XYs{{X: 0, Y: each}, {X: 1, Y: each}}, true); err != nil {
			return err
		}
	}
	p.X.Min, p.X.Max = 0, 1
	p.Y.Min = 0
	return save(p, w)
}

// flappingPlot: the followed service port's eligible endpoints (top) and
// its misrouted connections per bin in each mode (bottom), over virtual
// time.
func (r *Report) flappingPlot(w io.Writer) error {
	var tl *Timeline
	for _, m := range r.Modes {
		if m.Timeline != nil {
			tl = m.Timeline
			break
		}
	}
	top := newPlot("Flapping: "+tl.ServicePort, "", "eligible endpoints")
	top.Legend.Left = false
	var elig plotter.XYs
	for b, e := range tl.Eligible {
		elig = append(elig, plotter.XY{X: float64(b) * tl.BinSeconds, Y: float64(e)})
	}
	el, err := plotter.NewLine(elig)
	if err != nil {
		return fmt.Errorf("could not plot eligible endpoints: %w", err)
	}
	el.StepStyle = plotter.PostStep
	el.Color = color.Black
	el.Width = vg.Points(1.5)
	top.Add(el)
	top.Y.Min = 0
	bottom := newPlot("", "virtual time (s)", fmt.Sprintf("misrouted per %s", dur(tl.BinSeconds)))
	bottom.Legend.Left = false
	for i, m := range r.Modes {
		if m.Timeline == nil {
			continue
		}
		var xys plotter.XYs
		for b, n := range m.Timeline.Misrouted {
			xys = append(xys, plotter.XY{X: float64(b) * tl.BinSeconds, Y: float64(n)})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("could not plot misrouted connections: %w", err)
		}
		l.StepStyle = plotter.PostStep
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1)
		bottom.Add(l)
		bottom.Legend.Add(string(m.Mode), l)
	}
	bottom.Y.Min = 0
	top.X.Min, bottom.X.Min = 0, 0
	top.X.Max = float64(len(tl.Eligible)) * tl.BinSeconds
	bottom.X.Max = top.X.Max
	img := vgimg.New(plotW, plotH*1.3)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Millimeter * 2, PadTop: vg.Millimeter, PadBottom: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: vg.Millimeter * 3}
	plots := [][]*plot.Plot{{top}, {bottom}}
	cs := plot.Align(plots, tiles, dc)
	top.Draw(cs[0][0])
	bottom.Draw(cs[1][0])
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("could not write the flapping plot: %w", err)
	}
	return nil
}
