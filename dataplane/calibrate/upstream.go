package calibrate

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/sim/cluster"
)

// UpstreamPoint is upstream kube-proxy's sync time at one size, from its
// own metrics (kubeproxy_sync_proxy_rules_duration_seconds and, where the
// release has them, the full and partial sync histograms): the first sync
// of a fresh kube-proxy (a full sync), then the sync after one endpoint
// changed (a partial sync). Medians of Runs runs; the runs themselves too.
type UpstreamPoint struct {
	Services            int       `json:"services"`
	EndpointsPerService int       `json:"endpointsPerService"`
	FullSeconds         float64   `json:"fullSyncSeconds"`
	PartialSeconds      float64   `json:"partialSyncSeconds"`
	FullRuns            []float64 `json:"fullSyncRuns"`
	PartialRuns         []float64 `json:"partialSyncRuns"`
	Runs                int       `json:"runs"`
}

// UpstreamCalibration is kube-proxy's sync time against size in one mode.
type UpstreamCalibration struct {
	Mode cluster.Mode `json:"mode"`
	// Variant is the iptables backend (nft or legacy) in iptables mode,
	// empty in nftables mode.
	Variant string          `json:"variant,omitempty"`
	Version string          `json:"kubeProxyVersion"`
	Kernel  string          `json:"kernel,omitempty"`
	Source  string          `json:"source"`
	Points  []UpstreamPoint `json:"points"`
}

// UpstreamSample is one fresh kube-proxy's measurement at one size.
type UpstreamSample struct{ Full, Partial float64 }

// UpstreamTarget measures upstream kube-proxy at one size. The harness
// supplies it (it owns the control plane and the processes); the loop
// here only repeats and summarises.
type UpstreamTarget struct {
	Mode    cluster.Mode
	Variant string
	Version string
	// Prepare loads n Services x k endpoints into a fresh API and returns
	// measure, which starts a fresh kube-proxy (run r of runs) and
	// measures it, and done, which removes what Prepare built.
	Prepare func(ctx context.Context, n, k, runs int) (measure func(ctx context.Context, r int) (UpstreamSample, error), done func(), err error)
}

// RunUpstream measures t at each size, runs times (fresh kube-proxy each
// time, the objects loaded once per size), and keeps the medians.
func RunUpstream(ctx context.Context, t UpstreamTarget, sizes []int, endpoints, runs int, log func(string, ...any)) (*UpstreamCalibration, error) {
	out := &UpstreamCalibration{Mode: t.Mode, Variant: t.Variant, Version: t.Version,
		Source: "sim calibrate --subject kube-proxy --mode " + string(t.Mode)}
	for _, n := range sizes {
		pt, err := upstreamPoint(ctx, t, n, endpoints, runs)
		if err != nil {
			return nil, fmt.Errorf("%d services x %d: %w", n, endpoints, err)
		}
		if log != nil {
			log("kube-proxy %s %s %5d services x %d: full %.3fs, partial %.4fs (medians of %d)\n", t.Mode, t.Variant, n, endpoints, pt.FullSeconds, pt.PartialSeconds, runs)
		}
		out.Points = append(out.Points, pt)
	}
	return out, nil
}

func upstreamPoint(ctx context.Context, t UpstreamTarget, n, k, runs int) (UpstreamPoint, error) {
	pt := UpstreamPoint{Services: n, EndpointsPerService: k, Runs: runs}
	measure, done, err := t.Prepare(ctx, n, k, runs)
	if err != nil {
		return pt, err
	}
	defer done()
	for r := 0; r < runs; r++ {
		if ctx.Err() != nil {
			return pt, ctx.Err()
		}
		m, err := measure(ctx, r)
		if err != nil {
			return pt, err
		}
		pt.FullRuns, pt.PartialRuns = append(pt.FullRuns, m.Full), append(pt.PartialRuns, m.Partial)
		runtime.GC()
	}
	pt.FullSeconds, pt.PartialSeconds = Median(pt.FullRuns), Median(pt.PartialRuns)
	return pt, nil
}

// Ratio is ours against upstream at one size: the sync times and ours /
// upstream (above 1: ours is slower).
type Ratio struct {
	Services, EndpointsPerService int
	OursVariant                   string
	OursFull, UpstreamFull        float64
	OursPartial, UpstreamPartial  float64
	Full, Partial                 float64
	// OursRuns and UpstreamRuns are the runs behind each median.
	OursRuns, UpstreamRuns int
}

// Compare pairs ours (the calibration of variant oursVariant) with
// upstream at the sizes both measured.
func Compare(ours []*Calibration, oursVariant string, up *UpstreamCalibration) []Ratio {
	var out []Ratio
	for _, c := range ours {
		if c.Mode != up.Mode || c.Variant != oursVariant {
			continue
		}
		for _, u := range up.Points {
			i := slices.IndexFunc(c.Points, func(p Point) bool {
				return p.Services == u.Services && p.EndpointsPerService == u.EndpointsPerService
			})
			if i < 0 {
				continue
			}
			p := c.Points[i]
			out = append(out, Ratio{Services: u.Services, EndpointsPerService: u.EndpointsPerService, OursVariant: oursVariant,
				OursFull: p.FullSeconds, UpstreamFull: u.FullSeconds, OursPartial: p.PartialSeconds, UpstreamPartial: u.PartialSeconds,
				Full: p.FullSeconds / u.FullSeconds, Partial: p.PartialSeconds / u.PartialSeconds, OursRuns: p.Runs, UpstreamRuns: u.Runs})
		}
	}
	return out
}

// WriteRatios writes the comparison as a Markdown table.
func WriteRatios(w io.Writer, up *UpstreamCalibration, rs []Ratio) error {
	var b strings.Builder
	mode := string(up.Mode)
	if up.Variant != "" {
		mode += " (" + up.Variant + ")"
	}
	fmt.Fprintf(&b, "%s, kube-proxy %s, kernel %s:\n\n", mode, up.Version, up.Kernel)
	b.WriteString("| services x endpoints | ours | full ours s | full kube-proxy s | ours / kube-proxy | partial ours s | partial kube-proxy s | ours / kube-proxy | runs ours / kube-proxy |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %d x %d | %s | %.3f | %.3f | %.2f | %.4f | %.4f | %.2f | %d / %d |\n", r.Services, r.EndpointsPerService, r.OursVariant,
			r.OursFull, r.UpstreamFull, r.Full, r.OursPartial, r.UpstreamPartial, r.Partial, r.OursRuns, r.UpstreamRuns)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
