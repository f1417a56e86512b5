// Package restore reads and writes the argument lines of iptables-restore
// input the way iptables does: Tokenize splits a line into arguments,
// JoinArgs quotes arguments into a line that Tokenize (and iptables-restore)
// splits back. The iptables backend's renderer, fake and counter parser
// and the IPVS backend's fake system use it; it imports nothing from the
// module.
package restore

import (
	"errors"
	"strings"
)

// ErrUnterminatedQuote is returned by Tokenize for a line whose last quoted
// argument is not closed.
var ErrUnterminatedQuote = errors.New("unterminated quote")

// Tokenize splits a restore line into arguments as iptables-restore does
// (add_param_to_argv in iptables' xshared.c): on blanks; a double quote opens
// a quoted part in which blanks are kept and a backslash takes the next
// character as it is (\" is a quote, \\ a backslash), and the closing quote
// ends the argument. Outside quotes a backslash is an ordinary character.
func Tokenize(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, escaped, have := false, false, false
	emit := func() {
		out = append(out, cur.String())
		cur.Reset()
		have = false
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		if inQuote {
			switch {
			case escaped:
				cur.WriteByte(c)
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inQuote = false
				emit()
			default:
				cur.WriteByte(c)
			}
			continue
		}
		switch c {
		case '"':
			inQuote, have = true, true
		case ' ', '\t':
			if have {
				emit()
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, ErrUnterminatedQuote
	}
	if have {
		emit()
	}
	return out, nil
}

// quoteEscaper escapes a quoted argument for iptables-restore.
var quoteEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

// JoinArgs joins iptables arguments into one restore line, quoting those
// that are empty or hold blanks or quotes as iptables-save does; inside the
// quotes a quote or a backslash is escaped with a backslash (Tokenize reads
// it back).
func JoinArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			q[i] = `"` + quoteEscaper.Replace(a) + `"`
		} else {
			q[i] = a
		}
	}
	return strings.Join(q, " ")
}
