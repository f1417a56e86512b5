// Package cost models what each kube-proxy mode costs a node at a given
// cluster state: rules or objects programmed, bytes sent per sync, full and
// partial sync time, the work a first packet does, and conntrack memory.
//
// Counts (count.go) follow kube-proxy v1.37.2's layout (reference
// kube-proxy.md §1.4, §2.1, §3) as formulas, independently of the
// dataplane's renderers, node ports, external IPs, load-balancer IPs and
// their source ranges and health-check node ports included (External);
// render_test.go holds every mode's counts against the renderers' output.
// FirstPackets (firstpacket.go) gives the rules a first packet walks by
// path: cluster IP, node port, load-balancer or external IP. Sync times come
// from calibration files in results/calibration/ that `sim calibrate`
// measures on a real kernel; without one, the defaults below (measured on
// this project's reference machine, design.md) are used and the report says
// so.
//
// # Sync time: a fitted form per mechanism
//
// A calibration's points are fitted (Model, NewModel) with the functional
// form of the mechanism that spends the time, not interpolated. Size
// features come from Count on the point's synthetic cluster (N Services x
// E endpoints), the same axes a simulated node has:
//
//   - iptables, legacy backend (iptables-legacy-restore): a + b*lines +
//     c*chains^k. libiptc parses the text and replaces each table's blob
//     with one setsockopt, linear in the restore's lines; two userspace
//     lookups are quadratic in chains (profiled, results/calibration/
//     README.md): libxtables keeps chain names in a fixed 512-bucket hash
//     walked with strcmp for every :CHAIN and -j, and libiptc rebuilds its
//     chain index over the whole list after every 356 new chains. k is
//     scanned over [1.5, 2.5] (fixed at 2 with fewer points, the band
//     spanning k = 2.2 too): the cost of a compare grows as the lists
//     outgrow the caches.
//   - iptables, nft backend (iptables-nft-restore --noflush, 1.8.9 and
//     1.8.11): a + b*lines + c*(lines*chains)^k. The parse and the netlink
//     batch are linear; cache_chain_list_insert (iptables/nft-cache.c)
//     keeps the chains to fetch in a sorted linked list and walks it with
//     strcmp once per parsed command, about lines x chains / 2 compares,
//     which is quadratic in Services (results/calibration/README.md, "Why
//     iptables-nft --noflush is slow"). k > 1 is the cost of one compare
//     growing as the list outgrows the CPU caches; it is fitted by a scan
//     over [1, 2] in steps of 0.01 (the coefficients are linear at each k)
//     when there are at least two points more than the coefficients, else
//     fixed at 1, the compare count's own exponent, with the band spanning
//     the fit at k = 1.2 too; Fitted says which.
//   - nftables, kube-proxy layout (nft -f, one transaction): a +
//     b*objects + c*setWalks^k, a fixed kernel and userspace cost per
//     chain, rule, set and element, plus the kernel's list walks for each
//     anonymous set (setWalks = 4·A² + A·(C + 6·N) + 2·N², A anonymous
//     sets, C chains, N named sets: nf_tables walks the table's sets five
//     times and the transaction list once per anonymous set; a Service
//     with two or more endpoints has one, its inline numgen map), k > 1
//     as the lists outgrow the caches, scanned over [1, 1.5]
//     (results/calibration/README.md, "nft -f of the kube-proxy layout").
//     Services with one endpoint have no map and cost only linearly.
//   - nftables, fast layout: a + b*chains + c*elements^k (k over [1,
//     1.5]): a Service's chain and entries, an endpoint's entries in the
//     few shared endpoint maps; no anonymous set per Service, so no set
//     walks (the kube-proxy layout's Counts are the axes: the fast
//     layout's endpoint maps hold about twice as many elements, a factor
//     the coefficient takes).
//   - IPVS: a + b*virtualServers + c*realServers, one netlink request per
//     object as the ipvs proxier reconciles them. A calibration measured in
//     the microVM (Calibration.Emulation) is divided by the emulated CPU's
//     slowdown before the fit.
//   - Partial syncs have their own points and fit: iptables a + b*lines (a
//     partial restore still rewrites KUBE-SERVICES whole, one rule per
//     Service), nftables a + b*objects (the transaction changes one
//     Service's objects, but nft first loads its cache of the table, linear
//     in the table). IPVS has one sync function that reconciles every
//     virtual and real server: Full is a sync into an empty kernel
//     (start-up), Partial a steady-state run, measured as the resync after
//     one endpoint change (it lists and compares everything and writes
//     the difference); the same form, fitted to each.
//
// The fit is weighted least squares on relative error, sum of
// ((f(x)-y)/y)^2, with non-negative coefficients (an exact NNLS over the
// subsets of at most three coefficients); FitError is the RMS relative
// residual. The band is a 95 % prediction interval: the relative scatter s
// (residual standard error) and the parameters' covariance s^2 (J'J)^-1
// (J the relative Jacobian, k included when fitted) propagated to the
// size, times Student's t for the residual degrees of freedom; it grows
// away from the points, and is never narrower than FitError or the fit's
// largest leave-one-out miss (refit without each point). Those two floors
// are measured inside the range only: outside it they are multiplied by
// 1 + |ln(size ratio)| (size over the nearest measured size). The band is
// applied multiplicatively, y/(1+r) to y*(1+r), and widened by an
// emulation ratio's range. A fit with as many points as free parameters
// (the two-point defaults) has no scatter to estimate: 50 % is assumed,
// Model.Note says so, and outside the range the whole band is multiplied
// by 1 + |ln(size ratio)|. Outside the measured range an Estimate is
// Extrapolated with the Factor over the largest (or smallest) measured
// size.
package cost

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Calibration is sync time against size for one mode and variant, as `sim
// calibrate` writes it.
type Calibration struct {
	// Emulation is set when the points were measured in the microVM.
	Emulation *Emulation   `json:"emulation,omitempty"`
	Mode      cluster.Mode `json:"mode"`
	Variant   string       `json:"variant"` // e.g. "nft", "legacy", "kube-proxy", "fast"
	Kernel    string       `json:"kernel,omitempty"`
	Source    string       `json:"source"`
	Points    []Point      `json:"points"`
}

