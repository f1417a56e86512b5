package diagnose

// The conntrack reader: what `conntrack -L` (conntrack-tools 1.4.x,
// libnetfilter_conntrack's default output) prints, one entry a line:
//
//	[ipv4     2 ]tcp      6 431999 ESTABLISHED src=A dst=B sport=P dport=Q [zone-orig=Z] [packets=N bytes=N]
//	    [UNREPLIED] src=C dst=D sport=R dport=S [zone-reply=Z] [packets=N bytes=N]
//	    [[ASSURED]|[OFFLOAD]|[HW_OFFLOAD]] [mark=M] [secmark=M] [secctx=S] [zone=Z] [delta-time=T]
//	    [[start=DATE]] [[stop=DATE]] [helper=H] [use=U] [id=I] [labels=L,...]
//
// The layer-3 prefix is `-o extended` (and /proc/net/nf_conntrack); the
// timeout is seconds left; the state is TCP's (SCTP's, DCCP's), absent
// for UDP and ICMP; ICMP tuples carry type= code= id=, GRE srckey=
// dstkey=. conntrack writes the entries through stdio's buffer and its
// count ("conntrack v1.4.7 (conntrack-tools): N flow entries have been
// shown.") unbuffered on stderr, so with 2>&1 into a file the count line
// lands where the buffer was cut, often inside an entry: the reader takes
// it out wherever it is and joins the entry's two halves. Any other
// "conntrack vX (conntrack-tools): ..." line is conntrack's error message,
// and the capture failed. A line that is not an entry is bad input
// (scenario.ErrorList, file:line:column); keys the reader does not know
// are kept out, not errors (newer tools add fields).

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/sim/scenario"
)

// FormatConntrack is `conntrack -L` output (conntrack-tools 1.4.x), with
// or without -o extended, id; /proc/net/nf_conntrack reads the same.
const FormatConntrack Format = "conntrack"

// Conntrack is one node's conntrack table as conntrack -L printed it.
type Conntrack struct {
	File    string  `json:"file"`
	Entries []*Flow `json:"entries"`
	// Shown is the count conntrack printed on stderr ("N flow entries
	// have been shown."), -1 when the file does not hold that line.
	Shown int `json:"shown"`
}

// Flow is one conntrack entry.
type Flow struct {
	// Family is "ipv4" or "ipv6": the -o extended prefix, else the
	// addresses'.
	Family string `json:"family"`
	// Proto is conntrack's name of the layer-4 protocol ("tcp", "udp",
	// "icmp", "sctp", … or "unknown"), ProtoNum its number.
	Proto    string `json:"proto"`
	ProtoNum int    `json:"protoNum"`
	// Timeout is the seconds left before the kernel drops the entry
	// without more packets, -1 when not printed.
	Timeout int `json:"timeout"`
	// State is the TCP (SCTP, DCCP) state, "" for protocols without one.
	State string `json:"state,omitempty"`
	// Orig is the tuple of the first packet as it arrived (before DNAT);
	// Reply the tuple the answers carry (its source is the endpoint a
	// DNAT chose).
	Orig  Tuple `json:"orig"`
	Reply Tuple `json:"reply"`
	// Unreplied is [UNREPLIED]: no packet seen in the reply direction.
	Unreplied bool `json:"unreplied,omitempty"`
	// Assured is [ASSURED] (also printed as [OFFLOAD] or [HW_OFFLOAD] for
	// an offloaded entry, which the kernel marks assured too).
	Assured bool   `json:"assured,omitempty"`
	Offload string `json:"offload,omitempty"`
	Mark    uint32 `json:"mark,omitempty"`
	Zone    uint16 `json:"zone,omitempty"`
	Line    Line   `json:"line"`
}

// Tuple is one direction of an entry.
type Tuple struct {
	Src   netip.Addr `json:"src"`
	Dst   netip.Addr `json:"dst"`
	SPort int        `json:"sport,omitempty"`
	DPort int        `json:"dport,omitempty"`
}

// countLine is conntrack's count on stderr; otherTool any other message
// of conntrack itself.
var (
	countLine = regexp.MustCompile(`conntrack v[0-9][0-9A-Za-z.+~-]* \(conntrack-tools\): ([0-9]+) flow entries have been shown\.`)
	otherTool = regexp.MustCompile(`^conntrack v[0-9][0-9A-Za-z.+~-]* \(conntrack-tools\): (.*)$`)
)

// ReadConntrackFile reads conntrack -L output from path.
func ReadConntrackFile(path string) (*Conntrack, error) {
	data, err := readInput(path, "conntrack table")
	if err != nil {
		return nil, err
	}
	return ReadConntrack(path, data)
}

