package capacity

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kpsim/kpsim/sim/cost"
)

// Files are the names WriteFiles writes into its folder.
var Files = struct {
	JSON, Markdown, PerfData, Table string
}{"capacity.json", "capacity.md", "perfdata.json", "capacity.txt"}

// WriteJSON writes the sweep with its stable field names.
func (res *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// est prints an estimate, marked when extrapolated: in full as
// cost.Estimate.String does ("41 s (extrapolated, 6.0x the largest
// measured size; 28-60 s)"), or for a terminal's table in short ("41 s
// (extrapolated 6x)", the band in JSON and Markdown).
func est(e cost.Estimate, short bool) string {
	if !short || !e.Extrapolated {
		return e.String()
	}
	return fmt.Sprintf("%.3g s (extrapolated %sx)", e.Seconds, cost.FactorString(e.Factor))
}

func latencyText(l *Latency, short bool) (p50, p99 string) {
	if l == nil {
		return "-", "-"
	}
	mark := ""
	if l.Extrapolated {
		mark = " (extrapolated)"
	}
	p50, p99 = fmt.Sprintf("%.3g s%s", l.P50, mark), fmt.Sprintf("%.3g s%s", l.P99, mark)
	if !short || l.P99Low != l.P99 || l.P99High != l.P99 {
		p99 += fmt.Sprintf("; %.3g-%.3g s", l.P99Low, l.P99High)
	}
	return p50, p99
}

var columns = []string{"Services", "Nodes", "Mode", "Objects/node", "Full sync", "Partial sync", "Prog. latency p50", "Prog. latency p99", "First packet rules p50/p99", "Node port p50/p99", "LB/ext IP p50/p99", "Conntrack entries", "Conntrack memory"}

func (res *Result) cells(short bool) [][]string {
	var out [][]string
	for _, sz := range res.Sizes {
		for _, r := range sz.Rows {
			p50, p99 := latencyText(r.Latency, short)
			full := est(r.FullSync, short)
			if r.StartUpFullSyncOnly {
				full += " (start-up only)"
			}
			out = append(out, []string{
				strconv.Itoa(sz.Services), strconv.Itoa(sz.Shape.Nodes), r.Variant.String(), strconv.Itoa(r.Objects),
				full, est(r.PartialSync, short), p50, p99,
				fmt.Sprintf("%.0f/%.0f", r.FirstPacket.RulesP50, r.FirstPacket.RulesP99),
				walkText(r.FirstPacket.NodePort), walkText(r.FirstPacket.LoadBalancer),
				strconv.FormatInt(r.ConntrackEntries, 10), mib(r.ConntrackBytes),
			})
		}
	}
	return out
}

// walkText is a path's first-packet rules, "-" when nothing takes it.
func walkText(p *cost.PathWalk) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f/%.0f", p.RulesP50, p.RulesP99)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// WriteTable prints the sweep for a terminal.
func (res *Result) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "%s: %d Services, %d service ports, %d nodes, %.2f endpoints per service port; seed %d\n",
		res.Scenario, res.Base.Services, res.Base.ServicePorts, res.Base.Nodes, res.Base.MeanEndpoints, res.Seed)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(columns, "\t"))
	for _, c := range res.cells(true) {
		fmt.Fprintln(tw, strings.Join(c, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	res.writeModels(w, "")
	if len(res.SLOs) > 0 {
		fmt.Fprintln(w, "\nLargest size that meets each SLO:")
		tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
		for _, a := range res.SLOs {
			fmt.Fprintf(tw, "  %s\t%s/%s\t%s\n", a.SLO, a.Mode, a.Variant, a.Text)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	res.writeNotes(w, "")
	return nil
}

func (res *Result) writeModels(w io.Writer, bullet string) {
	fmt.Fprintln(w, "\nCost models (a figure outside the measured range is marked extrapolated):")
	for _, m := range res.Models {
		fmt.Fprintf(w, "%s  %s: %s, fit error %.1f %%, measured %d-%d Services; %s\n", bullet, m.Variant, m.Form, 100*m.FitError, m.MinServices, m.MaxServices, m.Source)
	}
}

func (res *Result) writeNotes(w io.Writer, bullet string) {
	fmt.Fprintln(w, "\nNotes:")
	for _, n := range res.Notes {
		fmt.Fprintf(w, "%s  %s\n", bullet, n)
	}
	for _, sz := range res.Sizes {
		for _, n := range sz.Notes {
			fmt.Fprintf(w, "%s  at %d Services: %s (address ranges enter no count)\n", bullet, sz.Services, n)
		}
	}
}

// WriteMarkdown writes the sweep as a Markdown report.
func (res *Result) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "# Capacity: %s\n\n", res.Scenario)
	fmt.Fprintf(w, "Scaled from %d Services (%d service ports, %d nodes, %.2f endpoints per service port, %.1f %% ClientIP affinity, %.1f %% internalTrafficPolicy Local); seed %d.\n\n",
		res.Base.Services, res.Base.ServicePorts, res.Base.Nodes, res.Base.MeanEndpoints, 100*res.Base.Affinity, 100*res.Base.InternalLocal, res.Seed)
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(columns, " | "), strings.Repeat("---|", len(columns)))
	for _, c := range res.cells(false) {
		fmt.Fprintf(w, "| %s |\n", strings.Join(c, " | "))
	}
	if len(res.SLOs) > 0 {
		fmt.Fprintf(w, "\n## Largest size that meets each SLO\n\n| SLO | Mode | Answer |\n|---|---|---|\n")
		for _, a := range res.SLOs {
			fmt.Fprintf(w, "| `%s` | %s/%s | %s |\n", a.SLO, a.Mode, a.Variant, a.Text)
		}
	}
	res.writeModels(w, "-")
	res.writeNotes(w, "-")
	return nil
}

// PerfData is ClusterLoader2's measurement format (perf-tests
// clusterloader2/pkg/measurement/util: PerfData{Version, DataItems}), which
// perfdash reads.
type PerfData struct {
	Version   string            `json:"version"`
	DataItems []DataItem        `json:"dataItems"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// DataItem is one PerfData measurement.
type DataItem struct {
	Data   map[string]float64 `json:"data"`
	Unit   string             `json:"unit"`
	Labels map[string]string  `json:"labels,omitempty"`
}

// PerfData turns the sweep into ClusterLoader2 PerfData: per size and
// variant, NetworkProgrammingLatency (Perc50, Perc99 in ms), FullSync and
// PartialSync (Perc50 the estimate, Low and High its band, in ms),
// ObjectsPerNode, FirstPacketRules (Perc50, Perc99; every path), with
// FirstPacketRulesNodePort and FirstPacketRulesLoadBalancer where the
// scenario has node ports or load-balancer and external IPs, and
// ConntrackEntries.
// Every item carries the same labels (perfdash wants that): Metric, Mode,
// Variant, Services and Extrapolated.
func (res *Result) PerfData() PerfData {
	pd := PerfData{Version: "v1", DataItems: []DataItem{}, Labels: map[string]string{"scenario": res.Scenario}}
	for _, sz := range res.Sizes {
		for _, r := range sz.Rows {
			item := func(metric, unit string, ex bool, data map[string]float64) {
				pd.DataItems = append(pd.DataItems, DataItem{Data: data, Unit: unit, Labels: map[string]string{
					"Metric": metric, "Mode": string(r.Mode), "Variant": r.Variant.Variant, "Services": strconv.Itoa(sz.Services), "Extrapolated": strconv.FormatBool(ex)}})
			}
			if l := r.Latency; l != nil {
				item("NetworkProgrammingLatency", "ms", l.Extrapolated, map[string]float64{"Perc50": 1000 * l.P50, "Perc99": 1000 * l.P99})
			}
			for _, s := range []struct {
				name string
				e    cost.Estimate
			}{{"FullSync", r.FullSync}, {"PartialSync", r.PartialSync}} {
				item(s.name, "ms", s.e.Extrapolated, map[string]float64{"Perc50": 1000 * s.e.Seconds, "Low": 1000 * s.e.Low, "High": 1000 * s.e.High})
			}
			item("ObjectsPerNode", "objects", false, map[string]float64{"Max": float64(r.Objects), "Perc50": float64(r.MedianObjects)})
			item("FirstPacketRules", "rules", false, map[string]float64{"Perc50": r.FirstPacket.RulesP50, "Perc99": r.FirstPacket.RulesP99})
			for _, p := range []struct {
				metric string
				w      *cost.PathWalk
			}{{"FirstPacketRulesNodePort", r.FirstPacket.NodePort}, {"FirstPacketRulesLoadBalancer", r.FirstPacket.LoadBalancer}} {
				if p.w != nil {
					item(p.metric, "rules", false, map[string]float64{"Perc50": p.w.RulesP50, "Perc99": p.w.RulesP99})
				}
			}
			item("ConntrackEntries", "entries", false, map[string]float64{"Max": float64(r.ConntrackEntries)})
		}
	}
	return pd
}

// WritePerfData writes PerfData JSON.
func (res *Result) WritePerfData(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res.PerfData())
}

// WriteFiles writes the JSON, Markdown, table and PerfData files and the
// plots into dir and returns the paths written.
func (res *Result) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("could not create %s: %w", dir, err)
	}
	type file struct {
		name  string
		write func(io.Writer) error
	}
	files := []file{{Files.JSON, res.WriteJSON}, {Files.Markdown, res.WriteMarkdown}, {Files.Table, res.WriteTable}, {Files.PerfData, res.WritePerfData}}
	for _, p := range res.plots() {
		files = append(files, file{p.name, p.draw})
	}
	var written []string
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		if err := writeFile(path, f.write); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

func writeFile(path string, write func(io.Writer) error) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("could not write %s: %w", path, cerr)
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	return nil
}
