package cost

import (
	"fmt"
	"math"
	"strings"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/stat/distuv"

	"github.com/kpsim/kpsim/sim/cluster"
)

// A form is a mechanism's functional form: a sum of non-negative
// coefficients times features of a node's Counts, at most one of them
// raised to a fitted exponent k (iptables-nft's chain list walk, the
// superlinear terms of iptables-legacy and nftables).
type form struct {
	name  string    // e.g. "a + b*lines + c*(lines*chains)^k"
	terms []feature // one coefficient each
	// pow is the index of the term raised to k, -1 for none.
	pow int
	// kMin, kMax bound the fitted exponent; kFixed is used when the
	// points cannot tell k (too few of them).
	kMin, kMax, kFixed float64
	// kAlt is the other end of k's plausible range when k is fixed: the
	// band spans the fit at kAlt too.
	kAlt float64
	// kCount is the exponent of the mechanism's own count in the power
	// feature (1 when the feature is the count of compares or visits, 2
	// for chains^k, whose compares go as chains²); 0: none. k above it is
	// the cost of one step growing as the lists outgrow the caches, which
	// cannot go on past memory latency: beyond the largest measured
	// feature, the estimate keeps the cost per step of the largest point
	// (the count's exponent) and the band reaches the fitted k's curve.
	kCount float64
	// sizeDegree is the power feature's degree in Services at a fixed
	// shape (2 for lines·chains and setWalks, 1 for chains and elements):
	// past its largest measured value an estimate is extrapolated by the
	// feature's ratio to the power 1/sizeDegree, in Services.
	sizeDegree float64
	why        string
}

type feature struct {
	name string
	of   func(Counts) float64
}

var (
	fOne   = feature{"1", func(Counts) float64 { return 1 }}
	fLines = feature{"lines", func(c Counts) float64 { return float64(c.Objects) }}
	// fWalk is lines x chains: cache_chain_list_insert walks a sorted list
	// of the chains once per parsed command, about half of it on average.
	fWalk    = feature{"lines*chains", func(c Counts) float64 { return float64(c.Objects) * float64(c.Chains) }}
	fObjects = feature{"objects", func(c Counts) float64 { return float64(c.Objects) }}
	// fSetWalks counts the list nodes the kernel visits while nf_tables
	// adds the anonymous sets of one transaction (results/calibration/
	// README.md, "Why nft -f of the kube-proxy layout is superlinear"):
	// each anonymous set walks the table's sets five times (the name
	// lookup, nf_tables_set_alloc_name's two walks, nft_set_lookup_global
	// from the element and the lookup expression) and the commit list once
	// (__nft_set_trans_bind); each named set walks the sets twice. With
	// every named set and chain queued before the rules, as the renderer
	// writes them, that is 4·A² + A·(C + 6·N) + 2·N² for A anonymous sets,
	// C chains and N named sets.
	fSetWalks = feature{"setWalks", func(c Counts) float64 {
		a, ch, n := float64(c.AnonSets), float64(c.NFTChains), float64(c.Sets+nftFixedSets)
		return 4*a*a + a*(ch+6*n) + 2*n*n
	}}
	// fIPTChains are iptables chains: the legacy backend's lookups walk
	// them (chains/512 names per hash bucket, the whole list per index
	// rebuild).
	fIPTChains = feature{"chains", func(c Counts) float64 { return float64(c.Chains) }}
	// fChains and fElements are a Service's and an endpoint's share of an
	// nftables transaction: chains (one per Service port) and map elements
	// (two per Service port and one per endpoint in the kube-proxy layout's
	// count; the fast layout's endpoint maps hold about two per endpoint,
	// a constant factor the coefficient takes).
	fChains   = feature{"chains", func(c Counts) float64 { return float64(c.NFTChains) }}
	fElements = feature{"elements", func(c Counts) float64 { return float64(c.MapElements) }}
	fVS       = feature{"virtualServers", func(c Counts) float64 { return float64(c.VirtualServers) }}
	fRS       = feature{"realServers", func(c Counts) float64 { return float64(c.RealServers) }}
)

