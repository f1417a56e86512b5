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

	"github.com/kpsim/kpsim/sim/cluster"
)

// External is the traffic from outside the cluster: per destination of a
// Service (its node port, external IP or load-balancer IP), the share
// each pod received against the oracle's expectation, the busiest-to-idlest
// pod ratio, and the connections lost while a load balancer's health check
// lagged behind a node that lost its last local endpoint.
type External struct {
	Note    string           `json:"note"`
	Clients []ExternalClient `json:"clients"`
	// Services are the destinations that received connections, the worst
	// (largest expected busiest-to-idlest ratio) first.
	Services []ExternalService `json:"services"`
	// Lags are the health-check lags, in time order.
	Lags []HealthCheckLag `json:"healthCheckLags"`
	// Policies compare the busiest-to-idlest ratios of the Local and the
	// Cluster destinations, per mode.
	Policies []PolicyImbalance `json:"policies"`
}

// ExternalClient is one client group outside the cluster.
type ExternalClient struct {
	Name  string      `json:"name"`
	Via   cluster.Via `json:"via"`
	Nodes []string    `json:"nodes"`
	// HealthCheck describes the balancer's probes (via load-balancer).
	HealthCheck string `json:"healthCheck,omitempty"`
	Targets     int    `json:"targetServicePorts"`
}

// ExternalService is one destination of one service port.
type ExternalService struct {
	ServicePort string      `json:"servicePort"`
	Via         cluster.Via `json:"via"`
	// Policy is the externalTrafficPolicy (of the initial state).
	Policy string `json:"externalTrafficPolicy"`
	// Source is what the pods see as the connection's source: "client"
	// (the client's address is kept) or "node" (SNAT to a node address).
	Source string `json:"source"`
	// Pods are the initial state's endpoints the oracle expects traffic
	// at, with their node.
	Pods []ExternalPod `json:"pods"`
	// Expected is the oracle's busiest-to-idlest ratio under the Service's
	// policy; ExpectedLocal and ExpectedCluster the same placement's
	// under each policy.
	Expected        float64              `json:"expectedBusiestToIdlest"`
	ExpectedLocal   float64              `json:"expectedBusiestToIdlestLocal"`
	ExpectedCluster float64              `json:"expectedBusiestToIdlestCluster"`
	Modes           []ExternalModeShares `json:"modes"`
}

// ExternalPod is one pod of a destination.
type ExternalPod struct {
	Endpoint string `json:"endpoint"`
	Node     string `json:"node"`
	// Expected is the oracle's share; Local and Cluster the shares under
	// each policy with the same placement.
	Expected float64 `json:"expected"`
	Local    float64 `json:"expectedLocal"`
	Cluster  float64 `json:"expectedCluster"`
}

// ExternalModeShares is what one mode's engines did with a destination's
// connections of the initial state (decided by up-to-date rules, not held
// by affinity).
type ExternalModeShares struct {
	Mode cluster.Mode `json:"mode"`
	// Connections is every connection to the destination; Sample the
	// ones the shares are of.
	Connections int64 `json:"connections"`
	Sample      int64 `json:"sample"`
	// Shares, Low and High are each pod's share and its simultaneous
	// interval (Pods' order) at Confidence.
	Shares     []float64 `json:"shares"`
	Low        []float64 `json:"low"`
	High       []float64 `json:"high"`
	Confidence float64   `json:"confidence"`
	// Within: every expected share lies in its interval.
	Within          bool    `json:"withinIntervals"`
	BusiestToIdlest float64 `json:"busiestToIdlest"`
	// Dropped are the connections the nodes dropped; Lost the ones
	// forwarded whose replies never reach the client (ipvs, Local without
	// a local endpoint).
	Dropped int64 `json:"dropped"`
	Lost    int64 `json:"repliesLost"`
}

// HealthCheckLag is one node whose health check for a Service failed
// (its last ready local endpoint gone) while the balancer kept sending.
type HealthCheckLag struct {
	Step        int     `json:"step"`
	AtSeconds   float64 `json:"atSeconds"`
	ServicePort string  `json:"servicePort"`
	Client      string  `json:"client"`
	Node        string  `json:"node"`
	// LagSeconds runs from the API write to the probe that took the node
	// out (Noticed), or to when the check passed again or the run ended.
	LagSeconds float64 `json:"lagSeconds"`
	Noticed    bool    `json:"noticed"`
	// Expected is the number of connections the balancer sent the node
	// meanwhile; Modes what each mode did with them.
	Expected float64   `json:"expectedConnections"`
	Modes    []LagMode `json:"modes"`
}

