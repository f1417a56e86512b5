package app

import (
	"fmt"
	"io"
	"strings"

	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/simulate"
)

// writeFits prints, as a Markdown table, the cost model sim/cost fits to
// each calibration in dir (sim calibrate --fit DIR): form, fitted
// parameters, fit error, measured range, and the full sync estimate at a
// few sizes with its band and mark. It needs no root: it measures nothing.
func writeFits(w io.Writer, dir string, endpoints int) error {
	cals, err := simulate.Calibrations(dir)
	if err != nil {
		return &UsageError{Err: fmt.Errorf("--fit: %w", err)}
	}
	sizes := []int{1000, 5000, 10000, 30000}
	fmt.Fprintf(w, "| mode/variant | points (Services) | full sync: fitted form | RMS error | partial sync: fitted form | RMS error |")
	for _, n := range sizes {
		fmt.Fprintf(w, " full at %d x %d |", n, endpoints)
	}
	fmt.Fprintf(w, "\n|---|---|---|---|---|---|%s\n", strings.Repeat("---|", len(sizes)))
	for _, c := range cals {
		m, err := cost.NewModel(c)
		if err != nil {
			return &UsageError{Err: fmt.Errorf("--fit: %w", err)}
		}
		src := ""
		if strings.HasPrefix(c.Source, "not in ") || strings.Contains(c.Source, "estimate") {
			src = " (default, not measured here)"
		}
		partial, perr := "none (a partial sync is a full one)", "-"
		if m.PartialFitted != "" {
			partial, perr = m.PartialFitted, fmt.Sprintf("%.0f %%", 100*m.PartialFitError)
		}
		note := ""
		if m.Note != "" {
			note = "; " + m.Note
		}
		fmt.Fprintf(w, "| %s/%s%s | %d (%d-%d) | %s%s | %.0f %% | %s | %s |", m.Mode, m.Variant, src, m.Points, m.MinServices, m.MaxServices, m.Fitted, note, 100*m.FitError, partial, perr)
		for _, n := range sizes {
			fmt.Fprintf(w, " %s |", m.Full(cost.SyntheticCounts(c.Mode, n, endpoints)))
		}
		fmt.Fprintln(w)
	}
	return nil
}
