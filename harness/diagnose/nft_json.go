package diagnose

// The JSON form, `nft -j list ruleset`: {"nftables": [{"metainfo": ...},
// {"table": ...}, {"chain": ...}, {"set": ...}, {"map": ...}, {"rule":
// ...}, ...]}. Each rule's expression objects are turned into the words
// nft's text form has for them, for the subset kube-proxy writes (matches
// on payload, meta, ct, fib and jhash; verdict maps and DNAT maps, inline
// or named; numgen; dnat; jump and goto; mark; masquerade; reject; drop;
// update @set; counter), so that both forms give the same nftTables. A
// rule with any other expression is kept out of the trace and reported.
// Lines: nft prints the whole listing on one line; an object's Line is
// where it starts, its Text the text form of what it holds.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/sim/scenario"
)

// jsonPos turns a byte offset into a line and column.
func jsonPos(data []byte, off int64) scenario.Pos {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return scenario.Pos{Line: line, Column: col}
}

func parseNFTJSON(file string, data []byte) ([]*nftTable, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	bad := func(off int64, format string, args ...any) error {
		return &scenario.FieldError{File: file, Pos: jsonPos(data, off), Field: "json", Message: fmt.Sprintf(format, args...)}
	}
	syntax := func(err error) error {
		// The decoder's offsets count from its buffer; the whole
		// input, decoded again, gives the bad byte's place.
		off := dec.InputOffset()
		msg := err.Error()
		var v any
		var se *json.SyntaxError
		if e := json.Unmarshal(data, &v); asSyntax(e, &se) {
			off, msg = se.Offset-1, se.Error()
		}
		if strings.Contains(msg, "unexpected end") || msg == "EOF" {
			msg = "unexpected end of input"
			off = int64(len(data))
		}
		return bad(off, "expected valid JSON (%s)", msg)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, syntax(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, bad(0, "%v, found %s", errNotNFTJSON, describeJSONToken(tok))
	}
	var tables []*nftTable
	byName := map[string]*nftTable{}
	seenList := false
	for dec.More() {
		off := dec.InputOffset()
		k, err := dec.Token()
		if err != nil {
			return nil, syntax(err)
		}
		key, _ := k.(string)
		if key != "nftables" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, syntax(err)
			}
			if seenList {
				continue
			}
			return nil, bad(off, "%v, found key %q", errNotNFTJSON, key)
		}
		seenList = true
		tok, err := dec.Token()
		if err != nil {
			return nil, syntax(err)
		}
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return nil, bad(dec.InputOffset()-1, "%v: \"nftables\" must be a list, found %s", errNotNFTJSON, describeJSONToken(tok))
		}
		for dec.More() {
			start := dec.InputOffset()
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, syntax(err)
			}
			// InputOffset before Decode may sit before the separating
			// comma and spaces.
			start += int64(len(raw)) - int64(len(bytes.TrimLeft(raw, " \t\r\n,")))
			if start2 := bytes.Index(data[start:], raw); start2 >= 0 && start2 < 4 {
				start += int64(start2)
			}
			pos := jsonPos(data, start)
			if err := jsonObject(file, pos, raw, &tables, byName); err != nil {
				return nil, err
			}
		}
		if _, err := dec.Token(); err != nil { // ]
			return nil, syntax(err)
		}
	}
	if _, err := dec.Token(); err != nil { // }
		return nil, syntax(err)
	}
	if !seenList {
		return nil, bad(0, "%v: no \"nftables\" list", errNotNFTJSON)
	}
	if _, err := dec.Token(); err == nil {
		return nil, bad(dec.InputOffset(), "expected the end of input after the listing")
	}
	return tables, nil
}

func asSyntax(err error, se **json.SyntaxError) bool {
	s, ok := err.(*json.SyntaxError)
	if ok {
		*se = s
	}
	return ok
}

