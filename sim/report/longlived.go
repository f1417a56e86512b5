package report

import (
	"fmt"
	"image/color"
	"io"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// RequestClient is one client group with requests, as simulated.
type RequestClient struct {
	Name string `json:"name"`
	// Clients counts its clients (source addresses) over every node.
	Clients int `json:"clients"`
	// Pool is the connections per client and target service port (0: a
	// connection per request); MaxAgeSeconds their age (0: the whole
	// run); Pick the connection a request takes.
	Pool          int     `json:"pool"`
	MaxAgeSeconds float64 `json:"maxAgeSeconds,omitempty"`
	Pick          string  `json:"pick,omitempty"`
	// RatePerSecond is each client's request rate; Duration the requests'.
	RatePerSecond float64 `json:"ratePerSecond"`
	Duration      string  `json:"duration"`
}

// Requests counts a mode's requests over every client with requests.
type Requests struct {
	Total int64 `json:"total"`
	// Failed rode a connection the node refused (DROP, REJECT).
	Failed int64 `json:"failed"`
}

// LongLived follows the requests of the clients with requests to one
// service port in one mode: per pod, before and after the first scale
// event of its Service, and per time bin.
type LongLived struct {
	ServicePort string `json:"servicePort"`
	// Clients are the groups sending to it.
	Clients []string `json:"clients"`
	// Pods are its endpoints (ip:port), the order of every per-pod array.
	Pods       []string `json:"pods"`
	BinSeconds float64  `json:"binSeconds"`
	// Requests to it counted per pod; Stale those that reached a pod the
	// API no longer listed as eligible (their connection outlived it:
	// not counted in the shares); ConnectionsOpened its connections.
	Requests          int64 `json:"requests"`
	Stale             int64 `json:"stale"`
	ConnectionsOpened int64 `json:"connectionsOpened"`
	// Before is the window before the scale event (the whole run without
	// one), After the window from it to the end.
	Before Balance  `json:"before"`
	After  *Balance `json:"after,omitempty"`
	Scale  *Decay   `json:"scale,omitempty"`
	// Per bin: the pods the API allows at its start, and per pod the
	// requests started, the mean requests in flight and the mean
	// connections open ([bin][pod]).
	Eligible    []int       `json:"eligible"`
	PerBin      [][]int64   `json:"requestsPerBin"`
	InFlight    [][]float64 `json:"inFlightPerBin"`
	Connections [][]float64 `json:"connectionsPerBin"`
	// Findings say in sentences what the figures show.
	Findings []string `json:"findings"`
}

// Balance is how a window's connections, requests and requests in flight
// spread over the pods the API allowed at its end.
type Balance struct {
	FromSeconds float64    `json:"fromSeconds"`
	ToSeconds   float64    `json:"toSeconds"`
	Pods        []PodShare `json:"pods"`
	Connections Spread     `json:"connections"`
	Requests    Spread     `json:"requests"`
	InFlight    Spread     `json:"inFlight"`
	// PerBin is the spread bin by bin, over the window's whole bins.
	PerBin BinSpread `json:"perBin"`
}

// BinSpread is the busiest pod's share over the fair share bin by bin:
// its mean and 95th percentile over the bins. Requests in flight even out
// over a long window whatever the scheduler; bin by bin they show what a
// scheduler that counts them (IPVS lc, with a connection per request)
// does that one that does not (rr, a random choice) cannot.
type BinSpread struct {
	Bins         int     `json:"bins"`
	RequestsMean float64 `json:"requestsMean"`
	RequestsP95  float64 `json:"requestsP95"`
	InFlightMean float64 `json:"inFlightMean"`
	InFlightP95  float64 `json:"inFlightP95"`
}

// Spread is the busiest and idlest pod's share over the fair share (1/k
// of k pods).
type Spread struct {
	MaxOverFair float64 `json:"maxOverFair"`
	MinOverFair float64 `json:"minOverFair"`
	// Bound is the MaxOverFair that an even random spread of the units
	// counted exceeds with probability Alpha at most: connections (each on
	// a pod drawn uniformly) for Connections, requests (each balanced on
	// its own, as a connection per request is) for Requests; Even says
	// MaxOverFair is within it. No bound for requests in flight (0).
	Bound float64 `json:"bound,omitempty"`
	// ConnectionBound (requests only) is the bound when the requests'
	// connections are spread at random and each request rides its
	// connection: what long-lived connections can do at best with a
	// random choice. Within it, ByConnections.
	ConnectionBound float64 `json:"connectionBound,omitempty"`
	ByConnections   bool    `json:"withinConnectionBound,omitempty"`
	Alpha           float64 `json:"alpha,omitempty"`
	Even            bool    `json:"even"`
}

// PodShare is one pod's part of a window.
type PodShare struct {
	Pod string `json:"pod"`
	// Connections and InFlight are means over the window (connections
	// open, requests in flight); Requests counts those started.
	Connections     float64 `json:"connections"`
	Requests        int64   `json:"requests"`
	InFlight        float64 `json:"inFlight"`
	ConnectionShare float64 `json:"connectionShare"`
	RequestShare    float64 `json:"requestShare"`
	InFlightShare   float64 `json:"inFlightShare"`
}

// Decay is the request imbalance after a scale event, bin by bin, and how
// long it took to come within the even-spread bound.
type Decay struct {
	AtSeconds float64 `json:"atSeconds"`
	Replicas  int     `json:"replicas"`
	// PodsBefore and PodsAfter are the pods the API allowed before and
	// after it; NewPods those it added.
	PodsBefore int      `json:"podsBefore"`
	PodsAfter  int      `json:"podsAfter"`
	NewPods    []string `json:"newPods,omitempty"`
	// FromBin is the first bin at or after the event: Imbalance (the
	// busiest pod's request share over the fair share; 0 in a bin
	// without requests), Bound and NewPodsShare start there.
	FromBin      int       `json:"fromBin"`
	Imbalance    []float64 `json:"imbalance"`
	Bound        []float64 `json:"bound"`
	NewPodsShare []float64 `json:"newPodsShare,omitempty"`
	Alpha        float64   `json:"alpha"`
	// BoundRule says how Bound is computed.
	BoundRule string  `json:"boundRule"`
	Peak      float64 `json:"peak"`
	// Decayed: from some bin on, every bin is within its bound;
	// DecaySeconds is from the event to that bin's start (to one bin).
	Decayed      bool    `json:"decayed"`
	DecaySeconds float64 `json:"decaySeconds"`
	// Last is the imbalance of the last bin with requests.
	Last float64 `json:"last"`
}

// hasLongLived reports whether a mode follows requests.
func (r *Report) hasLongLived() bool {
	for _, m := range r.Modes {
		if len(m.LongLived) > 0 {
			return true
		}
	}
	return false
}

// writeLongLived writes the requests section of report.md; nothing
// without clients with requests.
func (r *Report) writeLongLived(p func(string, ...any)) {
	if !r.hasLongLived() {
		return
	}
	p("## Long-lived connections and requests\n\n")
	p("Clients with requests:\n\n")
	for _, c := range r.Traffic.RequestClients {
		pool := "no pool (a connection per request)"
		if c.Pool > 0 {
			age := "kept for the run"
			if c.MaxAgeSeconds > 0 {
				age = "maxAge " + dur(c.MaxAgeSeconds)
			}
			pool = fmt.Sprintf("a pool of %d per target (%s, %s)", c.Pool, age, c.Pick)
		}
		p("- %s: %d clients, %s, %s requests/s each, duration %s\n", c.Name, c.Clients, pool, num(c.RatePerSecond), c.Duration)
	}
	p("\nA request rides its connection to that connection's pod. Shares are over the pods the API allows; max ÷ fair is the busiest pod's share over 1/k. The bounds are what an even random spread exceeds with probability α at most: of the connections (each on a pod drawn uniformly) for connections, of the requests (each balanced on its own) for requests; after a scale event, bin by bin, of the connections with their requests (what a random choice of connections gives at best).\n\n")
	for i, ll := range r.Modes[0].LongLived {
		p("### %s\n\n| mode | requests (stale) | before: connections / requests / in flight, max ÷ fair (bound) | in flight bin by bin: mean, p95 | after the scale event |\n|---|---|---|---|---|\n", ll.ServicePort)
		for _, m := range r.Modes {
			if i >= len(m.LongLived) {
				continue
			}
			l := m.LongLived[i]
			b := l.Before
			p("| %s | %s (%s) | %.2f (%.2f) / %.2f (%.2f) / %.2f | %.3f, %.3f | %s |\n", m.Mode, count(l.Requests), count(l.Stale),
				b.Connections.MaxOverFair, b.Connections.Bound, b.Requests.MaxOverFair, b.Requests.Bound, b.InFlight.MaxOverFair,
				b.PerBin.InFlightMean, b.PerBin.InFlightP95, decayCell(l.Scale, l.BinSeconds))
		}
		p("\n")
		for _, m := range r.Modes {
			if i < len(m.LongLived) {
				for _, f := range m.LongLived[i].Findings {
					p("- %s: %s\n", m.Mode, f)
				}
			}
		}
		p("\n")
	}
	p("![request share per pod](%s)\n\n", Files.Requests)
}

// longLivedRows are the summary's rows for the followed service ports:
// the busiest pod's connection and request shares over the fair share
// (before the scale event), and the scale event's imbalance.
func (r *Report) longLivedRows() []row {
	var rows []row
	for i := range r.Modes[0].LongLived {
		at := func(m *Mode) *LongLived {
			if i < len(m.LongLived) {
				return &m.LongLived[i]
			}
			return nil
		}
		name := r.Modes[0].LongLived[i].ServicePort
		rows = append(rows, row{name + ": conns / requests max÷fair", func(m *Mode) string {
			if l := at(m); l != nil {
				return fmt.Sprintf("%.2f / %.2f", l.Before.Connections.MaxOverFair, l.Before.Requests.MaxOverFair)
			}
			return "-"
		}})
		if r.Modes[0].LongLived[i].Scale != nil {
			rows = append(rows, row{name + ": after the scale event", func(m *Mode) string {
				if l := at(m); l != nil {
					return decayCell(l.Scale, l.BinSeconds)
				}
				return "-"
			}})
		}
	}
	return rows
}

// decayCell is a scale event's imbalance in a few words.
func decayCell(d *Decay, bin float64) string {
	if d == nil {
		return "-"
	}
	s := fmt.Sprintf("peak %.2f, ", d.Peak)
	switch {
	case d.Decayed && d.DecaySeconds < bin:
		s += "within bound in 1st bin"
	case d.Decayed:
		s += "within bound after " + dur(d.DecaySeconds)
	default:
		s += "never within bound"
	}
	return s + fmt.Sprintf(", last %.2f", d.Last)
}

// requestsPlot: per followed port (rows) and mode (columns), each pod's
// request share per bin over virtual time, with the fair share (1/k of
// the pods the API allows) dashed.
func (r *Report) requestsPlot(w io.Writer) error {
	rows := len(r.Modes[0].LongLived)
	cols := len(r.Modes)
	grid := make([][]*plot.Plot, rows)
	for i := range rows {
		grid[i] = make([]*plot.Plot, cols)
		for j, m := range r.Modes {
			if i >= len(m.LongLived) {
				grid[i][j] = plot.New()
				continue
			}
			pl, err := sharePanel(&m.LongLived[i], string(m.Mode))
			if err != nil {
				return err
			}
			grid[i][j] = pl
		}
	}
	img := vgimg.New(plotW/2*vg.Length(max(2, cols)), plotH/1.6*vg.Length(rows))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 2, PadY: vg.Millimeter * 2, PadTop: vg.Millimeter, PadBottom: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: vg.Millimeter * 2}
	cs := plot.Align(grid, tiles, dc)
	for i := range rows {
		for j := range cols {
			grid[i][j].Draw(cs[i][j])
		}
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("could not write the request share plot: %w", err)
	}
	return nil
}

