package diagnose

// The text form of nftables rulesets as `nft list ruleset` and `nft list
// table` print them: tables holding sets, maps and chains, one statement a
// line, `{ ... }` blocks that may span lines (set elements), `;` between
// the parts of a chain's header, `#` comments, double-quoted strings. The
// reader turns it into nftTables (nft.go) without knowing what the rules
// mean; the rules' words are passed on as text, as knftables holds them.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/sim/scenario"
)

// nftTokKind is the kind of a token of the text form.
type nftTokKind int

const (
	tokWord nftTokKind = iota
	tokString
	tokOpen  // {
	tokClose // }
	tokSemi  // ;
	tokComma // , (followed by a space, a line end or a closing brace)
	tokNL
	tokEOF
)

type nftTok struct {
	kind      nftTokKind
	text      string // the word, or the string without its quotes
	line, col int
}

func (t nftTok) String() string {
	switch t.kind {
	case tokString:
		return strconv.Quote(t.text)
	case tokNL:
		return "end of line"
	case tokEOF:
		return "end of input"
	}
	return strconv.Quote(t.text)
}

// lexNFT splits data into tokens. An unterminated string is an error.
func lexNFT(file string, data []byte) ([]nftTok, error) {
	var toks []nftTok
	line, col := 1, 1
	s := string(data)
	for i := 0; i < len(s); {
		c := s[i]
		start := col
		switch {
		case c == '\n':
			toks = append(toks, nftTok{kind: tokNL, text: "\n", line: line, col: col})
			line, col = line+1, 1
			i++
			continue
		case c == ' ' || c == '\t' || c == '\r':
			i, col = i+1, col+1
			continue
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i, col = i+1, col+1
			}
			continue
		case c == '"':
			j := i + 1
			var b strings.Builder
			for j < len(s) && s[j] != '"' && s[j] != '\n' {
				if s[j] == '\\' && j+1 < len(s) && s[j+1] != '\n' {
					j++
				}
				b.WriteByte(s[j])
				j++
			}
			if j >= len(s) || s[j] != '"' {
				return nil, &scenario.FieldError{File: file, Pos: scenario.Pos{Line: line, Column: start},
					Field: "string", Message: "unterminated string: expected a closing \" on the same line"}
			}
			toks = append(toks, nftTok{kind: tokString, text: b.String(), line: line, col: start})
			col += j + 1 - i
			i = j + 1
			continue
		case c == '{' || c == '}' || c == ';':
			k := map[byte]nftTokKind{'{': tokOpen, '}': tokClose, ';': tokSemi}[c]
			toks = append(toks, nftTok{kind: k, text: string(c), line: line, col: col})
			i, col = i+1, col+1
			continue
		}
		j := i
		for j < len(s) {
			d := s[j]
			if d == ' ' || d == '\t' || d == '\r' || d == '\n' || d == '{' || d == '}' || d == ';' || d == '"' {
				break
			}
			if d == ',' && (j+1 == len(s) || strings.IndexByte(" \t\r\n}", s[j+1]) >= 0) {
				break
			}
			j++
		}
		if j > i {
			toks = append(toks, nftTok{kind: tokWord, text: s[i:j], line: line, col: col})
			col += j - i
			i = j
		}
		if i < len(s) && s[i] == ',' {
			toks = append(toks, nftTok{kind: tokComma, text: ",", line: line, col: col})
			i, col = i+1, col+1
		}
	}
	toks = append(toks, nftTok{kind: tokEOF, line: line, col: col})
	return toks, nil
}

// nftTextParser reads the token stream of one file.
type nftTextParser struct {
	file  string
	lines []string
	toks  []nftTok
	i     int
}

func (p *nftTextParser) peek() nftTok { return p.toks[p.i] }

func (p *nftTextParser) next() nftTok {
	t := p.toks[p.i]
	if t.kind != tokEOF {
		p.i++
	}
	return t
}

func (p *nftTextParser) errAt(t nftTok, field, format string, args ...any) error {
	return &scenario.FieldError{File: p.file, Pos: scenario.Pos{Line: t.line, Column: t.col}, Field: field,
		Message: fmt.Sprintf(format, args...)}
}