// Point is one measured size.
type Point struct {
	Services            int     `json:"services"`
	EndpointsPerService int     `json:"endpointsPerService"`
	Objects             int     `json:"objects"`
	FullSeconds         float64 `json:"fullSyncSeconds"`
	PartialSeconds      float64 `json:"partialSyncSeconds,omitempty"`
}

// Defaults measured on this project's reference machine (design.md, "Facts"):
// raw restores of kube-proxy-shaped rules at 1000 and 5000 Services x 10
// endpoints. Used only when results/calibration has no file for the mode.
func Defaults() []Calibration {
	src := "design.md defaults (measured on the reference machine, not on this one)"
	pt := func(mode cluster.Mode, services int, seconds float64) Point {
		return Point{Services: services, EndpointsPerService: 10, Objects: SyntheticObjects(mode, services, 10), FullSeconds: seconds}
	}
	return []Calibration{
		{Mode: cluster.ModeIPTables, Variant: "nft", Source: src, Points: []Point{pt(cluster.ModeIPTables, 1000, 0.83), pt(cluster.ModeIPTables, 5000, 4.7)}},
		{Mode: cluster.ModeIPTables, Variant: "legacy", Source: src, Points: []Point{pt(cluster.ModeIPTables, 1000, 0.50), pt(cluster.ModeIPTables, 5000, 2.1)}},
		{Mode: cluster.ModeNFTables, Variant: "kube-proxy", Source: src, Points: []Point{pt(cluster.ModeNFTables, 1000, 1.0), pt(cluster.ModeNFTables, 2000, 2.7), pt(cluster.ModeNFTables, 3000, 16.8), pt(cluster.ModeNFTables, 5000, 60)}},
		{Mode: cluster.ModeNFTables, Variant: "fast", Source: src, Points: []Point{pt(cluster.ModeNFTables, 1000, 0.24), pt(cluster.ModeNFTables, 5000, 2.7)}},
	}
}