// Forms per mode, variant and sync kind; the package doc says why each.
var (
	formRestore = form{name: "a + b*lines + c*chains^k", terms: []feature{fOne, fLines, fIPTChains}, pow: 2, kMin: 1.5, kMax: 2.5, kFixed: 2, kAlt: 2.2,
		kCount: 2, sizeDegree: 1,
		why: "iptables-legacy-restore parses the text and replaces each table's blob in one setsockopt, linear in lines, plus two userspace lookups quadratic in chains: libxtables' 512-bucket table of chain names, walked with strcmp for every :CHAIN and -j, and libiptc's chain index, rebuilt over the whole chain list after every 356 new chains; k > 2 as both outgrow the caches"}
	formNoflush = form{name: "a + b*lines + c*(lines*chains)^k", terms: []feature{fOne, fLines, fWalk}, pow: 2, kMin: 1, kMax: 2, kFixed: 1, kAlt: 1.2,
		kCount: 1, sizeDegree: 2,
		why: "iptables-nft --noflush: linear parse and netlink batch, plus cache_chain_list_insert's walk of a sorted list of chain names once per command (lines x chains strcmp calls; k > 1 as the list outgrows the CPU caches)"}
	formNFTKubeProxy = form{name: "a + b*objects + c*setWalks^k", terms: []feature{fOne, fObjects, fSetWalks}, pow: 2, kMin: 1, kMax: 1.5, kFixed: 1, kAlt: 1.1,
		kCount: 1, sizeDegree: 2,
		why: "nft -f: one kernel transaction, a fixed cost per object (chain, rule, element), plus the kernel's walks of the table's sets and of the transaction list for every anonymous set (one inline numgen map per Service with two or more endpoints): quadratic in Services; k > 1 as the lists outgrow the caches"}
	formNFTFast = form{name: "a + b*chains + c*elements^k", terms: []feature{fOne, fChains, fElements}, pow: 2, kMin: 1, kMax: 1.5, kFixed: 1, kAlt: 1.1,
		kCount: 1, sizeDegree: 1,
		why: "nft -f of the fast layout: one kernel transaction; a Service costs its chain, rules and map entries, an endpoint its entries in the few shared endpoint maps (no anonymous set per Service, so no set walks); k > 1 for the maps' growth (slope 1.06-1.18 in Services from 10,000 to 30,000 x 10)"}
	formNFTPartial = form{name: "a + b*objects", terms: []feature{fOne, fObjects}, pow: -1,
		why: "a partial transaction changes one Service's objects; nft still loads its cache of the table, linear in the table's objects"}
	formIPVS = form{name: "a + b*virtualServers + c*realServers", terms: []feature{fOne, fVS, fRS}, pow: -1,
		why: "the ipvs proxier reconciles every virtual and real server, one netlink request each: into an empty kernel (start-up) it creates them all; in a steady-state run (the resync after one endpoint change) it lists and compares them all and writes the difference"}
	formIPTablesPartial = form{name: "a + b*lines", terms: []feature{fOne, fLines}, pow: -1,
		why: "a partial restore rewrites KUBE-SERVICES whole (one rule per Service) plus the changed chains: linear in the table"}
)

// formsFor returns the full and partial sync forms of a mode and variant.
func formsFor(mode cluster.Mode, variant string) (full form, partial *form) {
	switch mode {
	case cluster.ModeIPTables:
		p := formIPTablesPartial
		if variant == "nft" {
			return formNoflush, &p
		}
		return formRestore, &p
	case cluster.ModeNFTables:
		p := formNFTPartial
		if variant == "kube-proxy" {
			return formNFTKubeProxy, &p
		}
		return formNFTFast, &p
	default:
		// One sync function, whose cost differs by what the kernel holds:
		// Full is a sync into an empty kernel, Partial a steady-state run
		// (every sync after start-up, periodic ones included).
		p := formIPVS
		return formIPVS, &p
	}
}

// A sample is one calibration point as the fit sees it.
type sample struct {
	c Counts
	y float64 // seconds, on the host (emulation divided out)
}

