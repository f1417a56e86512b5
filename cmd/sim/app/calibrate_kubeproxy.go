package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/harness/conform"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/cluster"
)

// calibrateKubeProxy is `sim calibrate --subject kube-proxy`: upstream's
// sync time per size from its own metrics, written beside ours
// (results/calibration/kube-proxy-<mode>.json), and the comparison table
// in that folder's README.md regenerated.
func calibrateKubeProxy(ctx context.Context, s Streams, f *calibrateFlags) error {
	bin, err := findUpstream(f.kubeProxy)
	if err != nil {
		return err
	}
	variants := []string{""}
	if f.mode.m == cluster.ModeIPTables {
		variants = f.backends
	}
	var out []*calibrate.UpstreamCalibration
	for _, v := range variants {
		if f.mode.m == cluster.ModeIPTables && v != "nft" && v != "legacy" {
			return &UsageError{Err: fmt.Errorf("unknown iptables backend %q: nft or legacy", v)}
		}
		cal, err := conform.CalibrateKubeProxy(ctx, conform.KubeProxyCalibration{Mode: f.mode.m, Variant: v, Bin: bin,
			Sizes: f.sizes, Endpoints: f.endpoints, Runs: f.runs, Shape: f.shape, Log: s.Err})
		if err != nil {
			return &EnvError{Err: err}
		}
		out = append(out, cal)
	}
	if f.file != "" {
		if err := writeCalibration(f.file, out); err != nil {
			return err
		}
		if err := writeComparison(filepath.Dir(f.file)); err != nil {
			return err
		}
	}
	if f.out.format == "json" {
		return writeJSON(s.Out, out)
	}
	for _, cal := range out {
		fmt.Fprintf(s.Out, "kube-proxy %s %s %s (kernel %s), medians of %d runs\n", cal.Version, cal.Mode, cal.Variant, cal.Kernel, f.runs)
		fmt.Fprintf(s.Out, "%9s %10s %10s\n", "services", "full s", "partial s")
		for _, p := range cal.Points {
			fmt.Fprintf(s.Out, "%9d %10.3f %10.4f\n", p.Services, p.FullSeconds, p.PartialSeconds)
		}
	}
	return nil
}

// findUpstream locates the upstream binaries; missing ones are this
// environment's lack (exit 3), with how to build them.
func findUpstream(kubeProxy string) (upstream.Binaries, error) {
	bin, err := upstream.Find(kubeProxy)
	if err != nil {
		var me *upstream.MissingError
		if errors.As(err, &me) {
			return bin, &EnvError{Err: err}
		}
		return bin, &EnvError{Err: fmt.Errorf("could not find the upstream binaries: %w", err)}
	}
	return bin, nil
}

// Markers of the generated comparison section of results/calibration/README.md.
const (
	comparisonBegin = "<!-- begin: kube-proxy comparison, written by sim calibrate --subject kube-proxy -->"
	comparisonEnd   = "<!-- end: kube-proxy comparison -->"
)

// oursVariant is the variant of ours compared with upstream's: the same
// iptables backend, our kube-proxy nftables layout.
func oursVariant(up *calibrate.UpstreamCalibration) string {
	if up.Mode == cluster.ModeNFTables {
		return "kube-proxy"
	}
	return up.Variant
}

// writeComparison regenerates the comparison section of dir/README.md from
// every kube-proxy-<mode>.json and ours (<mode>.json) in dir.
func writeComparison(dir string) error {
	var b bytes.Buffer
	b.WriteString(comparisonBegin + "\n\n## Ours against upstream kube-proxy\n\n")
	b.WriteString("Sync time of our dataplane (`<mode>.json`) against upstream kube-proxy's own metrics (`kube-proxy-<mode>.json`:\n" +
		"`kubeproxy_sync_full_proxy_rules_duration_seconds` for a fresh kube-proxy's first sync, `..._partial_...` after one\n" +
		"endpoint turns not ready), at the sizes both measured; ratio ours / kube-proxy (above 1: ours is slower). Ours are\n" +
		"the medians in `<mode>.json` and `<mode>-*.json` (the ladders above 2,000), measured when that file was written (its kernel\n" +
		"and load, see above), not beside upstream's.\n\n")
	for _, mode := range []cluster.Mode{cluster.ModeIPTables, cluster.ModeNFTables} {
		var ups []*calibrate.UpstreamCalibration
		if err := readJSON(filepath.Join(dir, "kube-proxy-"+string(mode)+".json"), &ups); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return err
		}
		ours, err := readOurs(dir, mode)
		if err != nil {
			return err
		}
		for _, up := range ups {
			if err := calibrate.WriteRatios(&b, up, calibrate.Compare(ours, oursVariant(up), up)); err != nil {
				return err
			}
			b.WriteString("\n")
		}
	}
	b.WriteString(comparisonEnd + "\n")
	path := filepath.Join(dir, "README.md")
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	text := string(old)
	if i, j := strings.Index(text, comparisonBegin), strings.Index(text, comparisonEnd); i >= 0 && j > i {
		text = text[:i] + b.String() + strings.TrimPrefix(text[j+len(comparisonEnd):], "\n")
	} else {
		text = strings.TrimRight(text, "\n") + "\n\n" + b.String()
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

// readOurs reads our calibrations of mode in dir: <mode>.json and the
// ladders beside it (<mode>-large.json), as the cost model does.
func readOurs(dir string, mode cluster.Mode) ([]*calibrate.Calibration, error) {
	files, err := filepath.Glob(filepath.Join(dir, string(mode)+"-*.json"))
	if err != nil {
		return nil, err
	}
	var ours []*calibrate.Calibration
	for _, f := range append([]string{filepath.Join(dir, string(mode)+".json")}, files...) {
		var cs []*calibrate.Calibration
		if err := readJSON(f, &cs); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		ours = append(ours, cs...)
	}
	return ours, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("could not read %s: %w", path, err)
	}
	return nil
}
