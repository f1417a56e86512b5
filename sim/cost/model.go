package cost

import (
	"fmt"
	"math"
)

// Emulation says that a calibration was measured on an emulated CPU (the
// microVM under TCG) and how much slower that CPU is than the host's: the
// ratio of the same iptables-legacy calibration in the VM and on the host,
// with its range. A model divides the VM's times by Ratio and widens its
// band by the range.
type Emulation struct {
	Ratio  float64 `json:"ratio"`
	Low    float64 `json:"low"`
	High   float64 `json:"high"`
	Method string  `json:"method"`
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
	return fmt.Sprintf("%.3g s (extrapolated, %.2gx %s measured size; %.3g-%.3g s)", e.Seconds, e.Factor, where, e.Low, e.High)
}

// Model is the fitted sync cost of one mode and variant.
type Model struct {
	Mode    string `json:"mode"`
	Variant string `json:"variant"`
	// Form is the functional form in words and symbols, e.g.
	// "a + b*lines + c*chains^k".
	Form   string    `json:"form"`
	Params []float64 `json:"params"`
	// FitError is the fit's RMS relative error over the calibration points.
	FitError float64 `json:"fitError"`
	// MinObjects and MaxObjects are the measured range on the Objects axis;
	// MinServices and MaxServices the same in Services.
	MinObjects  int    `json:"minObjects"`
	MaxObjects  int    `json:"maxObjects"`
	MinServices int    `json:"minServices"`
	MaxServices int    `json:"maxServices"`
	Source      string `json:"source"`
	cal         Calibration
}

// NewModel fits a calibration's points.
func NewModel(c Calibration) (Model, error) {
	if len(c.Points) == 0 {
		return Model{}, fmt.Errorf("calibration %s/%s has no points", c.Mode, c.Variant)
	}
	m := Model{Mode: string(c.Mode), Variant: c.Variant, Form: "log-log interpolation", Source: c.Source, cal: c}
	m.MinObjects, m.MaxObjects = math.MaxInt, 0
	m.MinServices, m.MaxServices = math.MaxInt, 0
	for _, p := range c.Points {
		m.MinObjects, m.MaxObjects = min(m.MinObjects, p.Objects), max(m.MaxObjects, p.Objects)
		m.MinServices, m.MaxServices = min(m.MinServices, p.Services), max(m.MaxServices, p.Services)
	}
	return m, nil
}

// Full is the full sync time of a node programming c.
func (m Model) Full(c Counts) Estimate {
	return m.estimate(c, m.cal.FullSync(c.Objects))
}

// Partial is a partial sync's time on a node programming c.
func (m Model) Partial(c Counts) Estimate {
	return m.estimate(c, m.cal.PartialSync(c.Objects))
}

func (m Model) estimate(c Counts, s float64) Estimate {
	e := Estimate{Seconds: s, Low: s, High: s}
	switch {
	case c.Objects > m.MaxObjects:
		e.Extrapolated, e.Factor = true, float64(c.Objects)/float64(m.MaxObjects)
	case c.Objects < m.MinObjects:
		e.Extrapolated, e.Factor = true, float64(c.Objects)/float64(m.MinObjects)
	}
	return e
}