// fit is a fitted form with what its prediction band needs.
type fit struct {
	f       form
	theta   []float64 // coefficients, then k if the form has a power term
	kFitted bool
	rms     float64   // RMS relative residual
	loo     float64   // largest leave-one-out miss, as a ratio minus 1
	alt     []float64 // with k fixed: the coefficients fitted at kAlt
	s       float64   // residual standard error (relative), or assumed
	assumed bool      // s is assumed: too few points to estimate it
	// degenerate: the points cannot separate the free parameters (no
	// covariance); s is then at least assumedScatter.
	degenerate bool
	t          float64 // Student t quantile for a 95 % two-sided interval
	free       []int   // indices of theta that were free (not at a bound)
	cov        *mat.SymDense
	// xmax is the largest value of the power feature over the points.
	xmax float64
}

// assumedScatter is the relative scatter assumed when a fit has no
// residual degrees of freedom (as many points as free parameters) or
// fewer than three points, e.g. the two-point defaults: there is nothing
// (or too little) to estimate it from.
const assumedScatter = 0.5

func (f form) value(theta []float64, c Counts) float64 {
	y := 0.0
	for j, t := range f.terms {
		x := t.of(c)
		if j == f.pow {
			x = math.Pow(x, theta[len(f.terms)])
		}
		y += theta[j] * x
	}
	return y
}

// grad is d value / d theta at c.
func (f form) grad(theta []float64, c Counts) []float64 {
	n := len(f.terms)
	g := make([]float64, len(theta))
	for j, t := range f.terms {
		x := t.of(c)
		if j == f.pow {
			k := theta[n]
			px := math.Pow(x, k)
			g[j] = px
			if x > 0 {
				g[n] = theta[j] * px * math.Log(x)
			}
			continue
		}
		g[j] = x
	}
	return g
}

// fitForm fits f to the samples by weighted least squares on the relative
// error, coefficients non-negative; a power term's k is found by a scan
// (the inner problem is linear) when the points can tell it, else fixed.
func fitForm(f form, pts []sample) (fit, error) {
	ft, err := fitOnce(f, pts)
	if err != nil {
		return ft, err
	}
	// The leave-one-out error: refit without each point in turn and take
	// the largest relative miss at the point left out. It measures what
	// the covariance cannot when the scatter is not the model's (a point
	// taken under a different load); the band is never narrower.
	if len(pts) > len(ft.free)+1 {
		for i := range pts {
			rest := append(append([]sample{}, pts[:i]...), pts[i+1:]...)
			o, err := fitOnce(f, rest)
			if err != nil {
				continue
			}
			y := f.value(o.theta, pts[i].c)
			if y > 0 {
				ft.loo = math.Max(ft.loo, math.Max(y/pts[i].y, pts[i].y/y)-1)
			}
		}
	}
	return ft, nil
}

func fitOnce(f form, pts []sample) (fit, error) {
	if len(pts) == 0 {
		return fit{}, fmt.Errorf("no points")
	}
	if f.pow < 0 {
		theta, rss, err := nnlsRelative(f, nil, pts)
		if err != nil {
			return fit{}, err
		}
		return finish(f, theta, false, rss, pts), nil
	}
	// k needs at least one point more than the coefficients and k.
	if len(pts) < len(f.terms)+2 {
		theta, rss, err := nnlsRelative(f, []float64{f.kFixed}, pts)
		if err != nil {
			return fit{}, err
		}
		ft := finish(f, theta, false, rss, pts)
		// k is fixed, not known: the band also spans the fit with k at
		// the other end of its plausible range (kAlt).
		if alt, _, err := nnlsRelative(f, []float64{f.kAlt}, pts); err == nil && theta[f.pow] > 0 {
			ft.alt = alt
		}
		return ft, nil
	}
	var best []float64
	bestRSS := math.Inf(1)
	for k := f.kMin; k <= f.kMax+1e-9; k += 0.01 {
		theta, rss, err := nnlsRelative(f, []float64{k}, pts)
		if err != nil {
			return fit{}, err
		}
		if rss < bestRSS {
			best, bestRSS = theta, rss
		}
	}
	return finish(f, best, best[f.pow] > 0, bestRSS, pts), nil
}