func describeJSONToken(t json.Token) string {
	switch v := t.(type) {
	case json.Delim:
		return strconv.Quote(v.String())
	case string:
		return "string " + strconv.Quote(v)
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", t)
}

// jObj is a decoded JSON object of a listing.
type jObj = map[string]any

// jsonObject adds one listing object ({"table": ...}, {"rule": ...}, ...).
func jsonObject(file string, pos scenario.Pos, raw json.RawMessage, tables *[]*nftTable, byName map[string]*nftTable) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || len(obj) != 1 {
		return &scenario.FieldError{File: file, Pos: pos, Field: "nftables[]",
			Message: "expected an object with one key (table, chain, set, map, rule, ...)"}
	}
	var kind string
	var body json.RawMessage
	for kind, body = range obj {
	}
	if kind == "metainfo" {
		return nil
	}
	var v jObj
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return &scenario.FieldError{File: file, Pos: pos, Field: kind, Message: "expected an object"}
	}
	line := func(text string) Line { return Line{File: file, Line: pos.Line, Text: text} }
	tableOf := func(famKey, nameKey string) *nftTable {
		fam, _ := v[famKey].(string)
		name, _ := v[nameKey].(string)
		id := fam + " " + name
		tb := byName[id]
		if tb == nil {
			tb = &nftTable{family: fam, name: name, line: line("table " + id)}
			byName[id] = tb
			*tables = append(*tables, tb)
		}
		tb.lines++
		return tb
	}
	name, _ := v["name"].(string)
	switch kind {
	case "table":
		tb := tableOf("family", "name")
		tb.lines--
		tb.comment, _ = v["comment"].(string)
	case "chain":
		tb := tableOf("family", "table")
		tb.chains = append(tb.chains, jsonChain(v, name, line("chain "+name)))
	case "set", "map":
		tb := tableOf("family", "table")
		s, err := jsonSet(v, kind, name, line)
		if err != nil {
			return &scenario.FieldError{File: file, Pos: pos, Field: kind + " " + name + " elem", Message: err.Error()}
		}
		tb.sets = append(tb.sets, s)
	case "rule":
		tb := tableOf("family", "table")
		chain, _ := v["chain"].(string)
		var c *nftChain
		for _, x := range tb.chains {
			if x.name == chain {
				c = x
			}
		}
		if c == nil {
			return &scenario.FieldError{File: file, Pos: pos, Field: "rule",
				Message: fmt.Sprintf("expected the chain %q of the rule to be listed before it", chain)}
		}
		c.rules = append(c.rules, jsonRuleObject(v, body, line, chain))
	default:
		tb := tableOf("family", "table")
		tb.skipped = append(tb.skipped, Skipped{Line: line(kind + " " + name),
			Reason: fmt.Sprintf("object %q is not one kube-proxy writes", kind+" "+name)})
	}
	return nil
}

// jsonChain reads a chain object: a base chain's type, hook, priority and
// policy, nothing for a regular chain.
func jsonChain(v jObj, name string, at Line) *nftChain {
	c := &nftChain{name: name, line: at}
	c.typ, _ = v["type"].(string)
	c.hook, _ = v["hook"].(string)
	c.policy, _ = v["policy"].(string)
	if p, ok := v["prio"]; ok {
		c.prio = jsonScalar(p)
	}
	return c
}