func (p *nftTextParser) lineAt(n int) Line {
	text := ""
	if n >= 1 && n <= len(p.lines) {
		text = strings.TrimSpace(p.lines[n-1])
	}
	return Line{File: p.file, Line: n, Text: text}
}

// skipSeparators skips line ends and semicolons.
func (p *nftTextParser) skipSeparators() {
	for k := p.peek().kind; k == tokNL || k == tokSemi; k = p.peek().kind {
		p.next()
	}
}

// word reads a word (or, where a name may be quoted, a string).
func (p *nftTextParser) word(field, what string) (nftTok, error) {
	t := p.next()
	if t.kind != tokWord && t.kind != tokString {
		return t, p.errAt(t, field, "expected %s, found %s", what, t)
	}
	return t, nil
}

func (p *nftTextParser) expect(kind nftTokKind, field, what string) (nftTok, error) {
	t := p.next()
	if t.kind != kind {
		return t, p.errAt(t, field, "expected %s, found %s", what, t)
	}
	return t, nil
}

// parseNFTText reads a ruleset as nft lists it.
func parseNFTText(file string, data []byte) ([]*nftTable, error) {
	toks, err := lexNFT(file, data)
	if err != nil {
		return nil, err
	}
	p := &nftTextParser{file: file, lines: strings.Split(string(data), "\n"), toks: toks}
	var tables []*nftTable
	for {
		p.skipSeparators()
		t := p.peek()
		if t.kind == tokEOF {
			return tables, nil
		}
		if t.kind != tokWord || t.text != "table" {
			return nil, p.errAt(t, "ruleset", "expected \"table\" (every statement of a listing is inside a table), found %s", t)
		}
		tb, err := p.table()
		if err != nil {
			return nil, err
		}
		tables = append(tables, tb)
	}
}

func (p *nftTextParser) table() (*nftTable, error) {
	start := p.next() // "table"
	fam, err := p.word("table", "a family (ip, ip6, inet, arp, bridge, netdev)")
	if err != nil {
		return nil, err
	}
	name, err := p.word("table "+fam.text, "a table name")
	if err != nil {
		return nil, err
	}
	field := "table " + fam.text + " " + name.text
	if _, err := p.expect(tokOpen, field, "\"{\""); err != nil {
		return nil, err
	}
	tb := &nftTable{family: fam.text, name: name.text, line: p.lineAt(start.line)}
	for {
		t, closed, err := p.item(field, "table", start)
		switch {
		case err != nil:
			return nil, err
		case closed:
			tb.lines = t.line - start.line + 1
			return tb, nil
		case t.kind != tokWord:
			return nil, p.errAt(t, field, "expected a set, map, chain or table property, found %s", t)
		}
		switch t.text {
		case "comment":
			p.next()
			s, err := p.expect(tokString, field+" comment", "a quoted string")
			if err != nil {
				return nil, err
			}
			tb.comment = s.text
		case "flags":
			p.next()
			if _, err := p.word(field+" flags", "table flags"); err != nil {
				return nil, err
			}
		case "chain":
			c, err := p.chain(field)
			if err != nil {
				return nil, err
			}
			tb.chains = append(tb.chains, c)
		case "set", "map":
			s, err := p.set(field)
			if err != nil {
				return nil, err
			}
			tb.sets = append(tb.sets, s)
		default:
			// flowtable, counter, quota, ct helper, ...: kept whole,
			// reported as not understood.
			words, err := p.statement(field)
			if err != nil {
				return nil, err
			}
			tb.skipped = append(tb.skipped, Skipped{Line: p.lineAt(t.line),
				Reason: fmt.Sprintf("object %q is not one kube-proxy writes", strings.Join(firstWords(words, 2), " "))})
		}
	}
}