// nnlsRelative solves min sum ((value-y)/y)^2 over non-negative
// coefficients with k (if any) given: an exact NNLS by trying every set of
// free coefficients (there are at most three) and keeping the best
// feasible one.
func nnlsRelative(f form, k []float64, pts []sample) ([]float64, float64, error) {
	n := len(f.terms)
	X := make([][]float64, len(pts))
	for i, p := range pts {
		row := make([]float64, n)
		for j, t := range f.terms {
			x := t.of(p.c)
			if j == f.pow {
				x = math.Pow(x, k[0])
			}
			row[j] = x / p.y
		}
		X[i] = row
	}
	bestRSS := math.Inf(1)
	var best []float64
	for mask := 1; mask < 1<<n; mask++ {
		var cols []int
		for j := range n {
			if mask&(1<<j) != 0 {
				cols = append(cols, j)
			}
		}
		if len(cols) > len(pts) {
			continue
		}
		A := mat.NewDense(len(pts), len(cols), nil)
		b := mat.NewVecDense(len(pts), nil)
		for i := range pts {
			for c, j := range cols {
				A.Set(i, c, X[i][j])
			}
			b.SetVec(i, 1)
		}
		var sol mat.VecDense
		if err := sol.SolveVec(A, b); err != nil {
			continue // singular for this set
		}
		theta := make([]float64, n, n+len(k))
		ok := true
		for c, j := range cols {
			if v := sol.AtVec(c); v < 0 {
				ok = false
			} else {
				theta[j] = v
			}
		}
		if !ok {
			continue
		}
		theta = append(theta, k...)
		if rss := relRSS(f, theta, pts); rss < bestRSS {
			best, bestRSS = theta, rss
		}
	}
	if best == nil {
		return nil, 0, fmt.Errorf("no non-negative fit of %s", f.name)
	}
	return best, bestRSS, nil
}

func relRSS(f form, theta []float64, pts []sample) float64 {
	s := 0.0
	for _, p := range pts {
		r := (f.value(theta, p.c) - p.y) / p.y
		s += r * r
	}
	return s
}

// finish computes the fit's error and the parameter covariance of its
// free parameters (Gauss-Newton, weighted by 1/y), the basis of the band.
func finish(f form, theta []float64, kFitted bool, rss float64, pts []sample) fit {
	ft := fit{f: f, theta: theta, kFitted: kFitted, rms: math.Sqrt(rss / float64(len(pts)))}
	if f.pow >= 0 {
		for _, p := range pts {
			ft.xmax = max(ft.xmax, f.terms[f.pow].of(p.c))
		}
	}
	for j := range f.terms {
		if theta[j] > 0 {
			ft.free = append(ft.free, j)
		}
	}
	if kFitted {
		ft.free = append(ft.free, len(f.terms))
	}
	dof := len(pts) - len(ft.free)
	if dof < 1 || len(pts) < 3 {
		ft.s, ft.assumed, ft.t = assumedScatter, true, 2
		return ft
	}
	ft.s = math.Sqrt(rss / float64(dof))
	ft.t = distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(dof)}.Quantile(0.975)
	// The columns differ by many orders of magnitude (1, lines,
	// (lines*chains)^k): scale each to unit norm before inverting, then
	// back.
	nf := len(ft.free)
	J := mat.NewDense(len(pts), nf, nil)
	for i, p := range pts {
		g := f.grad(theta, p.c)
		for c, j := range ft.free {
			J.Set(i, c, g[j]/p.y)
		}
	}
	scale := make([]float64, nf)
	for c := range nf {
		scale[c] = mat.Norm(J.ColView(c), 2)
		if scale[c] == 0 {
			scale[c] = 1
		}
		for i := range pts {
			J.Set(i, c, J.At(i, c)/scale[c])
		}
	}
	var jtj mat.SymDense
	jtj.SymOuterK(1, J.T())
	var inv mat.Dense
	if err := inv.Inverse(&jtj); err != nil {
		// Degenerate geometry: fall back to the scatter alone, widened.
		ft.s = math.Max(ft.s, assumedScatter)
		ft.assumed, ft.degenerate = true, true
		return ft
	}
	ft.cov = mat.NewSymDense(nf, nil)
	for a := range nf {
		for b := a; b < nf; b++ {
			ft.cov.SetSym(a, b, ft.s*ft.s*inv.At(a, b)/(scale[a]*scale[b]))
		}
	}
	return ft
}