// sharePanel is one port's request share per pod in one mode.
func sharePanel(l *LongLived, mode string) (*plot.Plot, error) {
	pl := newPlot(mode+": "+l.ServicePort, "virtual time (s)", "request share")
	pl.Title.TextStyle.Font.Size = vg.Points(9)
	pl.Legend.Left = false
	pl.Legend.TextStyle.Font.Size = vg.Points(7)
	var fair plotter.XYs
	top := 0.0
	lines := make([]plotter.XYs, len(l.Pods))
	for b, row := range l.PerBin {
		var n int64
		for _, x := range row {
			n += x
		}
		if n == 0 {
			continue
		}
		t := (float64(b) + 0.5) * l.BinSeconds
		for ep, x := range row {
			y := float64(x) / float64(n)
			lines[ep] = append(lines[ep], plotter.XY{X: t, Y: y})
			top = max(top, y)
		}
		if k := l.Eligible[b]; k > 0 {
			fair = append(fair, plotter.XY{X: t, Y: 1 / float64(k)})
		}
	}
	for ep, xys := range lines {
		if len(xys) == 0 {
			continue
		}
		if err := addLineW(pl, ep, strings.TrimSuffix(l.Pods[ep], ":0"), xys, false, vg.Points(1)); err != nil {
			return nil, err
		}
	}
	if len(fair) > 0 {
		fl, err := plotter.NewLine(fair)
		if err != nil {
			return nil, fmt.Errorf("could not plot the fair share: %w", err)
		}
		fl.Color = color.Black
		fl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		pl.Add(fl)
		pl.Legend.Add("fair", fl)
	}
	pl.Y.Min, pl.X.Min = 0, 0
	// Room above the lines for the legend, a line per pod.
	pl.Y.Max = top * (1.25 + 0.07*float64(len(l.Pods)))
	pl.X.Max = float64(len(l.PerBin)) * l.BinSeconds
	return pl, nil
}