// jsonSet reads a set or map object (kind "set" or "map") with its
// elements; an element it cannot read is the error.
func jsonSet(v jObj, kind, name string, line func(string) Line) (*nftSet, error) {
	s := &nftSet{name: name, isMap: kind == "map", line: line(kind + " " + name)}
	s.typ = jsonType(v["type"])
	if kind == "map" {
		s.typ += " : " + jsonType(v["map"])
	}
	if fl, ok := v["flags"].([]any); ok {
		for _, f := range fl {
			if fs, ok := f.(string); ok {
				s.flags = append(s.flags, fs)
			}
		}
	} else if fs, ok := v["flags"].(string); ok {
		s.flags = []string{fs}
	}
	if t, ok := jsonSeconds(v["timeout"]); ok {
		s.timeout = &t
	}
	s.comment, _ = v["comment"].(string)
	if el, ok := v["elem"].([]any); ok {
		for _, e := range el {
			ne, err := jsonElem(e, s.isMap)
			if err != nil {
				return nil, err
			}
			ne.line = line(strings.Join(ne.key, " . "))
			if s.isMap {
				ne.line.Text += " : " + strings.Join(ne.value, " . ")
			}
			s.elems = append(s.elems, ne)
		}
	}
	return s, nil
}

// jsonRuleObject reads a rule object of chain. A rule whose expressions
// the reader does not understand is kept, marked bad, with its JSON as the
// evidence line.
func jsonRuleObject(v jObj, body json.RawMessage, line func(string) Line, chain string) nftRule {
	r := nftRule{}
	r.comment, _ = v["comment"].(string)
	exprs, _ := v["expr"].([]any)
	words, counter, err := jsonRule(exprs)
	r.counter = counter
	if err != nil {
		r.bad = err.Error()
	}
	r.text = strings.Join(words, " ")
	r.line = line(r.text)
	if r.bad != "" {
		r.line.Text = "rule in chain " + chain + ": " + string(body)
	}
	return r
}

// jsonScalar prints a number or string as the text form does.
func jsonScalar(v any) string {
	switch x := v.(type) {
	case json.Number:
		return x.String()
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	}
	return fmt.Sprintf("%v", v)
}

// jsonType prints a set's type: "ipv4_addr" or a concatenation.
func jsonType(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []any:
		var parts []string
		for _, p := range x {
			parts = append(parts, jsonScalar(p))
		}
		return strings.Join(parts, " . ")
	}
	return ""
}

func jsonSeconds(v any) (time.Duration, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	if err != nil || i < 0 || i > 1<<40 {
		return 0, false
	}
	return time.Duration(i) * time.Second, true
}

// jsonElem reads a set or map element.
func jsonElem(e any, isMap bool) (nftElem, error) {
	var ne nftElem
	var keyv any = e
	if isMap {
		pair, ok := e.([]any)
		if !ok || len(pair) != 2 {
			return ne, fmt.Errorf("expected a map element [key, value]")
		}
		keyv = pair[0]
		val, err := jsonValue(pair[1])
		if err != nil {
			return ne, err
		}
		ne.value = val
	}
	if o, ok := keyv.(jObj); ok {
		if inner, ok := o["elem"].(jObj); ok {
			keyv = inner["val"]
			if t, ok := jsonSeconds(inner["timeout"]); ok {
				ne.timeout = t
			}
			if t, ok := jsonSeconds(inner["expires"]); ok {
				ne.expires = t
			}
			ne.comment, _ = inner["comment"].(string)
		}
	}
	key, err := jsonValue(keyv)
	if err != nil {
		return ne, err
	}
	ne.key = key
	return ne, nil
}

// jsonValue reads an element's key or value: a scalar, a concatenation,
// a prefix, a range or a verdict; concatenations give one part each.
func jsonValue(v any) ([]string, error) {
	switch x := v.(type) {
	case json.Number, string:
		return []string{jsonScalar(x)}, nil
	case jObj:
		if c, ok := x["concat"].([]any); ok {
			var out []string
			for _, p := range c {
				w, err := jsonValue(p)
				if err != nil {
					return nil, err
				}
				out = append(out, strings.Join(w, " "))
			}
			return out, nil
		}
		w, err := jsonRight(x)
		if err != nil {
			return nil, err
		}
		return []string{w}, nil
	}
	return nil, fmt.Errorf("expected an element value, found %v", v)
}