// predict returns the fitted time at c and its relative half-width: the
// scatter of one sync around the curve plus the parameters' uncertainty at
// c (which grows away from the points), never below the fit's RMS error.
// up is the extra factor on the band's upper side alone: past the largest
// measured point of a capped power term (capped), the fitted k's curve
// over the estimate.
func (ft fit) predict(c Counts) (y, rel, up float64) {
	y = ft.f.value(ft.theta, c)
	if !(y > 0) {
		return 0, 0, 1
	}
	_, rel = ft.spread(c, y)
	if yc, capped := ft.capped(c); capped {
		// Past the largest measured point: the cost per step held at
		// that point's; the fitted k's curve is the band's upper end.
		return yc, rel, max(1, y/yc)
	}
	return y, rel, 1
}

// spread is the relative half-width of the band at c around y.
func (ft fit) spread(c Counts, y float64) (float64, float64) {
	v := ft.s * ft.s
	if ft.cov != nil {
		g := ft.f.grad(ft.theta, c)
		gv := mat.NewVecDense(len(ft.free), nil)
		for i, j := range ft.free {
			gv.SetVec(i, g[j])
		}
		v += mat.Inner(gv, ft.cov, gv) / (y * y)
	}
	rel := max(ft.t*math.Sqrt(v), ft.rms, ft.loo)
	if ft.alt != nil {
		if ya := ft.f.value(ft.alt, c); ya > 0 {
			rel = max(rel, math.Max(ya/y, y/ya)-1)
		}
	}
	return y, rel
}

// capped is the estimate past the largest measured value of a power
// feature whose k exceeds its count's exponent (form.kCount): the power
// term continues from that point with the count's exponent, i.e. at the
// cost per step the largest point measured.
func (ft fit) capped(c Counts) (float64, bool) {
	f := ft.f
	if f.pow < 0 || f.kCount <= 0 || ft.xmax <= 0 {
		return 0, false
	}
	k := ft.theta[len(f.terms)]
	x := f.terms[f.pow].of(c)
	if x <= ft.xmax || k <= f.kCount {
		return 0, false
	}
	y := 0.0
	for j, t := range f.terms {
		if j == f.pow {
			y += ft.theta[j] * math.Pow(ft.xmax, k) * math.Pow(x/ft.xmax, f.kCount)
			continue
		}
		y += ft.theta[j] * t.of(c)
	}
	return y, true
}

// beyond is how far c's power feature lies past the largest measured one,
// in Services (the feature's ratio to the power 1/sizeDegree); 0 inside.
// A shape the calibration did not measure (more Services of fewer
// endpoints) can be inside the objects range and still past it here.
func (ft fit) beyond(c Counts) float64 {
	f := ft.f
	if f.pow < 0 || f.sizeDegree <= 0 || ft.xmax <= 0 {
		return 0
	}
	x := f.terms[f.pow].of(c)
	if x <= ft.xmax*(1+1e-9) {
		return 0
	}
	return math.Pow(x/ft.xmax, 1/f.sizeDegree)
}

// describe prints the fitted form with its parameters.
func (ft fit) describe() string {
	var b strings.Builder
	for j, t := range ft.f.terms {
		if j > 0 {
			b.WriteString(" + ")
		}
		fmt.Fprintf(&b, "%.3g", ft.theta[j])
		if t.name != "1" {
			name := t.name
			if j == ft.f.pow && strings.Contains(name, "*") {
				name = "(" + name + ")"
			}
			b.WriteString("*" + name)
		}
		if j == ft.f.pow {
			k := ft.theta[len(ft.f.terms)]
			how := "fixed: too few points to fit it"
			if ft.kFitted {
				how = "fitted"
			} else if ft.theta[j] == 0 {
				how = "no superlinear term fitted"
			}
			fmt.Fprintf(&b, "^%.2f (k %s)", k, how)
		}
	}
	return b.String()
}