// LagMode is one mode's connections to the node during a lag.
type LagMode struct {
	Mode        cluster.Mode `json:"mode"`
	Connections int64        `json:"connections"`
	// Dropped by the node's rules; Lost: forwarded without SNAT, replies
	// lost (ipvs); Misrouted: to an endpoint already gone, before the
	// node's sync (the exposure window).
	Dropped   int64 `json:"dropped"`
	Lost      int64 `json:"repliesLost"`
	Misrouted int64 `json:"misrouted"`
}

// PolicyImbalance is one mode's busiest-to-idlest ratios over the
// destinations of each policy.
type PolicyImbalance struct {
	Mode           cluster.Mode `json:"mode"`
	LocalCount     int          `json:"localDestinations"`
	LocalMedian    float64      `json:"localMedian"`
	LocalMax       float64      `json:"localMax"`
	ClusterCount   int          `json:"clusterDestinations"`
	ClusterMedian  float64      `json:"clusterMedian"`
	ClusterMax     float64      `json:"clusterMax"`
	WorstLocal     string       `json:"worstLocal,omitempty"`
	LagConnections int64        `json:"lagConnections"`
	LagFailed      int64        `json:"lagFailed"`
}

// maxExternalListed bounds the destinations report.md lists in full.
const maxExternalListed = 10

// writeExternal writes the external traffic section of report.md; nothing
// without external clients.
func (r *Report) writeExternal(p func(string, ...any)) {
	e := r.External
	if e == nil {
		return
	}
	p("## Traffic from outside the cluster\n\n%s\n\n", e.Note)
	for _, c := range e.Clients {
		p("- client %s: %s over %s, %d service ports", c.Name, c.Via, strings.Join(c.Nodes, ", "), c.Targets)
		if c.HealthCheck != "" {
			p("; health check %s", c.HealthCheck)
		}
		p("\n")
	}
	p("\n| mode | Local destinations: busiest/idlest median / max | Cluster: median / max | connections in health-check lags / failed |\n|---|---|---|---|\n")
	for _, pi := range e.Policies {
		p("| %s | %d: %s / %s | %d: %s / %s | %s / %s |\n", pi.Mode, pi.LocalCount, ratio(pi.LocalMedian), ratio(pi.LocalMax), pi.ClusterCount, ratio(pi.ClusterMedian), ratio(pi.ClusterMax), count(pi.LagConnections), count(pi.LagFailed))
	}
	p("\n")
	for i, s := range e.Services {
		if i == maxExternalListed {
			p("%d more destinations in report.json.\n\n", len(e.Services)-i)
			break
		}
		r.writeExternalService(p, &s)
	}
	if len(e.Lags) > 0 {
		p("### Health-check lags\n\n| step | at | service port | client | node | lag | expected conns | per mode: conns / dropped / replies lost / misrouted |\n|---|---|---|---|---|---|---|---|\n")
		for _, l := range e.Lags {
			var cells []string
			for _, m := range l.Modes {
				cells = append(cells, fmt.Sprintf("%s %s / %s / %s / %s", m.Mode, count(m.Connections), count(m.Dropped), count(m.Lost), count(m.Misrouted)))
			}
			lag := dur(l.LagSeconds)
			if !l.Noticed {
				lag += " (not taken out)"
			}
			p("| %d | %s | %s | %s | %s | %s | %.0f | %s |\n", l.Step, dur(l.AtSeconds), l.ServicePort, l.Client, l.Node, lag, l.Expected, strings.Join(cells, "; "))
		}
		p("\n")
	}
}

// writeExternalService writes one destination's pods table.
func (r *Report) writeExternalService(p func(string, ...any), s *ExternalService) {
	p("### %s via %s (externalTrafficPolicy %s, pods see the %s address)\n\n", s.ServicePort, s.Via, s.Policy, s.Source)
	p("Busiest/idlest pod: expected %s (Local %s, Cluster %s)", ratio(s.Expected), ratio(s.ExpectedLocal), ratio(s.ExpectedCluster))
	for _, m := range s.Modes {
		p("; %s %s", m.Mode, ratio(m.BusiestToIdlest))
	}
	p(".\n\n| pod | node | expected | if Local | if Cluster |")
	for _, m := range s.Modes {
		p(" %s share [interval] |", m.Mode)
	}
	p("\n|---|---|---|---|---|%s\n", strings.Repeat("---|", len(s.Modes)))
	for i, pod := range s.Pods {
		p("| %s | %s | %.4f | %.4f | %.4f |", pod.Endpoint, pod.Node, pod.Expected, pod.Local, pod.Cluster)
		for _, m := range s.Modes {
			if i < len(m.Shares) {
				p(" %.4f [%.4f, %.4f] |", m.Shares[i], m.Low[i], m.High[i])
			} else {
				p(" - |")
			}
		}
		p("\n")
	}
	p("\n")
	for _, m := range s.Modes {
		verdict := "every expected share inside its interval"
		if !m.Within {
			verdict = "SOME EXPECTED SHARE OUTSIDE ITS INTERVAL"
		}
		p("- %s: %s connections, %s in the sample (%s, %.1f%% simultaneous intervals); %s dropped, %s replies lost\n", m.Mode, count(m.Connections), count(m.Sample), verdict, 100*m.Confidence, count(m.Dropped), count(m.Lost))
	}
	p("\n")
}