// SyntheticObjects is the size measure of services x endpoints ClusterIP
// Services in kube-proxy's layout: the x axis of every calibration.
func SyntheticObjects(mode cluster.Mode, services, endpoints int) int {
	return pointCounts(mode, Point{Services: services, EndpointsPerService: endpoints}).Objects
}

// CalibrationError is a calibration file that cannot be used: its path,
// the line and the field at fault.
type CalibrationError struct {
	File  string
	Line  int // 0 when unknown
	Field string
	Err   error
}

func (e *CalibrationError) Error() string {
	at := e.File
	if e.Line > 0 {
		at = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %v", at, e.Field, e.Err)
	}
	return fmt.Sprintf("%s: %v", at, e.Err)
}

func (e *CalibrationError) Unwrap() error { return e.Err }

// LoadCalibrations reads the calibrations (*.json, as `sim calibrate`
// writes them) in dir and adds sim/cost's defaults for any mode and variant
// not covered, saying so in their Source. It is strict: a folder that does
// not exist or holds no calibration, a file that does not parse and a
// calibration that cannot be fitted are errors (*CalibrationError) naming
// the file, line and field. kube-proxy-*.json files, upstream kube-proxy's
// own sync metrics (sim calibrate --subject kube-proxy), are a comparison,
// not a model of this dataplane, and are skipped.
func LoadCalibrations(dir string) ([]Calibration, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, &CalibrationError{File: dir, Err: fmt.Errorf("calibration folder: %w", err)}
	}
	if !st.IsDir() {
		return nil, &CalibrationError{File: dir, Err: errors.New("not a folder: --calibration takes the folder sim calibrate --write wrote into")}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Calibration
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), "kube-proxy-") {
			continue
		}
		cs, err := readCalibrationFile(f)
		if err != nil {
			return nil, err
		}
		for _, c := range cs {
			if out, err = mergeCalibration(out, c); err != nil {
				return nil, &CalibrationError{File: f, Field: "points", Err: err}
			}
		}
	}
	if len(out) == 0 {
		return nil, &CalibrationError{File: dir, Err: errors.New("holds no calibration (no *.json written by sim calibrate --write)")}
	}
	for _, d := range Defaults() {
		if !slices.ContainsFunc(out, func(c Calibration) bool { return c.Mode == d.Mode && c.Variant == d.Variant }) {
			d.Source = fmt.Sprintf("not in %s: %s", dir, d.Source)
			out = append(out, d)
		}
	}
	return out, nil
}

// mergeCalibration adds c to cs: its points join those of the same mode
// and variant from another file (a ladder measured in pieces, e.g. the
// largest size with fewer runs), sorted by size; a size measured twice is
// an error, not an average.
func mergeCalibration(cs []Calibration, c Calibration) ([]Calibration, error) {
	i := slices.IndexFunc(cs, func(o Calibration) bool { return o.Mode == c.Mode && o.Variant == c.Variant })
	if i < 0 {
		return append(cs, c), nil
	}
	m := &cs[i]
	if (m.Emulation == nil) != (c.Emulation == nil) {
		return nil, fmt.Errorf("%s/%s: measured with and without emulation in different files", c.Mode, c.Variant)
	}
	if m.Emulation != nil && !reflect.DeepEqual(m.Emulation, c.Emulation) {
		// Each file's points are divided by its own references' ratios:
		// one calibration holds one emulation.
		return nil, fmt.Errorf("%s/%s: files with different emulation ratios (%.3g and %.3g): measure them against the same references", c.Mode, c.Variant, m.Emulation.Ratio, c.Emulation.Ratio)
	}
	for _, p := range c.Points {
		if slices.ContainsFunc(m.Points, func(o Point) bool { return o.Services == p.Services && o.EndpointsPerService == p.EndpointsPerService }) {
			return nil, fmt.Errorf("%s/%s: %d x %d measured in two files", c.Mode, c.Variant, p.Services, p.EndpointsPerService)
		}
	}
	m.Points = append(m.Points, c.Points...)
	sort.SliceStable(m.Points, func(a, b int) bool { return m.Points[a].Services < m.Points[b].Services })
	if c.Source != m.Source {
		m.Source += "; " + c.Source
	}
	return cs, nil
}

