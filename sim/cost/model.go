package cost

import (
	"fmt"
	"math"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Emulation says that a calibration was measured on an emulated CPU (the
// microVM under TCG) and how much slower that CPU is than the host's: the
// ratio of the same iptables-legacy calibration in the VM and on the host,
// with its range. A model divides the VM's times by Ratio and widens its
// band by the range.
type Emulation struct {
	Ratio float64 `json:"ratio"`
	Low   float64 `json:"low"`
	High  float64 `json:"high"`
	// Sizes are the references' ratios size by size. When set, a point is
	// divided by the ratio at its own size (At), because the emulated
	// CPU's slowdown changes with the size of the work (measured: 19 at
	// 100 Services, 11.5 at 1,000); Ratio, their median, is then only
	// printed.
	Sizes  []EmulationSize `json:"sizes,omitempty"`
	Method string          `json:"method"`
}

// EmulationSize is the VM/host ratio the references measured at one size.
type EmulationSize struct {
	Services int     `json:"services"`
	Ratio    float64 `json:"ratio"`
}

// At is the ratio for a point of the given number of Services: without
// Sizes, Ratio; else the sizes' ratio, interpolated linearly in
// log(Services) between the two sizes around it and the nearest size's
// outside them (sorted by Services).
func (e *Emulation) At(services int) float64 {
	n := len(e.Sizes)
	switch {
	case n == 0:
		return e.Ratio
	case services <= e.Sizes[0].Services:
		return e.Sizes[0].Ratio
	case services >= e.Sizes[n-1].Services:
		return e.Sizes[n-1].Ratio
	}
	i := 1
	for e.Sizes[i].Services < services {
		i++
	}
	a, b := e.Sizes[i-1], e.Sizes[i]
	t := math.Log(float64(services)/float64(a.Services)) / math.Log(float64(b.Services)/float64(a.Services))
	return a.Ratio + t*(b.Ratio-a.Ratio)
}

// check says what is wrong with an emulation read from a file.
func (e *Emulation) check() error {
	if !(e.Ratio > 0) || e.Low > e.Ratio || e.High < e.Ratio || !(e.Low > 0) {
		return fmt.Errorf("emulation ratio %g with range %g-%g: want 0 < low <= ratio <= high", e.Ratio, e.Low, e.High)
	}
	for i, s := range e.Sizes {
		if s.Services <= 0 || s.Ratio < e.Low || s.Ratio > e.High {
			return fmt.Errorf("emulation size %d: %d Services at ratio %g: want Services > 0 and the ratio within %g-%g", i, s.Services, s.Ratio, e.Low, e.High)
		}
		if i > 0 && s.Services <= e.Sizes[i-1].Services {
			return fmt.Errorf("emulation sizes: %d Services after %d: want them in increasing order", s.Services, e.Sizes[i-1].Services)
		}
	}
	return nil
}

// Estimate is a modelled time with its band and whether it lies outside the
// measured range.
type Estimate struct {
	Seconds float64 `json:"seconds"`
	// Low and High bound the estimate: the fit's error (and an emulation
	// ratio's range) propagated, widening with the distance from the
	// measured range.
	Low  float64 `json:"low"`
	High float64 `json:"high"`
	// Extrapolated is set outside the measured range; Factor is then the
	// size over the largest (or smallest) measured size.
	Extrapolated bool    `json:"extrapolated"`
	Factor       float64 `json:"factor,omitempty"`
}

// String prints an estimate so that it never looks measured when it is not:
// "3.21 s", or "41 s (extrapolated, 6.0x the largest measured size; 28-60 s)".
func (e Estimate) String() string {
	if !e.Extrapolated {
		return fmt.Sprintf("%.3g s", e.Seconds)
	}
	where := "the largest"
	if e.Factor < 1 {
		where = "the smallest"
	}
	return fmt.Sprintf("%.3g s (extrapolated, %sx %s measured size; %.3g-%.3g s)", e.Seconds, FactorString(e.Factor), where, e.Low, e.High)
}

// FactorString prints an extrapolation factor with the digits that tell it
// from 1: "1.05", "5.4", "27".
func FactorString(f float64) string {
	switch {
	case f < 2:
		return fmt.Sprintf("%.2f", f)
	case f < 10:
		return fmt.Sprintf("%.1f", f)
	}
	return fmt.Sprintf("%.0f", f)
}

// Model is the fitted sync cost of one mode and variant.
type Model struct {
	Mode    string `json:"mode"`
	Variant string `json:"variant"`
	// Form is the functional form in words and symbols, e.g.
	// "a + b*lines + c*(lines*chains)^k".
	Form string `json:"form"`
	// Params are the fitted coefficients in the form's order (then k if
	// the form has an exponent); Fitted prints them in the form.
	Params []float64 `json:"params"`
	Fitted string    `json:"fitted"`
	// FitError is the fit's RMS relative error over the calibration points.
	FitError float64 `json:"fitError"`
	// PartialForm, PartialParams, PartialFitted and PartialFitError are
	// the same for partial syncs (empty: the mode has none, or the
	// calibration has no partial points and a partial sync costs a full
	// one).
	PartialForm     string    `json:"partialForm,omitempty"`
	PartialParams   []float64 `json:"partialParams,omitempty"`
	PartialFitted   string    `json:"partialFitted,omitempty"`
	PartialFitError float64   `json:"partialFitError,omitempty"`
	// MinObjects and MaxObjects are the measured range on the Objects axis;
	// MinServices and MaxServices the same in Services.
	MinObjects  int    `json:"minObjects"`
	MaxObjects  int    `json:"maxObjects"`
	MinServices int    `json:"minServices"`
	MaxServices int    `json:"maxServices"`
	Points      int    `json:"points"`
	Source      string `json:"source"`
	// Note says what the band rests on when it is not the fit alone (an
	// assumed scatter, an emulation ratio).
	Note    string `json:"note,omitempty"`
	full    fit
	partial *fit
	emul    *Emulation
}

// NewModel fits a calibration's points: the form of its mode and variant
// (package doc), by weighted least squares on relative error with
// non-negative coefficients. Points measured under emulation are divided by
// the emulation ratio first.
func NewModel(c Calibration) (Model, error) {
	if len(c.Points) == 0 {
		return Model{}, fmt.Errorf("calibration %s/%s has no points", c.Mode, c.Variant)
	}
	m := Model{Mode: string(c.Mode), Variant: c.Variant, Source: c.Source, Points: len(c.Points), emul: c.Emulation}
	m.MinObjects, m.MaxObjects = math.MaxInt, 0
	m.MinServices, m.MaxServices = math.MaxInt, 0
	ratio := func(int) float64 { return 1 }
	if e := c.Emulation; e != nil {
		if err := e.check(); err != nil {
			return Model{}, fmt.Errorf("calibration %s/%s: %w", c.Mode, c.Variant, err)
		}
		ratio = e.At
		if len(e.Sizes) > 0 {
			m.Note = fmt.Sprintf("measured under emulation, each point divided by the ratio at its size (%.3g-%.3g, median %.3g; %s)", e.Low, e.High, e.Ratio, e.Method)
		} else {
			m.Note = fmt.Sprintf("measured under emulation, divided by %.3g (range %.3g-%.3g, %s)", e.Ratio, e.Low, e.High, e.Method)
		}
	}
	var full, part []sample
	for _, p := range c.Points {
		cs := pointCounts(c.Mode, p)
		m.MinObjects, m.MaxObjects = min(m.MinObjects, cs.Objects), max(m.MaxObjects, cs.Objects)
		m.MinServices, m.MaxServices = min(m.MinServices, p.Services), max(m.MaxServices, p.Services)
		if !(p.FullSeconds > 0) {
			return Model{}, fmt.Errorf("calibration %s/%s: point at %d Services has fullSyncSeconds %g, want > 0", c.Mode, c.Variant, p.Services, p.FullSeconds)
		}
		r := ratio(p.Services)
		full = append(full, sample{cs, p.FullSeconds / r})
		if p.PartialSeconds > 0 {
			part = append(part, sample{cs, p.PartialSeconds / r})
		}
	}
	ff, pf := formsFor(c.Mode, c.Variant)
	var err error
	if m.full, err = fitForm(ff, full); err != nil {
		return Model{}, fmt.Errorf("calibration %s/%s: %w", c.Mode, c.Variant, err)
	}
	m.Form, m.Params, m.Fitted, m.FitError = ff.name, m.full.theta, m.full.describe(), m.full.rms
	if m.full.degenerate {
		m.Note = join(m.Note, fmt.Sprintf("the %d points cannot separate the %d free parameters: band from the scatter alone, at least %.0f %%", len(full), len(m.full.free), 100*assumedScatter))
	} else if m.full.assumed {
		m.Note = join(m.Note, fmt.Sprintf("%d points, %d free parameters: too few to estimate the scatter, %.0f %% assumed", len(full), len(m.full.free), 100*assumedScatter))
	}
	if f := m.full; f.f.kCount > 0 && f.f.pow >= 0 && f.theta[len(f.f.terms)] > f.f.kCount {
		m.Note = join(m.Note, fmt.Sprintf("past the largest measured point the %s term is held at that point's cost per step (exponent %g, the count's); the fitted k = %.2f is the band's far end",
			f.f.terms[f.f.pow].name, f.f.kCount, f.theta[len(f.f.terms)]))
	}
	if pf != nil && len(part) > 0 {
		p, err := fitForm(*pf, part)
		if err != nil {
			return Model{}, fmt.Errorf("calibration %s/%s partial syncs: %w", c.Mode, c.Variant, err)
		}
		m.partial = &p
		m.PartialForm, m.PartialParams, m.PartialFitted, m.PartialFitError = pf.name, p.theta, p.describe(), p.rms
	}
	return m, nil
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// pointCounts are the Counts of a calibration point's synthetic cluster
// (services x endpoints ClusterIP Services, calibrate.Synthetic), on the
// same axes as a simulated node's. The calibrated node hosts none of the
// endpoints (Local 0): sim calibrate programs them on another node, as
// dataplane/ipvs's calibrationNode says.
func pointCounts(mode cluster.Mode, p Point) Counts {
	if p.Services <= 0 || p.EndpointsPerService <= 0 {
		// Only a size is known: put it on every axis.
		return Counts{Mode: mode, Objects: p.Objects, Chains: p.Objects, VirtualServers: p.Objects, RealServers: p.Objects}
	}
	s := ServicePortInput{Endpoints: p.EndpointsPerService, Reachable: p.EndpointsPerService}
	return countRepeated(mode, s, p.Services, true)
}

// Full is the full sync time of a node programming c.
func (m Model) Full(c Counts) Estimate {
	y, rel, up := m.full.predict(c)
	return m.estimate(c, y, m.widen(m.full, c, rel), up)
}

// widen grows the band with the distance from the measured range, by
// 1 + |ln(size / nearest measured size)|: the whole of an assumed scatter
// (a fit without a covariance, whose band would otherwise not widen), and
// otherwise the floor the band takes from the fit error and the
// leave-one-out miss, which are measured inside the range only (the
// covariance part widens by itself).
func (m Model) widen(f fit, c Counts, rel float64) float64 {
	if m.MaxObjects <= 0 || c.Objects <= 0 {
		return rel
	}
	g := 1.0
	switch {
	case c.Objects > m.MaxObjects:
		g = 1 + math.Log(float64(c.Objects)/float64(m.MaxObjects))
	case c.Objects < m.MinObjects:
		g = 1 + math.Log(float64(m.MinObjects)/float64(c.Objects))
	}
	if f.assumed {
		return rel * g
	}
	return max(rel, max(f.rms, f.loo)*g)
}

// Partial is a partial sync's time on a node programming c: the partial
// fit, or a full sync where the mode has none (IPVS reconciles everything)
// or the calibration measured none.
func (m Model) Partial(c Counts) Estimate {
	if m.partial == nil {
		return m.Full(c)
	}
	y, rel, up := m.partial.predict(c)
	return m.estimate(c, y, m.widen(*m.partial, c, rel), up)
}

// estimate builds the band, y/(1+rel) to y*(1+rel)*up (rel is a 95 %
// half-width, multiplicative so that it stays positive; up widens the upper
// side alone, fit.predict), widened by an emulation ratio's range, and
// marks sizes outside the measured range.
func (m Model) estimate(c Counts, y, rel, up float64) Estimate {
	e := Estimate{Seconds: y, Low: y / (1 + rel), High: y * (1 + rel) * up}
	if em := m.emul; em != nil {
		e.Low /= em.High / em.Ratio
		e.High *= em.Ratio / em.Low
	}
	switch {
	case c.Objects > m.MaxObjects:
		e.Extrapolated, e.Factor = true, float64(c.Objects)/float64(m.MaxObjects)
	case c.Objects < m.MinObjects:
		e.Extrapolated, e.Factor = true, float64(c.Objects)/float64(m.MinObjects)
	}
	// Past the measured range of the full fit's power feature, whatever
	// the objects say (the full fit's: a partial sync of that node is
	// outside the range as well).
	if b := m.full.beyond(c); b > 0 && b > e.Factor {
		e.Extrapolated, e.Factor = true, b
	}
	return e
}

// SyntheticCounts are the Counts of services x endpoints ClusterIP
// Services (calibrate.Synthetic's cluster) on one node.
func SyntheticCounts(mode cluster.Mode, services, endpoints int) Counts {
	return pointCounts(mode, Point{Services: services, EndpointsPerService: endpoints})
}