// ReadConntrack reads what `conntrack -L` printed (see the file comment).
func ReadConntrack(file string, data []byte) (*Conntrack, error) {
	ct := &Conntrack{File: file, Shown: -1, Entries: []*Flow{}}
	var errs scenario.ErrorList
	fail := func(ln, col int, field, format string, args ...any) {
		if len(errs) < maxErrors {
			errs = append(errs, &scenario.FieldError{File: file, Pos: scenario.Pos{Line: ln, Column: col}, Field: field, Message: fmt.Sprintf(format, args...)})
		}
	}
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		ln := i + 1
		raw := strings.TrimSuffix(lines[i], "\r")
		if loc := countLine.FindStringSubmatchIndex(raw); loc != nil {
			if ct.Shown >= 0 {
				fail(ln, loc[0]+1, "count", "a second count line: one conntrack -L per file")
			}
			ct.Shown, _ = strconv.Atoi(raw[loc[2]:loc[3]])
			rest := raw[loc[1]:]
			raw = raw[:loc[0]]
			if strings.TrimSpace(rest) != "" {
				fail(ln, loc[1]+1, "count", "text after conntrack's count line: %q", strings.TrimSpace(rest))
			}
			// The count cut an entry: its second half is the next line.
			if strings.TrimSpace(raw) != "" && i+1 < len(lines) {
				raw += strings.TrimSuffix(lines[i+1], "\r")
				i++
			}
		}
		if m := otherTool.FindStringSubmatch(strings.TrimSpace(raw)); m != nil {
			fail(ln, 1+strings.Index(raw, "conntrack"), "conntrack", "conntrack reported %q: the capture failed (run it as root, in the node's network namespace)", m[1])
			continue
		}
		text := strings.TrimSpace(raw)
		if text == "" {
			continue
		}
		f, col, err := parseFlow(raw)
		if err != nil {
			fail(ln, col, "entry", "%v", err)
			continue
		}
		f.Line = Line{File: file, Line: ln, Text: text}
		ct.Entries = append(ct.Entries, f)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return ct, nil
}

// ctToken is one word of an entry and the column it starts at.
type ctToken struct {
	text string
	col  int
}

// ctTokens splits an entry into words; a bracketed word that holds
// spaces ("[start=Thu Dec  6 22:52:01 2026]") stays one.
func ctTokens(line string) ([]ctToken, int, error) {
	var out []ctToken
	for i := 0; i < len(line); {
		if line[i] == ' ' || line[i] == '\t' {
			i++
			continue
		}
		start := i
		if line[i] == '[' {
			end := strings.IndexByte(line[i:], ']')
			if end < 0 {
				return nil, start + 1, fmt.Errorf("%q: a [ without ]", line[i:])
			}
			i += end + 1
		} else {
			for i < len(line) && line[i] != ' ' && line[i] != '\t' {
				i++
			}
		}
		out = append(out, ctToken{line[start:i], start + 1})
	}
	return out, 0, nil
}

// parseFlow reads one entry; on error it returns the column of the word
// at fault.
func parseFlow(line string) (*Flow, int, error) {
	toks, col, err := ctTokens(line)
	if err != nil {
		return nil, col, err
	}
	f := &Flow{Timeout: -1}
	i := 0
	if len(toks) > 0 {
		switch toks[0].text {
		case "[NEW]", "[UPDATE]", "[DESTROY]":
			return nil, toks[0].col, fmt.Errorf("%s is an event of conntrack -E: give the table, conntrack -L", toks[0].text)
		case "ipv4", "ipv6", "unknown":
			if len(toks) < 2 || !isDigits(toks[1].text) {
				return nil, toks[0].col, fmt.Errorf("expected the layer-3 protocol's number after %s (as in ipv4     2)", toks[0].text)
			}
			f.Family, i = toks[0].text, 2
		}
	}
	if i+1 >= len(toks) || !isLower(toks[i].text) || !isDigits(toks[i+1].text) {
		c := 1
		if i < len(toks) {
			c = toks[i].col
		}
		return nil, c, fmt.Errorf("expected an entry: the protocol's name and number (tcp      6, udp      17, …), the timeout, then src= dst= …")
	}
	f.Proto = toks[i].text
	f.ProtoNum, _ = strconv.Atoi(toks[i+1].text)
	if f.ProtoNum > 255 {
		return nil, toks[i+1].col, fmt.Errorf("protocol number %d: want 0-255", f.ProtoNum)
	}
	i += 2
	if i < len(toks) && isDigits(toks[i].text) {
		t, err := strconv.Atoi(toks[i].text)
		if err != nil {
			return nil, toks[i].col, fmt.Errorf("timeout %q: %v", toks[i].text, err)
		}
		f.Timeout, i = t, i+1
	}
	if i < len(toks) && isState(toks[i].text) {
		f.State, i = toks[i].text, i+1
	}
	if col, err := f.fields(toks[i:], len(line)+1); err != nil {
		return nil, col, err
	}
	if f.Family == "" {
		f.Family = "ipv4"
		if f.Orig.Src.Is6() {
			f.Family = "ipv6"
		}
	}
	return f, 0, nil
}

// tupleKeys are the words of a tuple.
var tupleKeys = map[string]bool{"src": true, "dst": true, "sport": true, "dport": true, "type": true, "code": true, "id": true,
	"srckey": true, "dstkey": true, "zone-orig": true, "zone-reply": true, "packets": true, "bytes": true}