// readCalibrationFile parses one calibration file and checks that each
// calibration can be fitted.
func readCalibrationFile(f string) ([]Calibration, error) {
	data, err := os.ReadFile(f)
	if err != nil {
		return nil, &CalibrationError{File: f, Err: err}
	}
	var cs []Calibration
	if err := json.Unmarshal(data, &cs); err != nil {
		ce := &CalibrationError{File: f, Err: err}
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			ce.Line = lineAt(data, se.Offset)
		case errors.As(err, &te):
			ce.Line, ce.Field = lineAt(data, te.Offset), te.Field
			ce.Err = fmt.Errorf("want %s, got JSON %s", te.Type, te.Value)
		}
		return nil, ce
	}
	starts := elementLines(data)
	for i := range cs {
		c := &cs[i]
		line := 0
		if i < len(starts) {
			line = starts[i]
		}
		bad := func(field string, err error) error {
			return &CalibrationError{File: f, Line: line, Field: fmt.Sprintf("[%d].%s", i, field), Err: err}
		}
		switch c.Mode {
		case cluster.ModeIPTables, cluster.ModeNFTables, cluster.ModeIPVS:
		default:
			return nil, bad("mode", fmt.Errorf("%q is not iptables, nftables or ipvs", c.Mode))
		}
		if len(c.Points) == 0 {
			return nil, bad("points", errors.New("no points"))
		}
		for j := range c.Points {
			p := &c.Points[j]
			if p.Services <= 0 || p.EndpointsPerService <= 0 {
				return nil, bad(fmt.Sprintf("points[%d].services", j), fmt.Errorf("services %d and endpointsPerService %d: want both > 0", p.Services, p.EndpointsPerService))
			}
			if !(p.FullSeconds > 0) {
				return nil, bad(fmt.Sprintf("points[%d].fullSyncSeconds", j), fmt.Errorf("%g: want > 0", p.FullSeconds))
			}
			// Every calibration on the same size axis.
			p.Objects = SyntheticObjects(c.Mode, p.Services, p.EndpointsPerService)
		}
		if c.Source == "" {
			c.Source = f
		}
		if _, err := NewModel(*c); err != nil {
			return nil, bad("points", err)
		}
	}
	return cs, nil
}

// lineAt is the 1-based line of a byte offset.
func lineAt(data []byte, off int64) int {
	off = min(max(off, 0), int64(len(data)))
	return 1 + bytes.Count(data[:off], []byte("\n"))
}

// elementLines are the lines where the top-level array's elements start.
func elementLines(data []byte) []int {
	d := json.NewDecoder(bytes.NewReader(data))
	if t, err := d.Token(); err != nil || t != json.Delim('[') {
		return nil
	}
	var out []int
	for d.More() {
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return out
		}
		end := d.InputOffset()
		out = append(out, lineAt(data, end-int64(len(raw))))
	}
	return out
}

// Find returns the calibration of a mode and variant.
func Find(cs []Calibration, mode cluster.Mode, variant string) (Calibration, bool) {
	for _, c := range cs {
		if c.Mode == mode && c.Variant == variant {
			return c, true
		}
	}
	return Calibration{}, false
}

// Conntrack sizes a node's conntrack table.
type Conntrack struct {
	PeakEntries int64 `json:"peakEntries"`
	Bytes       int64 `json:"bytes"`
}

// ConntrackEntryBytes is the kernel's per-entry cost (struct nf_conn with
// its NAT extension, slab-rounded, on 6.x kernels; about 320 bytes).
const ConntrackEntryBytes = 320

// ConntrackFor sizes a table of peak entries.
func ConntrackFor(peak int64) Conntrack {
	return Conntrack{PeakEntries: peak, Bytes: peak * ConntrackEntryBytes}
}
