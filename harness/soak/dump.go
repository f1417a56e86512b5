package soak

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// CanonicalIPTablesSave returns iptables-save output in a canonical order
// that keeps every rule's meaning: per table (in name order), the chain
// declarations sorted, then each chain's rules in their own order, chains
// in name order. Comments and counters ([packets:bytes]) are dropped: two
// kernels that hold the same rules give the same lines.
func CanonicalIPTablesSave(save string) []string {
	type table struct {
		decls []string
		rules map[string][]string
	}
	tables := map[string]*table{}
	var cur *table
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || line == "COMMIT":
		case strings.HasPrefix(line, "*"):
			cur = &table{rules: map[string][]string{}}
			tables[line] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line)
			if len(f) >= 2 {
				cur.decls = append(cur.decls, f[0]+" "+f[1]) // name and policy, no counters
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) >= 2 {
				cur.rules[f[1]] = append(cur.rules[f[1]], stripRuleCounters(line))
			}
		default:
			cur.rules[""] = append(cur.rules[""], line)
		}
	}
	var out []string
	for _, name := range sortedStrings(tables) {
		t := tables[name]
		out = append(out, name)
		sort.Strings(t.decls)
		out = append(out, t.decls...)
		for _, c := range sortedStrings(t.rules) {
			out = append(out, t.rules[c]...)
		}
	}
	return out
}

var ruleCounters = regexp.MustCompile(`^\[\d+:\d+\] `)

func stripRuleCounters(line string) string { return ruleCounters.ReplaceAllString(line, "") }

func sortedStrings[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var (
	nftCounter = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	nftHandle  = regexp.MustCompile(`\s*# handle \d+$`)
	nftExpires = regexp.MustCompile(` expires [0-9hmsd]+`)
)

// CanonicalNFT returns `nft list ruleset` (or `nft list table`) output in a
// canonical order that keeps its meaning: each table's objects (chains,
// sets, maps, ...) in name order with their bodies, rules in their own
// order, set and map elements sorted one per line; counter values, handles
// and element expiry times dropped.
func CanonicalNFT(list string) []string {
	lines := strings.Split(list, "\n")
	type object struct {
		header string
		body   []string
	}
	var out []string
	var objs []*object
	var cur *object
	var table string
	depth := 0
	var elems strings.Builder
	inElems := false
	flushTable := func() {
		if table == "" {
			return
		}
		sort.SliceStable(objs, func(i, j int) bool { return objs[i].header < objs[j].header })
		out = append(out, table)
		for _, o := range objs {
			out = append(out, "  "+o.header)
			for _, b := range o.body {
				out = append(out, "    "+b)
			}
		}
		objs, table = nil, ""
	}
	for _, raw := range lines {
		line := strings.TrimSpace(nftHandle.ReplaceAllString(raw, ""))
		if line == "" {
			continue
		}
		if inElems {
			elems.WriteString(" " + line)
			if strings.Contains(line, "}") {
				inElems = false
				cur.body = append(cur.body, splitElements(elems.String())...)
			}
			continue
		}
		switch {
		case depth == 0 && strings.HasPrefix(line, "table ") && strings.HasSuffix(line, "{"):
			table = line
			depth = 1
		case depth == 1 && line == "}":
			flushTable()
			depth = 0
		case depth == 1 && strings.HasSuffix(line, "{"):
			cur = &object{header: line}
			objs = append(objs, cur)
			depth = 2
		case depth == 1:
			objs = append(objs, &object{header: line}) // a table attribute (comment, flags)
		case depth == 2 && line == "}":
			cur, depth = nil, 1
		case depth == 2 && strings.HasPrefix(line, "elements = {"):
			elems.Reset()
			elems.WriteString(line)
			if strings.Contains(line, "}") {
				cur.body = append(cur.body, splitElements(line)...)
			} else {
				inElems = true
			}
		case depth == 2:
			line = nftCounter.ReplaceAllString(line, "counter")
			cur.body = append(cur.body, line)
		default:
			out = append(out, line)
		}
	}
	flushTable()
	return out
}

// splitElements turns "elements = { a, b : c, ... }" into sorted lines
// "element a", "element b : c". Commas only separate elements (a verdict
// map's "goto chain" and a concatenation's " . " hold none).
func splitElements(s string) []string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "elements = {")
	s = strings.TrimSuffix(strings.TrimSpace(s), "}")
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.Join(strings.Fields(e), " ")
		e = nftCounter.ReplaceAllString(e, "counter")
		e = nftExpires.ReplaceAllString(e, "")
		if e != "" {
			out = append(out, "element "+e)
		}
	}
	sort.Strings(out)
	return out
}

var ipsetInitval = regexp.MustCompile(` initval 0x[0-9a-f]+`)

// CanonicalIPSetSave returns `ipset save` output sorted, without the random
// initval of each set and without member timeouts left.
func CanonicalIPSetSave(save string) []string {
	var out []string
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		line = ipsetInitval.ReplaceAllString(line, "")
		if strings.HasPrefix(line, "add ") {
			if i := strings.Index(line, " timeout "); i >= 0 {
				line = line[:i]
			}
		}
		out = append(out, line)
	}
	sort.Strings(out)
	return out
}

// maxDiffCells bounds the quadratic line diff; beyond it Diff falls back to
// a multiset difference (which misses reorderings, and says so).
const maxDiffCells = 16_000_000

// Diff returns the lines that differ between want and got: "-" only in
// want (the fresh render), "+" only in got (the soaked kernel), from a
// longest common subsequence, so a rule out of order shows up too.
func Diff(want, got []string) []string {
	n, m := len(want), len(got)
	if n*m > maxDiffCells {
		return multisetDiff(want, got)
	}
	// lcs[i][j] is the LCS length of want[i:] and got[j:].
	lcs := make([][]int32, n+1)
	for i := range lcs {
		lcs[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if want[i] == got[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < n && j < m {
		switch {
		case want[i] == got[j]:
			i++
			j++
		case lcs[i+1][j] >= lcs[i][j+1]:
			out = append(out, "- "+want[i])
			i++
		default:
			out = append(out, "+ "+got[j])
			j++
		}
	}
	for ; i < n; i++ {
		out = append(out, "- "+want[i])
	}
	for ; j < m; j++ {
		out = append(out, "+ "+got[j])
	}
	return out
}

func multisetDiff(want, got []string) []string {
	count := map[string]int{}
	for _, l := range want {
		count[l]++
	}
	for _, l := range got {
		count[l]--
	}
	var out []string
	for _, l := range sortedStrings(count) {
		for c := count[l]; c > 0; c-- {
			out = append(out, "- "+l)
		}
		for c := count[l]; c < 0; c++ {
			out = append(out, "+ "+l)
		}
	}
	if len(out) == 0 && len(want) != len(got) {
		out = append(out, fmt.Sprintf("! %d lines against %d", len(got), len(want)))
	}
	return out
}