// portProtos are the protocols whose tuples carry sport= and dport=.
var portProtos = map[string]bool{"tcp": true, "udp": true, "udplite": true, "sctp": true, "dccp": true}

// fields reads the two tuples and what follows them; end is the column
// past the line, for what is missing at its end.
func (f *Flow) fields(toks []ctToken, end int) (int, error) {
	phase := 0 // 0 before the original tuple, 1 in it, 2 in the reply tuple, 3 after
	var cur *Tuple
	seen := map[string]bool{}
	for _, t := range toks {
		if strings.HasPrefix(t.text, "[") {
			switch {
			case t.text == "[UNREPLIED]" && phase == 1:
				f.Unreplied = true
			case (t.text == "[ASSURED]" || t.text == "[OFFLOAD]" || t.text == "[HW_OFFLOAD]") && phase >= 2:
				f.Assured, phase = true, 3
				if t.text != "[ASSURED]" {
					f.Offload = strings.Trim(t.text, "[]")
				}
			case strings.Contains(t.text, "=") && phase >= 2: // [start=…] [stop=…]
				phase = 3
			default:
				return t.col, fmt.Errorf("%s is out of place: [UNREPLIED] comes between the tuples, [ASSURED] after them", t.text)
			}
			continue
		}
		key, val, ok := strings.Cut(t.text, "=")
		if !ok || key == "" {
			return t.col, fmt.Errorf("%q: expected key=value (src=, dst=, sport=, …)", t.text)
		}
		if key == "src" && phase < 2 {
			phase++
			cur, seen = &f.Orig, map[string]bool{}
			if phase == 2 {
				cur = &f.Reply
			}
		}
		switch {
		case phase == 0:
			return t.col, fmt.Errorf("%q before the original tuple: expected src=", t.text)
		case phase <= 2 && tupleKeys[key] && !seen[key]:
			seen[key] = true
			if err := cur.set(key, val); err != nil {
				return t.col, err
			}
			continue
		case phase == 1:
			return t.col, fmt.Errorf("%q inside the original tuple: expected src= of the reply tuple next", t.text)
		}
		phase = 3
		if err := f.tail(key, val); err != nil {
			return t.col, err
		}
	}
	return f.complete(end)
}

// tail reads a key=value after the tuples; unknown keys are left out.
func (f *Flow) tail(key, val string) error {
	switch key {
	case "mark":
		m, err := strconv.ParseUint(val, 10, 32)
		if err != nil {
			return fmt.Errorf("mark=%s: want a number", val)
		}
		f.Mark = uint32(m)
	case "zone":
		z, err := strconv.ParseUint(val, 10, 16)
		if err != nil {
			return fmt.Errorf("zone=%s: want a number 0-65535", val)
		}
		f.Zone = uint16(z)
	case "use", "id", "secmark", "delta-time":
		if _, err := strconv.ParseUint(val, 10, 64); err != nil {
			return fmt.Errorf("%s=%s: want a number", key, val)
		}
	}
	return nil
}

// complete checks that both tuples are whole.
func (f *Flow) complete(end int) (int, error) {
	for _, t := range []struct {
		name string
		tu   *Tuple
	}{{"original", &f.Orig}, {"reply", &f.Reply}} {
		if !t.tu.Src.IsValid() || !t.tu.Dst.IsValid() {
			return end, fmt.Errorf("the %s tuple is missing (expected src=ADDR dst=ADDR …)", t.name)
		}
		if portProtos[f.Proto] && (t.tu.SPort == 0 || t.tu.DPort == 0) {
			return end, fmt.Errorf("the %s tuple of a %s entry has no sport= and dport=", t.name, f.Proto)
		}
	}
	return 0, nil
}

// set reads one key of a tuple.
func (t *Tuple) set(key, val string) error {
	switch key {
	case "src", "dst":
		a, err := netip.ParseAddr(val)
		if err != nil {
			return fmt.Errorf("%s=%s: not an address", key, val)
		}
		if key == "src" {
			t.Src = a
		} else {
			t.Dst = a
		}
	case "sport", "dport":
		p, err := strconv.ParseUint(val, 10, 16)
		if err != nil {
			return fmt.Errorf("%s=%s: want a port 0-65535", key, val)
		}
		if key == "sport" {
			t.SPort = int(p)
		} else {
			t.DPort = int(p)
		}
	default: // type, code, id, keys, zones, counters
		if _, err := strconv.ParseUint(val, 0, 64); err != nil {
			return fmt.Errorf("%s=%s: want a number", key, val)
		}
	}
	return nil
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func isLower(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return s != ""
}

// isState is a TCP, SCTP or DCCP state as conntrack prints it
// (ESTABLISHED, SYN_SENT2, COOKIE_ECHOED, …).
func isState(s string) bool {
	letter := false
	for _, r := range s {
		switch {
		case r >= 'A' && r <= 'Z':
			letter = true
		case r == '_' || r >= '0' && r <= '9':
		default:
			return false
		}
	}
	return letter
}