// statement reads tokens up to the end of the line (or a ";" or the
// closing brace of the enclosing block), taking nested { } blocks whole,
// whatever lines they span. The words are returned; a nested block's
// braces are words "{" and "}" and its commas ",".
func (p *nftTextParser) statement(field string) ([]nftTok, error) {
	var out []nftTok
	depth := 0
	var opened []nftTok
	for {
		t := p.peek()
		switch t.kind {
		case tokEOF:
			if depth > 0 {
				return nil, p.errAt(t, field, "expected \"}\" closing the block opened at line %d:%d (unbalanced braces)",
					opened[len(opened)-1].line, opened[len(opened)-1].col)
			}
			return out, nil
		case tokNL, tokSemi:
			if depth == 0 {
				return out, nil
			}
			p.next()
			continue
		case tokClose:
			if depth == 0 {
				return out, nil
			}
			depth--
			opened = opened[:len(opened)-1]
		case tokOpen:
			depth++
			opened = append(opened, t)
		}
		out = append(out, p.next())
	}
}

func firstWords(toks []nftTok, n int) []string {
	var out []string
	for _, t := range toks[:min(n, len(toks))] {
		out = append(out, t.text)
	}
	return out
}

// open reads the start of a chain, set or map block inside the table
// tfield: the keyword, the name and "{". field is what errors inside the
// block name ("chain NAME", "set NAME").
func (p *nftTextParser) open(tfield string) (start nftTok, name, field string, err error) {
	start = p.next() // "chain", "set" or "map"
	what := "a " + start.text + " name"
	n, err := p.word(tfield+" "+start.text, what)
	if err != nil {
		return start, "", "", err
	}
	field = start.text + " " + n.text
	if _, err := p.expect(tokOpen, field, "\"{\""); err != nil {
		return start, "", "", err
	}
	return start, n.text, field, nil
}

// item skips separators and peeks at the next item of the block (a
// kind, "table", "chain", ..., opened by start). At the block's "}" it
// takes it and says closed; at the end of the input the braces are
// unbalanced.
func (p *nftTextParser) item(field, kind string, start nftTok) (t nftTok, closed bool, err error) {
	p.skipSeparators()
	t = p.peek()
	switch t.kind {
	case tokClose:
		p.next()
		return t, true, nil
	case tokEOF:
		return t, false, p.errAt(t, field, "expected \"}\" closing the %s opened at line %d (unbalanced braces)", kind, start.line)
	}
	return t, false, nil
}

func (p *nftTextParser) chain(tfield string) (*nftChain, error) {
	start, name, field, err := p.open(tfield)
	if err != nil {
		return nil, err
	}
	c := &nftChain{name: name, line: p.lineAt(start.line)}
	for {
		t, closed, err := p.item(field, "chain", start)
		switch {
		case err != nil:
			return nil, err
		case closed:
			return c, nil
		case t.kind == tokWord && t.text == "type" && len(c.rules) == 0:
			// type filter hook input [device X] priority P
			words, err := p.header(field)
			if err != nil {
				return nil, err
			}
			if err := p.chainHeader(c, words, field); err != nil {
				return nil, err
			}
			continue
		case t.kind == tokWord && t.text == "policy" && len(c.rules) == 0:
			p.next()
			w, err := p.word(field+" policy", "accept or drop")
			if err != nil {
				return nil, err
			}
			c.policy = w.text
			continue
		case t.kind == tokWord && t.text == "comment" && len(c.rules) == 0:
			p.next()
			if _, err := p.expect(tokString, field+" comment", "a quoted string"); err != nil {
				return nil, err
			}
			continue
		}
		words, err := p.statement(field)
		if err != nil {
			return nil, err
		}
		if len(words) == 0 {
			return nil, p.errAt(t, field, "expected a rule or \"}\", found %s", t)
		}
		c.rules = append(c.rules, ruleFromWords(words, p.lineAt(t.line)))
	}
}

// header reads the words of one ";"-terminated header part.
func (p *nftTextParser) header(field string) ([]nftTok, error) {
	var out []nftTok
	for {
		t := p.peek()
		switch t.kind {
		case tokSemi, tokNL, tokClose, tokEOF:
			return out, nil
		case tokWord, tokString:
			out = append(out, p.next())
		default:
			return nil, p.errAt(t, field, "expected the chain's type, hook and priority, found %s", t)
		}
	}
}