// jsonVerdict prints a verdict object, "" when v is none.
func jsonVerdict(o jObj) string {
	if len(o) != 1 {
		return ""
	}
	for k, val := range o {
		switch k {
		case "accept", "drop", "return", "continue":
			return k
		case "jump", "goto":
			if t, ok := val.(jObj); ok {
				if target, ok := t["target"].(string); ok {
					return k + " " + target
				}
			}
		}
	}
	return ""
}

// jsonLeft prints the left side of a match (or a map key).
func jsonLeft(v any) (string, error) {
	switch x := v.(type) {
	case jObj:
		if len(x) != 1 {
			break
		}
		for k, val := range x {
			o, _ := val.(jObj)
			switch k {
			case "payload":
				proto, _ := o["protocol"].(string)
				field, _ := o["field"].(string)
				if proto == "" || field == "" {
					return "", fmt.Errorf("payload without protocol or field")
				}
				return proto + " " + field, nil
			case "meta", "ct":
				key, _ := o["key"].(string)
				if key == "" {
					return "", fmt.Errorf("%s without a key", k)
				}
				return k + " " + key, nil
			case "fib":
				res, _ := o["result"].(string)
				var flags []string
				if fl, ok := o["flags"].([]any); ok {
					for _, f := range fl {
						flags = append(flags, jsonScalar(f))
					}
				} else if f, ok := o["flags"].(string); ok {
					flags = []string{f}
				}
				return "fib " + strings.Join(flags, " . ") + " " + res, nil
			case "concat":
				parts, _ := val.([]any)
				var out []string
				for _, p := range parts {
					s, err := jsonLeft(p)
					if err != nil {
						return "", err
					}
					out = append(out, s)
				}
				return strings.Join(out, " . "), nil
			case "numgen":
				mode, _ := o["mode"].(string)
				mod := jsonScalar(o["mod"])
				if n, err := strconv.ParseInt(mod, 10, 64); err == nil && n < 0 && n >= -1<<31 {
					// nft 1.0.6 prints a modulus of 2^31 or more as a
					// signed 32-bit number (mod 2147483648 is
					// -2147483648 in the JSON, not in the text).
					mod = strconv.FormatInt(n+1<<32, 10)
				}
				if off, ok := o["offset"]; ok && jsonScalar(off) != "0" {
					return "", fmt.Errorf("numgen with an offset")
				}
				return "numgen " + mode + " mod " + mod, nil
			case "jhash":
				e, err := jsonLeft(o["expr"])
				if err != nil {
					return "", err
				}
				s := "jhash " + e + " mod " + jsonScalar(o["mod"])
				if seed, ok := o["seed"].(json.Number); ok {
					n, _ := strconv.ParseUint(seed.String(), 10, 32)
					s += fmt.Sprintf(" seed 0x%x", n)
				}
				return s, nil
			case "&", "|", "^":
				ops, _ := val.([]any)
				if len(ops) != 2 {
					return "", fmt.Errorf("%s needs two operands", k)
				}
				a, err := jsonLeft(ops[0])
				if err != nil {
					return "", err
				}
				return a + " " + k + " " + jsonHex(ops[1]), nil
			}
		}
	case json.Number, string:
		return jsonScalar(x), nil
	}
	return "", fmt.Errorf("unknown expression %s", compactJSON(v))
}

// jsonHex prints a mark operand as nft does: 0x00004000.
func jsonHex(v any) string {
	if n, ok := v.(json.Number); ok {
		if u, err := strconv.ParseUint(n.String(), 10, 32); err == nil {
			return fmt.Sprintf("0x%08x", u)
		}
	}
	return jsonScalar(v)
}

