package app

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/sim/scenario"
)

// expandArgs turns FILE|DIR arguments into scenario files: a directory gives
// its *.yaml and *.yml files (recursively), sorted.
func expandArgs(args []string) ([]string, error) {
	var files []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, &UsageError{Err: fmt.Errorf("no such scenario file or directory: %s", a)}
		}
		if !st.IsDir() {
			files = append(files, a)
			continue
		}
		var found []string
		err = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("could not read directory %s: %w", a, err)
		}
		if len(found) == 0 {
			return nil, &UsageError{Err: fmt.Errorf("directory %s holds no .yaml scenario", a)}
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	return files, nil
}

// printWarnings writes a scenario's warnings (accepted, not modelled or
// inferred) one per line: file:line:column: warning: field: message.
func printWarnings(w io.Writer, l scenario.ErrorList) {
	l.Sort()
	for _, e := range l {
		fmt.Fprintln(w, e.Warning())
	}
}

type validateResult struct {
	File   string                 `json:"file"`
	Valid  bool                   `json:"valid"`
	Errors []*scenario.FieldError `json:"errors,omitempty"`
}

func newValidate(s Streams) *cobra.Command {
	var o outputFlag
	c := &cobra.Command{
		Use:   "validate FILE|DIR...",
		Short: "Check scenario files without running them",
		Long: `validate loads, checks and expands each scenario and reports every problem
with file:line:column and the field path. Exit 0 when all are valid, 2 otherwise.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			files, err := expandArgs(args)
			if err != nil {
				return err
			}
			var results []validateResult
			var all scenario.ErrorList
			for _, f := range files {
				r := validateResult{File: f, Valid: true}
				l, err := scenario.LoadFile(f)
				if err == nil {
					printWarnings(s.Err, l.Warnings)
					_, err = scenario.Expand(l, nil)
				}
				if err != nil {
					el, ok := err.(scenario.ErrorList)
					if !ok {
						return &UsageError{Err: err}
					}
					r.Valid = false
					r.Errors = el
					all = append(all, el...)
				}
				results = append(results, r)
			}
			if o.format == "json" {
				if err := writeJSON(s.Out, results); err != nil {
					return err
				}
			} else {
				for _, r := range results {
					if r.Valid {
						fmt.Fprintf(s.Out, "%s: valid\n", r.File)
					} else {
						for _, e := range r.Errors {
							fmt.Fprintln(s.Out, e.Error())
						}
					}
				}
			}
			if len(all) > 0 {
				return &invalidSummary{n: len(all), files: countInvalid(results), list: all}
			}
			return nil
		},
	}
	o.add(c)
	return c
}

func countInvalid(rs []validateResult) int {
	n := 0
	for _, r := range rs {
		if !r.Valid {
			n++
		}
	}
	return n
}

// invalidSummary is returned after the errors were printed: it carries the
// bad-input exit code with a one-line summary.
type invalidSummary struct {
	n, files int
	list     scenario.ErrorList
}

func (e *invalidSummary) Error() string {
	return fmt.Sprintf("%d problem(s) in %d scenario file(s)", e.n, e.files)
}
func (e *invalidSummary) Unwrap() error { return e.list }