func (p *nftTextParser) chainHeader(c *nftChain, words []nftTok, field string) error {
	for i := 0; i < len(words); i++ {
		w := words[i].text
		switch w {
		case "type", "hook", "device":
			if i+1 >= len(words) {
				return p.errAt(words[i], field, "expected a value after %q", w)
			}
			i++
			switch w {
			case "type":
				c.typ = words[i].text
			case "hook":
				c.hook = words[i].text
			}
		case "priority":
			var prio []string
			for _, x := range words[i+1:] {
				prio = append(prio, x.text)
			}
			if len(prio) == 0 {
				return p.errAt(words[i], field, "expected a priority after \"priority\"")
			}
			c.prio = strings.Join(prio, "") // "dstnat - 10" -> "dstnat-10"
			return nil
		default:
			return p.errAt(words[i], field, "expected type, hook or priority, found %q", w)
		}
	}
	return nil
}

// ruleFromWords joins a rule's words as knftables holds a rule, taking
// its trailing comment and the values of its counters apart.
func ruleFromWords(words []nftTok, line Line) nftRule {
	r := nftRule{line: line}
	var parts []string
	for i := 0; i < len(words); i++ {
		t := words[i]
		switch {
		case t.kind == tokWord && t.text == "comment" && i+1 < len(words) && words[i+1].kind == tokString:
			r.comment = words[i+1].text
			i++
			continue
		case t.kind == tokWord && t.text == "counter" && i+4 < len(words) && words[i+1].text == "packets" && words[i+3].text == "bytes":
			pk, err1 := strconv.ParseUint(words[i+2].text, 10, 64)
			by, err2 := strconv.ParseUint(words[i+4].text, 10, 64)
			if err1 == nil && err2 == nil {
				r.counter = &[2]uint64{pk, by}
			}
		case t.kind == tokString:
			parts = append(parts, strconv.Quote(t.text))
			continue
		}
		parts = append(parts, t.text)
	}
	r.text = strings.Join(parts, " ")
	return r
}

func (p *nftTextParser) set(tfield string) (*nftSet, error) {
	start, name, field, err := p.open(tfield)
	if err != nil {
		return nil, err
	}
	s := &nftSet{name: name, isMap: start.text == "map", line: p.lineAt(start.line)}
	for {
		t, closed, err := p.item(field, start.text, start)
		switch {
		case err != nil:
			return nil, err
		case closed:
			return s, nil
		case t.kind != tokWord:
			return nil, p.errAt(t, field, "expected a %s property (type, flags, timeout, elements, ...), found %s", start.text, t)
		}
		if t.text == "elements" {
			if err := p.elements(s, field); err != nil {
				return nil, err
			}
			continue
		}
		words, err := p.statement(field)
		if err != nil {
			return nil, err
		}
		var rest []string
		for _, w := range words[1:] {
			rest = append(rest, w.text)
		}
		switch t.text {
		case "type", "typeof":
			s.typ = strings.Join(rest, " ")
			s.typeof = t.text == "typeof"
		case "flags":
			for _, f := range rest {
				for _, x := range strings.Split(f, ",") {
					if x != "" && x != "," {
						s.flags = append(s.flags, x)
					}
				}
			}
		case "timeout":
			if len(rest) != 1 {
				return nil, p.errAt(t, field+" timeout", "expected one duration (3h, 10800s)")
			}
			d, err := parseNFTDuration(rest[0])
			if err != nil {
				return nil, p.errAt(words[1], field+" timeout", "expected a duration (3h, 10800s), found %q", rest[0])
			}
			s.timeout = &d
		case "comment":
			if len(words) == 2 && words[1].kind == tokString {
				s.comment = words[1].text
			}
		case "size", "gc-interval", "policy", "counter", "auto-merge":
		default:
			s.skipped = append(s.skipped, Skipped{Line: p.lineAt(t.line),
				Reason: fmt.Sprintf("%s property %q is not one kube-proxy writes", start.text, t.text)})
		}
	}
}

