package dataplanetest

import (
	"fmt"
	"os"
	"strings"
)

// UpstreamExpectation reads, from a kube-proxy test file of the pinned
// release (testenv.UpstreamSource), the text of the n-th (from 0)
// dedent.Dedent(`...`) literal inside function fn, dedented as
// github.com/lithammer/dedent does: the common leading whitespace of the
// non-blank lines removed, the leading newline dropped. These are
// kube-proxy's own expected rulesets (TestOverallIPTablesRules, ...), held
// out of this repository and read where `make upstream` leaves them.
func UpstreamExpectation(file, fn string, n int) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	src := string(data)
	start := strings.Index(src, "\nfunc "+fn+"(")
	if start < 0 {
		return "", fmt.Errorf("%s: no function %s", file, fn)
	}
	body := src[start+1:]
	if end := strings.Index(body, "\n}\n"); end >= 0 {
		body = body[:end]
	}
	const open = "dedent.Dedent(`"
	for i := 0; ; i++ {
		j := strings.Index(body, open)
		if j < 0 {
			return "", fmt.Errorf("%s: %s has %d dedent literals, want index %d", file, fn, i, n)
		}
		body = body[j+len(open):]
		k := strings.Index(body, "`")
		if k < 0 {
			return "", fmt.Errorf("%s: %s: unterminated literal", file, fn)
		}
		if i == n {
			return dedent(body[:k]), nil
		}
		body = body[k+1:]
	}
}

// UpstreamVar reads the dedent.Dedent(`...`) literal a package-level
// variable of a kube-proxy test file is set to ("var baseRules =
// dedent.Dedent(`...`)"), dedented.
func UpstreamVar(file, name string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	src := string(data)
	decl := "\nvar " + name + " = dedent.Dedent(`"
	i := strings.Index(src, decl)
	if i < 0 {
		return "", fmt.Errorf("%s: no variable %s set to a dedent literal", file, name)
	}
	body := src[i+len(decl):]
	k := strings.Index(body, "`")
	if k < 0 {
		return "", fmt.Errorf("%s: %s: unterminated literal", file, name)
	}
	return dedent(body[:k]), nil
}

// dedent removes the longest whitespace prefix common to every non-blank
// line, and a leading newline.
func dedent(s string) string {
	lines := strings.Split(strings.TrimPrefix(s, "\n"), "\n")
	prefix := ""
	first := true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		ws := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = ws, false
			continue
		}
		for !strings.HasPrefix(ws, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			lines[i] = ""
			continue
		}
		lines[i] = strings.TrimPrefix(l, prefix)
	}
	return strings.Join(lines, "\n")
}
