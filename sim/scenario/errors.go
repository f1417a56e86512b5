package scenario

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Pos is a position in a scenario file: 1-based line and column.
type Pos struct {
	Line   int `json:"line"`
	Column int `json:"column"`
}

// FieldError is one problem found in a scenario, located by file, position and
// field path (for example "objects[2].spec.ports[0].targetPort").
type FieldError struct {
	File    string `json:"file"`
	Pos     Pos    `json:"pos"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// Error formats the error as file:line:column: field: message.
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Pos.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Pos.Line, e.Pos.Column)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// Warning formats the error as a warning: file:line:column: warning:
// field: message.
func (e *FieldError) Warning() string {
	w := *e
	w.Field, w.Message = "warning", e.Message
	if e.Field != "" {
		w.Message = e.Field + ": " + e.Message
	}
	return w.Error()
}

// ErrorList is every problem found in one or more scenarios. A scenario is
// rejected as a whole when the list is not empty: nothing is half-applied.
type ErrorList []*FieldError

// Error joins the errors one per line, sorted by file and position.
func (l ErrorList) Error() string {
	l.Sort()
	lines := make([]string, len(l))
	for i, e := range l {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Sort orders the list by file, line, column and field.
func (l ErrorList) Sort() {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Pos.Line != b.Pos.Line {
			return a.Pos.Line < b.Pos.Line
		}
		if a.Pos.Column != b.Pos.Column {
			return a.Pos.Column < b.Pos.Column
		}
		return a.Field < b.Field
	})
}

// IsInvalid reports whether err is (or wraps) an ErrorList, i.e. the input was
// bad rather than the environment.
func IsInvalid(err error) bool {
	var l ErrorList
	var fe *FieldError
	return asError(err, &l) || asError(err, &fe)
}

// reporter collects errors for one file, locating field paths through the
// positions recorded while the YAML tree was walked.
type reporter struct {
	file string
	pos  map[string]Pos
	errs ErrorList
}

// at records an error for path, located at the path's node, or at the nearest
// ancestor that has a position (a missing field is reported where its parent
// is).
func (r *reporter) at(path string, format string, args ...any) {
	r.errs = append(r.errs, &FieldError{File: r.file, Pos: r.lookup(path), Field: path, Message: fmt.Sprintf(format, args...)})
}

func (r *reporter) lookup(path string) Pos {
	for p := path; ; {
		if pos, ok := r.pos[p]; ok {
			return pos
		}
		i := strings.LastIndexAny(p, ".[")
		if i <= 0 {
			if pos, ok := r.pos[""]; ok {
				return pos
			}
			return Pos{Line: 1, Column: 1}
		}
		p = p[:i]
	}
}

func asError[T error](err error, target *T) bool { return errors.As(err, target) }