func ratio(x float64) string {
	if x <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

// externalRows are the summary's rows for external traffic.
func (r *Report) externalRows() []row {
	e := r.External
	if e == nil {
		return nil
	}
	at := func(m *Mode) *PolicyImbalance {
		for i := range e.Policies {
			if e.Policies[i].Mode == m.Mode {
				return &e.Policies[i]
			}
		}
		return nil
	}
	return []row{
		{"external: busiest/idlest Local / Cluster", func(m *Mode) string {
			if pi := at(m); pi != nil {
				return fmt.Sprintf("%s / %s (max %s)", ratio(pi.LocalMedian), ratio(pi.ClusterMedian), ratio(pi.LocalMax))
			}
			return "-"
		}},
		{"external: health-check lag conns / failed", func(m *Mode) string {
			if pi := at(m); pi != nil {
				return fmt.Sprintf("%s / %s", count(pi.LagConnections), count(pi.LagFailed))
			}
			return "-"
		}},
	}
}

// maxPlotted bounds the destinations the external plot draws.
const maxPlotted = 6

// externalPlot: for the worst destinations, each pod's load (share ÷ the
// fair share, 1/pods) in each mode, beside what the oracle expects under
// Local and under Cluster with the same placement.
func (r *Report) externalPlot(w io.Writer) error {
	svcs := r.External.Services
	if len(svcs) > maxPlotted {
		svcs = svcs[:maxPlotted]
	}
	grid := make([][]*plot.Plot, len(svcs))
	for i := range svcs {
		pl, err := externalPanel(&svcs[i])
		if err != nil {
			return err
		}
		grid[i] = []*plot.Plot{pl}
	}
	img := vgimg.New(plotW, plotH/1.8*vg.Length(len(svcs)))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(svcs), Cols: 1, PadX: vg.Millimeter * 2, PadY: vg.Millimeter * 2, PadTop: vg.Millimeter, PadBottom: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: vg.Millimeter * 2}
	cs := plot.Align(grid, tiles, dc)
	for i := range grid {
		grid[i][0].Draw(cs[i][0])
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("could not write the external traffic plot: %w", err)
	}
	return nil
}

// externalPanel is one destination: pods on the x axis, load on the y
// axis; the expectation under Local and Cluster as dashed steps, each mode's
// measured load as points.
func externalPanel(s *ExternalService) (*plot.Plot, error) {
	pl := newPlot(fmt.Sprintf("%s via %s (%s)", s.ServicePort, s.Via, s.Policy), "pod (by node)", "load ÷ fair share")
	pl.Title.TextStyle.Font.Size = vg.Points(9)
	pl.Legend.TextStyle.Font.Size = vg.Points(7)
	pl.Legend.Top, pl.Legend.Left = true, false
	k := float64(len(s.Pods))
	var ticks []plot.Tick
	for i, pod := range s.Pods {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: pod.Node})
	}
	pl.X.Tick.Marker = plot.ConstantTicks(ticks)
	var loc, clu plotter.XYs
	top := 1.0
	for i, pod := range s.Pods {
		loc = append(loc, plotter.XY{X: float64(i), Y: pod.Local * k})
		clu = append(clu, plotter.XY{X: float64(i), Y: pod.Cluster * k})
		top = max(top, pod.Local*k, pod.Cluster*k)
	}
	for j, xys := range []plotter.XYs{loc, clu} {
		name := []string{"expected if Local", "expected if Cluster"}[j]
		ln, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("could not plot %s: %w", name, err)
		}
		ln.StepStyle = plotter.MidStep
		ln.Color = []color.Color{color.RGBA{R: 200, A: 255}, color.Black}[j]
		ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		pl.Add(ln)
		pl.Legend.Add(name, ln)
	}
	for mi, m := range s.Modes {
		var xys plotter.XYs
		for i, sh := range m.Shares {
			xys = append(xys, plotter.XY{X: float64(i) + 0.12*float64(mi-1), Y: sh * k})
			top = max(top, sh*k)
		}
		if err := addPoints(pl, mi, string(m.Mode), xys, draw.CircleGlyph{}); err != nil {
			return nil, err
		}
	}
	pl.Y.Min, pl.Y.Max = 0, top*1.35
	pl.X.Min, pl.X.Max = -0.5, k-0.5
	return pl, nil
}