// elements reads `elements = { e, e, ... }`.
func (p *nftTextParser) elements(s *nftSet, sfield string) error {
	p.next() // "elements"
	field := sfield + " elements"
	if t := p.next(); t.kind != tokWord || t.text != "=" {
		return p.errAt(t, field, "expected \"=\", found %s", t)
	}
	open, err := p.expect(tokOpen, field, "\"{\"")
	if err != nil {
		return err
	}
	var cur []nftTok
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		e, err := p.element(cur, s.isMap, field)
		if err != nil {
			return err
		}
		s.elems = append(s.elems, e)
		cur = nil
		return nil
	}
	for {
		t := p.next()
		switch t.kind {
		case tokEOF:
			return p.errAt(t, field, "expected \"}\" closing the elements opened at line %d:%d (unbalanced braces)", open.line, open.col)
		case tokNL:
			continue
		case tokComma:
			if err := flush(); err != nil {
				return err
			}
		case tokClose:
			return flush()
		case tokOpen, tokSemi:
			return p.errAt(t, field, "expected an element, \",\" or \"}\", found %s", t)
		default:
			cur = append(cur, t)
		}
	}
}

// element reads one element: KEY [timeout D] [expires D] [comment "C"]
// [counter packets N bytes M] [: VALUE], KEY and VALUE being words joined
// by "." for concatenations.
func (p *nftTextParser) element(words []nftTok, isMap bool, field string) (nftElem, error) {
	e := nftElem{line: p.lineAt(words[0].line)}
	var key, value []string
	inValue := false
	part := func(dst *[]string, w string) {
		if w == "." {
			*dst = append(*dst, "")
			return
		}
		if len(*dst) == 0 {
			*dst = append(*dst, w)
			return
		}
		last := &(*dst)[len(*dst)-1]
		if *last == "" {
			*last = w
		} else {
			*last += " " + w
		}
	}
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w.kind == tokWord && w.text == ":" && isMap && !inValue:
			inValue = true
			continue
		case w.kind == tokWord && (w.text == "timeout" || w.text == "expires") && !inValue && i+1 < len(words):
			d, err := parseNFTDuration(words[i+1].text)
			if err != nil {
				return e, p.errAt(words[i+1], field, "expected a duration after %q, found %q", w.text, words[i+1].text)
			}
			if w.text == "timeout" {
				e.timeout = d
			} else {
				e.expires = d
			}
			i++
			continue
		case w.kind == tokWord && w.text == "comment" && i+1 < len(words) && words[i+1].kind == tokString:
			e.comment = words[i+1].text
			i++
			continue
		case w.kind == tokWord && w.text == "counter" && !inValue:
			if i+4 < len(words) && words[i+1].text == "packets" && words[i+3].text == "bytes" {
				i += 4
			}
			continue
		}
		if inValue {
			part(&value, w.text)
		} else {
			part(&key, w.text)
		}
	}
	if len(key) == 0 || key[len(key)-1] == "" {
		return e, p.errAt(words[0], field, "expected an element key")
	}
	if isMap && (!inValue || len(value) == 0 || value[len(value)-1] == "") {
		return e, p.errAt(words[0], field, "expected \"KEY : VALUE\" in a map element")
	}
	e.key, e.value = key, value
	return e, nil
}

// parseNFTDuration reads a duration as nft prints it: 3h, 1d2h, 59m59s968ms.
func parseNFTDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	var d time.Duration
	for s != "" {
		j := 0
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == 0 || j > 12 {
			return 0, fmt.Errorf("bad duration %q", s)
		}
		n, _ := strconv.ParseInt(s[:j], 10, 64)
		s = s[j:]
		var unit time.Duration
		switch {
		case strings.HasPrefix(s, "ms"):
			unit, s = time.Millisecond, s[2:]
		case strings.HasPrefix(s, "d"):
			unit, s = 24*time.Hour, s[1:]
		case strings.HasPrefix(s, "h"):
			unit, s = time.Hour, s[1:]
		case strings.HasPrefix(s, "m"):
			unit, s = time.Minute, s[1:]
		case strings.HasPrefix(s, "s"):
			unit, s = time.Second, s[1:]
		case s == "":
			unit = time.Second // a bare number is seconds
		default:
			return 0, fmt.Errorf("bad duration unit in %q", s)
		}
		d += time.Duration(n) * unit
	}
	return d, nil
}