// jsonRight prints the right side of a match.
func jsonRight(v any) (string, error) {
	switch x := v.(type) {
	case json.Number, string:
		return jsonScalar(x), nil
	case []any:
		var parts []string
		for _, p := range x {
			parts = append(parts, jsonScalar(p))
		}
		return strings.Join(parts, ","), nil
	case jObj:
		if verdict := jsonVerdict(x); verdict != "" {
			return verdict, nil
		}
		if p, ok := x["prefix"].(jObj); ok {
			return jsonScalar(p["addr"]) + "/" + jsonScalar(p["len"]), nil
		}
		if r, ok := x["range"].([]any); ok && len(r) == 2 {
			return jsonScalar(r[0]) + "-" + jsonScalar(r[1]), nil
		}
		if s, ok := x["set"].([]any); ok {
			var items []string
			for _, it := range s {
				w, err := jsonRight(it)
				if err != nil {
					return "", err
				}
				items = append(items, w)
			}
			return "{ " + strings.Join(items, " , ") + " }", nil
		}
	}
	return "", fmt.Errorf("unknown value %s", compactJSON(v))
}

// jsonInlineMap prints an anonymous map's elements: "{ 0 : A . P, 1-2 : goto X }".
func jsonInlineMap(v any) (string, error) {
	if s, ok := v.(string); ok && strings.HasPrefix(s, "@") {
		return s, nil
	}
	o, ok := v.(jObj)
	if !ok {
		return "", fmt.Errorf("expected a map, found %s", compactJSON(v))
	}
	items, ok := o["set"].([]any)
	if !ok {
		return "", fmt.Errorf("expected a map, found %s", compactJSON(v))
	}
	var out []string
	for _, it := range items {
		pair, ok := it.([]any)
		if !ok || len(pair) != 2 {
			return "", fmt.Errorf("expected a map element [key, value]")
		}
		k, err := jsonValue(pair[0])
		if err != nil {
			return "", err
		}
		val, err := jsonValue(pair[1])
		if err != nil {
			return "", err
		}
		out = append(out, strings.Join(k, " . ")+" : "+strings.Join(val, " . "))
	}
	return "{ " + strings.Join(out, " , ") + " }", nil
}

// jsonRule turns a rule's expressions into the text form's words. On an
// error the words are those of the statements before the one it names.
func jsonRule(exprs []any) ([]string, *[2]uint64, error) {
	var words []string
	var counter *[2]uint64
	for _, e := range exprs {
		o, ok := e.(jObj)
		if !ok || len(o) != 1 {
			return words, counter, fmt.Errorf("expected an expression object, found %s", compactJSON(e))
		}
		var k string
		var val any
		for k, val = range o {
		}
		body, _ := val.(jObj)
		if k == "counter" {
			words = append(words, "counter")
			if c, w := jsonCounter(body); c != nil {
				counter = c
				words = append(words, w...)
			}
			continue
		}
		w, err := jsonStatement(k, body)
		if err != nil {
			return words, counter, err
		}
		words = append(words, w...)
	}
	return words, counter, nil
}

// jsonStatement gives the text form's words of one statement k (every
// one but counter) with its body.
func jsonStatement(k string, body jObj) ([]string, error) {
	switch k {
	case "match":
		return jsonMatch(body)
	case "vmap", "map":
		key, err := jsonLeft(body["key"])
		if err != nil {
			return nil, err
		}
		data, err := jsonInlineMap(body["data"])
		if err != nil {
			return nil, err
		}
		return []string{key, k, data}, nil
	case "dnat", "snat":
		return jsonNAT(k, body)
	case "jump", "goto":
		t, _ := body["target"].(string)
		if t == "" {
			return nil, fmt.Errorf("%s without a target", k)
		}
		return []string{k, t}, nil
	case "accept", "drop", "return", "continue":
		return []string{k}, nil
	case "reject":
		return []string{"reject"}, nil
	case "masquerade":
		words := []string{"masquerade"}
		if body != nil {
			switch fl := body["flags"].(type) {
			case string:
				words = append(words, fl)
			case []any:
				for _, f := range fl {
					words = append(words, jsonScalar(f))
				}
			}
		}
		return words, nil
	case "mangle":
		key, err := jsonLeft(body["key"])
		if err != nil {
			return nil, err
		}
		value, err := jsonLeft(body["value"])
		if err != nil {
			return nil, err
		}
		return []string{key, "set", value}, nil
	case "set":
		return jsonSetStatement(body)
	}
	return nil, fmt.Errorf("unknown statement %q", k)
}

// jsonMatch prints a match: "ip daddr 10.0.0.1", "meta mark & 0x00004000 != 0x00000000".
func jsonMatch(body jObj) ([]string, error) {
	left, err := jsonLeft(body["left"])
	if err != nil {
		return nil, err
	}
	right, err := jsonRight(body["right"])
	if err != nil {
		return nil, err
	}
	op, _ := body["op"].(string)
	if r, ok := body["right"].(json.Number); ok && strings.Contains(left, " & ") {
		// nft prints a masked mark's comparison in full:
		// meta mark & 0x00004000 != 0x00000000.
		right = jsonHex(r)
		if op == "==" {
			return []string{left, op, right}, nil
		}
	}
	switch op {
	case "==", "in":
		return []string{left, right}, nil
	case "!=", "<", ">", "<=", ">=":
		return []string{left, op, right}, nil
	}
	return nil, fmt.Errorf("unknown match operator %q", op)
}

// jsonNAT prints a dnat or snat statement (k): to an address (and port)
// or through a map.
func jsonNAT(k string, body jObj) ([]string, error) {
	fam, _ := body["family"].(string)
	w := []string{k}
	if fam != "" {
		w = append(w, fam)
	}
	w = append(w, "to")
	switch addr := body["addr"].(type) {
	case string:
		target := addr
		if p, ok := body["port"]; ok {
			target += ":" + jsonScalar(p)
		}
		w = append(w, target)
	case jObj:
		m, ok := addr["map"].(jObj)
		if !ok {
			return nil, fmt.Errorf("unknown %s target %s", k, compactJSON(addr))
		}
		key, err := jsonLeft(m["key"])
		if err != nil {
			return nil, err
		}
		data, err := jsonInlineMap(m["data"])
		if err != nil {
			return nil, err
		}
		w = append(w, key, "map", data)
	default:
		return nil, fmt.Errorf("unknown %s target %s", k, compactJSON(body["addr"]))
	}
	return w, nil
}

// jsonSetStatement prints a set statement: "update @affinity { ip saddr timeout 10800s }".
func jsonSetStatement(body jObj) ([]string, error) {
	op, _ := body["op"].(string)
	set, _ := body["set"].(string)
	elem := body["elem"]
	var timeout string
	if eo, ok := elem.(jObj); ok {
		if inner, ok := eo["elem"].(jObj); ok {
			elem = inner["val"]
			if t, ok := jsonSeconds(inner["timeout"]); ok {
				timeout = " timeout " + strconv.FormatInt(int64(t/time.Second), 10) + "s"
			}
		}
	}
	el, err := jsonLeft(elem)
	if err != nil {
		return nil, err
	}
	return []string{op, set, "{ " + el + timeout + " }"}, nil
}

// jsonCounter reads a counter's packets and bytes and their words; nil
// when the counter has none (or they are not numbers).
func jsonCounter(body jObj) (*[2]uint64, []string) {
	if body == nil {
		return nil, nil
	}
	pk, err1 := strconv.ParseUint(jsonScalar(body["packets"]), 10, 64)
	by, err2 := strconv.ParseUint(jsonScalar(body["bytes"]), 10, 64)
	if err1 != nil || err2 != nil {
		return nil, nil
	}
	return &[2]uint64{pk, by}, []string{"packets", strconv.FormatUint(pk, 10), "bytes", strconv.FormatUint(by, 10)}
}

func compactJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	if len(b) > 120 {
		b = append(b[:117], "..."...)
	}
	return string(b)
}
