package nftables

// The tracer walks the first packet of a new connection through a
// knftables.Fake's table, as kube-proxy's nftablesTracer does, but carrying
// probabilities: at each `numgen random mod N` the flow splits into one
// branch per bucket, weighted by the bucket's share of N. It models the
// affinity sets from a client history (which sets hold the source address,
// and since when) and the masquerade mark through the postrouting chains.
//
// Path of the packet (netfilter hook order, base chains by priority):
//   - from the node itself (the source is a local address): output, then
//     postrouting;
//   - otherwise: prerouting, then input if the (possibly DNATed)
//     destination is local, else forward, then postrouting.
//
// It understands the rules this package writes, not arbitrary nftables: an
// unknown expression is an error. `jhash ip saddr mod N seed S` (the
// affinity-leak and affinity-overstay faults) is evaluated with the
// kernel's hash (proxy.JHashBucket), and an update's own element
// timeout sets how long the clients it refreshes are remembered. Not
// modelled: conntrack beyond the NEW
// state (`ct state new` and `ct status dnat` are evaluated for the first
// packet), recording into affinity sets (`update` has no effect on the
// history), reject types, interfaces.

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
)

// Tracer traces packets through a snapshot of a Fake's table.
type Tracer struct {
	table *knftables.FakeTable
	local []netip.Addr
	rules map[*knftables.Rule][]expr
	maps  map[string]map[string][]string // map -> key -> value
	sets  map[string]map[string]bool
	// timeouts are, per affinity set, the element timeouts of the rules
	// that refresh it with one of their own (affinity-overstay).
	timeouts map[string][]elementTimeout
	// hooks are each hook's base chains in priority order (hookErr: a
	// priority that did not parse).
	hooks   map[knftables.BaseChainHook][]hookChain
	hookErr map[knftables.BaseChainHook]error
}

// hookChain is a base chain of a hook.
type hookChain struct {
	name string
	prio int
}

// indexHooks sorts each hook's base chains by priority (then name), once:
// a table of thousands of chains has a handful of base chains. A priority
// that does not parse fails the traces that pass its hook.
func (t *Tracer) indexHooks() {
	t.hooks, t.hookErr = map[knftables.BaseChainHook][]hookChain{}, map[knftables.BaseChainHook]error{}
	for _, c := range t.table.Chains {
		if c.Hook == nil || c.Priority == nil {
			continue
		}
		prio, err := knftables.ParsePriority(knftables.IPv4Family, string(*c.Priority))
		if err != nil {
			if t.hookErr[*c.Hook] == nil {
				t.hookErr[*c.Hook] = fmt.Errorf("could not parse the priority of chain %s: %w", c.Name, err)
			}
			continue
		}
		t.hooks[*c.Hook] = append(t.hooks[*c.Hook], hookChain{c.Name, prio})
	}
	for _, chains := range t.hooks {
		slices.SortFunc(chains, func(a, b hookChain) int {
			if a.prio != b.prio {
				return a.prio - b.prio
			}
			return strings.Compare(a.name, b.name)
		})
	}
}

// NewTracer snapshots f's table. local are the node's own addresses (the
// loopback range is always local).
func NewTracer(f *knftables.Fake, local ...netip.Addr) (*Tracer, error) {
	f.RLock()
	defer f.RUnlock()
	if f.Table == nil {
		return nil, fmt.Errorf("could not trace: the fake has no table")
	}
	t := &Tracer{table: f.Table, local: local, rules: map[*knftables.Rule][]expr{},
		maps: map[string]map[string][]string{}, sets: map[string]map[string]bool{}, timeouts: map[string][]elementTimeout{}}
	for name, m := range f.Table.Maps {
		idx := map[string][]string{}
		for _, e := range m.Elements {
			idx[strings.Join(e.Key, " . ")] = e.Value
		}
		t.maps[name] = idx
	}
	for name, s := range f.Table.Sets {
		idx := map[string]bool{}
		for _, e := range s.Elements {
			idx[strings.Join(e.Key, " . ")] = true
		}
		t.sets[name] = idx
	}
	for _, c := range f.Table.Chains {
		for _, rl := range c.Rules {
			ex, err := parseRule(rl.Rule)
			if err != nil {
				return nil, fmt.Errorf("could not parse rule %q in chain %s: %w", rl.Rule, c.Name, err)
			}
			t.rules[rl] = ex
			t.recordTimeouts(ex)
		}
	}
	t.indexHooks()
	return t, nil
}

// flow is one branch of a packet's fate.
type flow struct {
	src, dst netip.Addr
	proto    string
	dport    int
	mark     uint32
	dnat     bool
	masq     bool
	p        float64
	// steps counts the rules evaluated for one Trace, over all its
	// branches (shared by them), against maxTraceSteps.
	steps *int
}

// maxTraceSteps bounds a trace's work: rules that branch into rules that
// branch (numgen maps whose chains hold numgen maps, chains of jumps) grow
// exponentially, and a dump read from a user can be built so. kube-proxy's
// rules for one connection take a few dozen steps per endpoint.
const maxTraceSteps = 1 << 16

// verdicts of a rule or chain.
type verdict int

const (
	vNext     verdict = iota // rule: go on with the next rule
	vContinue                // chain: fell off the end or returned
	vReturn
	vAccept
	vDrop
	vReject
	vJump
	vGoto
)

type branch struct {
	f      flow
	v      verdict
	target string // for vJump and vGoto
}

// Trace returns the fates of a new connection's first packet and their
// probabilities.
func (t *Tracer) Trace(p trace.Packet, h trace.History) (trace.Result, error) {
	f := flow{src: p.Src, dst: p.Dst, proto: strings.ToLower(p.Protocol), dport: p.DPort, p: 1, steps: new(int)}
	if f.proto == "" {
		f.proto = "tcp"
	}
	var hooks []knftables.BaseChainHook
	if t.isLocal(p.Src) {
		hooks = []knftables.BaseChainHook{knftables.OutputHook, knftables.PostroutingHook}
	} else {
		// "route" stands for input or forward, decided per branch after
		// prerouting (DNAT) by the destination.
		hooks = []knftables.BaseChainHook{knftables.PreroutingHook, "route", knftables.PostroutingHook}
	}
	cur := []branch{{f: f, v: vAccept}}
	for _, hook := range hooks {
		var next []branch
		for _, b := range cur {
			if b.v == vDrop || b.v == vReject {
				next = append(next, b)
				continue
			}
			hk := hook
			if hk == "route" {
				hk = knftables.ForwardHook
				if t.isLocal(b.f.dst) {
					hk = knftables.InputHook
				}
			}
			bs, err := t.runHook(hk, b.f, h)
			if err != nil {
				return nil, err
			}
			next = append(next, bs...)
		}
		cur = next
	}
	sum := map[trace.Outcome]float64{}
	for _, b := range cur {
		if b.f.p == 0 {
			continue
		}
		o := trace.Outcome{Target: trace.OutcomeAccept, Masquerade: b.f.masq}
		switch {
		case b.v == vDrop:
			o = trace.Outcome{Target: trace.OutcomeDrop}
		case b.v == vReject:
			o = trace.Outcome{Target: trace.OutcomeReject}
		case b.f.dnat:
			o.Target = netip.AddrPortFrom(b.f.dst, uint16(b.f.dport)).String()
		}
		sum[o] += b.f.p
	}
	out := make(trace.Result, 0, len(sum))
	for o, p := range sum {
		o.P = p
		out = append(out, o)
	}
	out.Sort()
	return out, nil
}

func (t *Tracer) isLocal(a netip.Addr) bool {
	if a.Is4() && a.As4()[0] == 127 {
		return true
	}
	return slices.Contains(t.local, a)
}

// runHook runs the base chains of one hook in priority order. Accept ends
// a base chain, not the hook; drop and reject end the packet.
func (t *Tracer) runHook(hook knftables.BaseChainHook, f flow, h trace.History) ([]branch, error) {
	if err := t.hookErr[hook]; err != nil {
		return nil, err
	}
	chains := t.hooks[hook]
	cur := []branch{{f: f, v: vAccept}}
	for _, c := range chains {
		var next []branch
		for _, b := range cur {
			if b.v == vDrop || b.v == vReject {
				next = append(next, b)
				continue
			}
			bs, err := t.runChain(c.name, b.f, h, 0)
			if err != nil {
				return nil, err
			}
			for _, x := range bs {
				if x.v == vContinue {
					x.v = vAccept // the base chain's policy
				}
				next = append(next, x)
			}
		}
		cur = next
	}
	return cur, nil
}

// runChain evaluates a chain; its branches end with vContinue (fell off the
// end or returned), vAccept, vDrop or vReject.
func (t *Tracer) runChain(name string, f flow, h trace.History, depth int) ([]branch, error) {
	if depth > 32 {
		return nil, fmt.Errorf("could not trace: chain nesting too deep at %s", name)
	}
	c := t.table.Chains[name]
	if c == nil {
		return nil, fmt.Errorf("could not trace: no chain %q", name)
	}
	return t.runRules(c.Rules, 0, f, h, depth)
}

func (t *Tracer) runRules(rules []*knftables.Rule, i int, f flow, h trace.History, depth int) ([]branch, error) {
	if i == len(rules) {
		return []branch{{f: f, v: vContinue}}, nil
	}
	bs, err := t.evalRule(t.rules[rules[i]], f, h)
	if err != nil {
		return nil, err
	}
	var out []branch
	for _, b := range bs {
		switch b.v {
		case vNext:
			rest, err := t.runRules(rules, i+1, b.f, h, depth)
			if err != nil {
				return nil, err
			}
			out = append(out, rest...)
		case vReturn:
			out = append(out, branch{f: b.f, v: vContinue})
		case vJump, vGoto:
			sub, err := t.runChain(b.target, b.f, h, depth+1)
			if err != nil {
				return nil, err
			}
			for _, s := range sub {
				if s.v == vContinue && b.v == vJump {
					rest, err := t.runRules(rules, i+1, s.f, h, depth)
					if err != nil {
						return nil, err
					}
					out = append(out, rest...)
					continue
				}
				out = append(out, s)
			}
		default:
			out = append(out, b)
		}
	}
	return out, nil
}

// evalRule evaluates one rule's expressions in order. A branch that fails a
// match goes on with the next rule (keeping what earlier statements did); a
// verdict ends the rule.
func (t *Tracer) evalRule(exprs []expr, f flow, h trace.History) ([]branch, error) {
	if f.steps != nil {
		if *f.steps++; *f.steps > maxTraceSteps {
			return nil, fmt.Errorf("could not trace: more than %d steps (the rules branch too often)", maxTraceSteps)
		}
	}
	if len(exprs) == 0 {
		return []branch{{f: f, v: vNext}}, nil
	}
	res, err := exprs[0].eval(t, f, h)
	if err != nil {
		return nil, err
	}
	var out []branch
	for _, r := range res {
		switch {
		case r.f.p == 0:
		case !r.match:
			out = append(out, branch{f: r.f, v: vNext})
		case r.v != vNext:
			out = append(out, branch{f: r.f, v: r.v, target: r.target})
		default:
			rest, err := t.evalRule(exprs[1:], r.f, h)
			if err != nil {
				return nil, err
			}
			out = append(out, rest...)
		}
	}
	return out, nil
}

// expr is one parsed expression or statement of a rule.
type expr interface {
	eval(t *Tracer, f flow, h trace.History) ([]exprResult, error)
}

// exprResult is one branch of an expression: whether it matched, the flow
// after it, and the verdict of a statement that ends the rule (vNext for
// none).
type exprResult struct {
	match  bool
	f      flow
	v      verdict
	target string
}

func one(match bool, f flow) ([]exprResult, error) {
	return []exprResult{{match: match, f: f}}, nil
}

// matchFunc is a plain match.
type matchFunc func(t *Tracer, f flow, h trace.History) (bool, error)

func (m matchFunc) eval(t *Tracer, f flow, h trace.History) ([]exprResult, error) {
	ok, err := m(t, f, h)
	if err != nil {
		return nil, err
	}
	return one(ok, f)
}

// stmtFunc is a statement: it may change the flow and end the rule.
type stmtFunc func(t *Tracer, f flow) (flow, verdict, string, error)

func (s stmtFunc) eval(t *Tracer, f flow, _ trace.History) ([]exprResult, error) {
	nf, v, target, err := s(t, f)
	if err != nil {
		return nil, err
	}
	return []exprResult{{match: true, f: nf, v: v, target: target}}, nil
}

// bucket is a numgen value range and what it leads to.
type bucket struct {
	lo, hi uint64
	value  []string // a verdict ("goto X") or an address and port
}

// numgenExpr is `numgen random mod N` used as a match (== K), a verdict map
// or a DNAT map (inline or named).
type numgenExpr struct {
	mod     uint64
	kind    byte // 'm'atch, 'v'map, 'd'nat
	k       uint64
	lt      bool // match: < k rather than == k
	buckets []bucket
	mapName string // named DNAT map, resolved at evaluation
	// key, for a map keyed by the packet and the bucket (the fast
	// layout's endpoint maps), is the key without the bucket.
	key func(f flow) string
}

func (n *numgenExpr) eval(t *Tracer, f flow, _ trace.History) ([]exprResult, error) {
	if n.mod == 0 {
		return nil, fmt.Errorf("numgen modulus 0")
	}
	share := func(lo, hi uint64) float64 { return float64(hi-lo+1) / float64(n.mod) }
	if n.kind == 'm' {
		in, out := f, f
		if n.lt {
			in.p *= float64(min(n.k, n.mod)) / float64(n.mod)
		} else {
			in.p *= share(n.k, n.k)
		}
		out.p -= in.p
		return []exprResult{{match: true, f: in}, {match: false, f: out}}, nil
	}
	buckets := n.buckets
	if n.key != nil {
		m, ok := t.maps[n.mapName]
		if !ok {
			return nil, fmt.Errorf("no map %q", n.mapName)
		}
		buckets = nil
		prefix := n.key(f)
		for i := uint64(0); i < n.mod; i++ {
			if v, ok := m[prefix+" . "+strconv.FormatUint(i, 10)]; ok {
				buckets = append(buckets, bucket{lo: i, hi: i, value: v})
			}
		}
	} else if n.mapName != "" {
		m, ok := t.maps[n.mapName]
		if !ok {
			return nil, fmt.Errorf("no map %q", n.mapName)
		}
		buckets = nil
		for k, v := range m {
			lo, hi, err := parseRange(k)
			if err != nil {
				return nil, fmt.Errorf("map %s: %w", n.mapName, err)
			}
			buckets = append(buckets, bucket{lo: lo, hi: hi, value: v})
		}
		slices.SortFunc(buckets, func(a, b bucket) int { return int(a.lo) - int(b.lo) })
	}
	var out []exprResult
	covered := 0.0
	for _, b := range buckets {
		if b.lo >= n.mod {
			continue
		}
		hi := min(b.hi, n.mod-1)
		nf := f
		nf.p *= share(b.lo, hi)
		covered += share(b.lo, hi)
		if n.kind == 'v' {
			v, target, err := parseVerdict(b.value)
			if err != nil {
				return nil, err
			}
			out = append(out, exprResult{match: true, f: nf, v: v, target: target})
			continue
		}
		nf, err := dnatTo(nf, b.value)
		if err != nil {
			return nil, err
		}
		out = append(out, exprResult{match: true, f: nf, v: vAccept})
	}
	if rest := 1 - covered; rest > 1e-15 {
		// A value without an element: the lookup fails, the rule does not
		// match.
		nf := f
		nf.p *= rest
		out = append(out, exprResult{match: false, f: nf})
	}
	return out, nil
}

func dnatTo(f flow, value []string) (flow, error) {
	if len(value) != 2 {
		return f, fmt.Errorf("bad DNAT map value %q", value)
	}
	a, err := netip.ParseAddr(value[0])
	if err != nil {
		return f, fmt.Errorf("bad DNAT address %q: %w", value[0], err)
	}
	port, err := strconv.Atoi(value[1])
	if err != nil {
		return f, fmt.Errorf("bad DNAT port %q: %w", value[1], err)
	}
	f.dst, f.dport, f.dnat = a, port, true
	return f, nil
}

// vmapExpr is a verdict map lookup keyed by the packet.
type vmapExpr struct {
	key     func(f flow) string
	mapName string
}

func (v *vmapExpr) eval(t *Tracer, f flow, _ trace.History) ([]exprResult, error) {
	m, ok := t.maps[v.mapName]
	if !ok {
		return nil, fmt.Errorf("no map %q", v.mapName)
	}
	val, ok := m[v.key(f)]
	if !ok {
		return one(false, f)
	}
	verd, target, err := parseVerdict(val)
	if err != nil {
		return nil, err
	}
	return []exprResult{{match: true, f: f, v: verd, target: target}}, nil
}

func parseVerdict(value []string) (verdict, string, error) {
	w := strings.Fields(strings.Join(value, " "))
	switch {
	case len(w) == 2 && w[0] == "goto":
		return vGoto, w[1], nil
	case len(w) == 2 && w[0] == "jump":
		return vJump, w[1], nil
	case len(w) == 1 && w[0] == "drop":
		return vDrop, "", nil
	case len(w) == 1 && w[0] == "accept":
		return vAccept, "", nil
	case len(w) == 1 && w[0] == "return":
		return vReturn, "", nil
	case len(w) == 1 && w[0] == "reject":
		return vReject, "", nil
	}
	return 0, "", fmt.Errorf("unknown verdict %q", strings.Join(value, " "))
}

func parseRange(s string) (uint64, uint64, error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "-")
	lo, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("bad numgen value %q", s)
	}
	hi := lo
	if isRange {
		if hi, err = strconv.ParseUint(b, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("bad numgen range %q", s)
		}
	}
	return lo, hi, nil
}

// parseInlineMap reads "{ k : v , k : v }" (values of one or more words,
// concatenations written "a . b").
func parseInlineMap(tok string) ([]bucket, error) {
	body := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(tok, "{"), "}"))
	var out []bucket
	for _, item := range strings.Split(body, ",") {
		k, v, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("bad map element %q", item)
		}
		lo, hi, err := parseRange(k)
		if err != nil {
			return nil, err
		}
		var value []string
		for _, part := range strings.Split(v, " . ") {
			value = append(value, strings.TrimSpace(part))
		}
		if hi < lo {
			return nil, fmt.Errorf("bad numgen range %q", strings.TrimSpace(k))
		}
		out = append(out, bucket{lo: lo, hi: hi, value: value})
	}
	// The kernel refuses overlapping intervals in one map; a lookup
	// finds one element, so shares counted twice would sum past 1.
	sorted := slices.Clone(out)
	slices.SortFunc(sorted, func(a, b bucket) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].lo <= sorted[i-1].hi {
			return nil, fmt.Errorf("overlapping map keys %d-%d and %d-%d", sorted[i-1].lo, sorted[i-1].hi, sorted[i].lo, sorted[i].hi)
		}
	}
	return out, nil
}

// tokenize splits a rule into words, keeping each { ... } group as one.
func tokenize(s string) []string {
	var out []string
	words := strings.Fields(s)
	for i := 0; i < len(words); i++ {
		if words[i] != "{" {
			out = append(out, words[i])
			continue
		}
		j := i
		for j < len(words) && words[j] != "}" {
			j++
		}
		out = append(out, strings.Join(words[i:min(j+1, len(words))], " "))
		i = j
	}
	return out
}

func hasPrefix(toks []string, words ...string) bool {
	if len(toks) < len(words) {
		return false
	}
	for i, w := range words {
		if w != "*" && toks[i] != w {
			return false
		}
	}
	return true
}

// parseRule turns a rule this package writes into expressions.
func parseRule(s string) ([]expr, error) {
	toks := tokenize(s)
	var out []expr
	for i := 0; i < len(toks); {
		e, n, err := parseOne(toks[i:])
		if err != nil {
			return nil, err
		}
		out = append(out, e)
		i += n
	}
	return out, nil
}

// CheckRule reports whether the tracer understands rule (the rules this
// package writes, and kube-proxy's as nft lists them); a reader of dumps
// leaves out, and reports, a rule it does not.
func CheckRule(rule string) error {
	_, err := parseRule(rule)
	return err
}

// isZero reports whether s is a zero number as nft prints it (0, 0x00000000).
func isZero(s string) bool {
	v, err := strconv.ParseUint(s, 0, 64)
	return err == nil && v == 0
}

// parseOne reads the expression or statement at the start of t (matches,
// then mark, numgen, jhash and DNAT, then the other statements and the
// verdicts: the first that recognises t wins) and how many tokens it took.
func parseOne(t []string) (expr, int, error) {
	for _, parse := range []func([]string) (expr, int, error){parseMatchExpr, parseNATExpr, parseStatement} {
		if e, n, err := parse(t); e != nil || err != nil {
			return e, n, err
		}
	}
	return nil, 0, fmt.Errorf("unknown expression at %q", strings.Join(t, " "))
}

// alwaysMatch is a match that holds for every packet (a new connection's
// ct state, a counter).
var alwaysMatch = matchFunc(func(*Tracer, flow, trace.History) (bool, error) { return true, nil })

// parseMatchExpr reads a match at the start of t: conntrack, verdict maps,
// addresses, ports, protocol, fib, mark; a nil expr and no error when t
// starts with none.
func parseMatchExpr(t []string) (expr, int, error) {
	switch {
	case hasPrefix(t, "ct", "state", "new"):
		return alwaysMatch, 3, nil
	case hasPrefix(t, "ct", "status", "dnat"):
		return matchFunc(func(_ *Tracer, f flow, _ trace.History) (bool, error) { return f.dnat, nil }), 3, nil
	case hasPrefix(t, "ip", "daddr", ".", "meta", "l4proto", ".", "th", "dport", "vmap", "*") && strings.HasPrefix(t[9], "@"):
		return &vmapExpr{mapName: t[9][1:], key: func(f flow) string {
			return fmt.Sprintf("%s . %s . %d", f.dst, f.proto, f.dport)
		}}, 10, nil
	case hasPrefix(t, "meta", "l4proto", ".", "th", "dport", "vmap", "*") && strings.HasPrefix(t[6], "@"):
		return &vmapExpr{mapName: t[6][1:], key: func(f flow) string {
			return fmt.Sprintf("%s . %d", f.proto, f.dport)
		}}, 7, nil
	case hasPrefix(t, "ip", "saddr", ".", "ip", "daddr", "*") && strings.HasPrefix(t[5], "@"):
		set := t[5][1:]
		return matchFunc(func(tr *Tracer, f flow, _ trace.History) (bool, error) {
			s, ok := tr.sets[set]
			if !ok {
				return false, fmt.Errorf("no set %q", set)
			}
			return s[f.src.String()+" . "+f.dst.String()], nil
		}), 6, nil
	case hasPrefix(t, "ip", "saddr", ".", "ip", "daddr", ".", "meta", "l4proto", ".", "th", "dport", "*") && strings.HasPrefix(t[11], "@"):
		set := t[11][1:]
		return matchFunc(func(tr *Tracer, f flow, _ trace.History) (bool, error) {
			s, ok := tr.sets[set]
			if !ok {
				return false, fmt.Errorf("no set %q", set)
			}
			return s[fmt.Sprintf("%s . %s . %s . %d", f.src, f.dst, f.proto, f.dport)], nil
		}), 12, nil
	case hasPrefix(t, "ip", "*") && (t[1] == "saddr" || t[1] == "daddr") && len(t) >= 3:
		return parseAddrMatch(t)
	case len(t) >= 3 && (t[0] == "tcp" || t[0] == "udp" || t[0] == "sctp") && t[1] == "dport":
		port, err := strconv.Atoi(t[2])
		if err != nil {
			return nil, 0, fmt.Errorf("bad port %q", t[2])
		}
		proto := t[0]
		return matchFunc(func(_ *Tracer, f flow, _ trace.History) (bool, error) {
			return f.proto == proto && f.dport == port, nil
		}), 3, nil
	case hasPrefix(t, "meta", "l4proto", "*") && t[2] != ".":
		proto := t[2]
		return matchFunc(func(_ *Tracer, f flow, _ trace.History) (bool, error) { return f.proto == proto, nil }), 3, nil
	case hasPrefix(t, "fib", "*", "type", "local") && (t[1] == "saddr" || t[1] == "daddr"):
		src := t[1] == "saddr"
		return matchFunc(func(tr *Tracer, f flow, _ trace.History) (bool, error) {
			if src {
				return tr.isLocal(f.src), nil
			}
			return tr.isLocal(f.dst), nil
		}), 4, nil
	case hasPrefix(t, "meta", "mark", "&", "*", "*", "*") && (t[4] == "==" || t[4] == "!=") && isZero(t[5]):
		// nft's listing of `mark and M != 0`.
		e, _, err := parseMatchExpr([]string{"mark", "and", t[3], t[4], "0"})
		return e, 6, err
	case hasPrefix(t, "mark", "and", "*", "*", "0") && (t[3] == "==" || t[3] == "!="):
		m, err := strconv.ParseUint(t[2], 0, 32)
		if err != nil {
			return nil, 0, fmt.Errorf("bad mark %q", t[2])
		}
		zero := t[3] == "=="
		return matchFunc(func(_ *Tracer, f flow, _ trace.History) (bool, error) { return (f.mark&uint32(m) == 0) == zero, nil }), 5, nil
	}
	return nil, 0, nil
}

// parseNATExpr reads a mark, numgen, jhash or DNAT expression at the start
// of t; a nil expr and no error when t starts with none.
func parseNATExpr(t []string) (expr, int, error) {
	switch {
	case hasPrefix(t, "meta", "mark", "set", "meta", "mark", "*", "*") && (t[5] == "|" || t[5] == "^"):
		// nft's listing of `mark set mark or|xor M`.
		op := map[string]string{"|": "or", "^": "xor"}[t[5]]
		e, _, err := parseNATExpr([]string{"mark", "set", "mark", op, t[6]})
		return e, 7, err
	case hasPrefix(t, "mark", "set", "mark", "*", "*") && (t[3] == "or" || t[3] == "xor"):
		m, err := strconv.ParseUint(t[4], 0, 32)
		if err != nil {
			return nil, 0, fmt.Errorf("bad mark %q", t[4])
		}
		or := t[3] == "or"
		return stmtFunc(func(_ *Tracer, f flow) (flow, verdict, string, error) {
			if or {
				f.mark |= uint32(m)
			} else {
				f.mark ^= uint32(m)
			}
			return f, vNext, "", nil
		}), 5, nil
	case hasPrefix(t, "numgen", "random", "mod", "*", "vmap", "*"):
		mod, err := strconv.ParseUint(t[3], 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("bad numgen modulus %q", t[3])
		}
		b, err := parseInlineMap(t[5])
		if err != nil {
			return nil, 0, err
		}
		return &numgenExpr{mod: mod, kind: 'v', buckets: b}, 6, nil
	case hasPrefix(t, "numgen", "random", "mod", "*", "*", "*") && (t[4] == "==" || t[4] == "<"):
		mod, err1 := strconv.ParseUint(t[3], 10, 64)
		k, err2 := strconv.ParseUint(t[5], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, 0, fmt.Errorf("bad numgen match %q", strings.Join(t[:6], " "))
		}
		return &numgenExpr{mod: mod, kind: 'm', k: k, lt: t[4] == "<"}, 6, nil
	case hasPrefix(t, "jhash", "ip", "saddr", "mod", "*", "seed", "*", "*", "*") && (t[7] == "==" || t[7] == "!="):
		return parseJHash(t)
	case hasPrefix(t, "dnat", "ip", "to", "numgen", "random", "mod", "*", "map", "*"):
		mod, err := strconv.ParseUint(t[6], 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("bad numgen modulus %q", t[6])
		}
		n := &numgenExpr{mod: mod, kind: 'd'}
		if strings.HasPrefix(t[8], "@") {
			n.mapName = t[8][1:]
		} else if n.buckets, err = parseInlineMap(t[8]); err != nil {
			return nil, 0, err
		}
		return n, 9, nil
	case hasPrefix(t, "dnat", "ip", "addr", ".", "port", "to", "numgen", "random", "mod", "*", "map", "*") && strings.HasPrefix(t[11], "{"):
		// kube-proxy v1.37's inline endpoint map.
		mod, err := strconv.ParseUint(t[9], 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("bad numgen modulus %q", t[9])
		}
		n := &numgenExpr{mod: mod, kind: 'd'}
		if n.buckets, err = parseInlineMap(t[11]); err != nil {
			return nil, 0, err
		}
		return n, 12, nil
	case hasPrefix(t, "dnat", "ip", "to", "ip", "daddr", ".", "meta", "l4proto", ".", "th", "dport", ".", "numgen", "random", "mod", "*", "map", "*") && strings.HasPrefix(t[17], "@"):
		mod, err := strconv.ParseUint(t[15], 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("bad numgen modulus %q", t[15])
		}
		return &numgenExpr{mod: mod, kind: 'd', mapName: t[17][1:], key: func(f flow) string {
			return fmt.Sprintf("%s . %s . %d", f.dst, f.proto, f.dport)
		}}, 18, nil
	case hasPrefix(t, "dnat", "ip", "to", "meta", "l4proto", ".", "th", "dport", ".", "numgen", "random", "mod", "*", "map", "*") && strings.HasPrefix(t[14], "@"):
		mod, err := strconv.ParseUint(t[12], 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("bad numgen modulus %q", t[12])
		}
		return &numgenExpr{mod: mod, kind: 'd', mapName: t[14][1:], key: func(f flow) string {
			return fmt.Sprintf("%s . %d", f.proto, f.dport)
		}}, 15, nil
	case hasPrefix(t, "dnat", "to", "*"):
		ap, err := netip.ParseAddrPort(t[2])
		if err != nil {
			return nil, 0, fmt.Errorf("bad DNAT target %q", t[2])
		}
		return stmtFunc(func(_ *Tracer, f flow) (flow, verdict, string, error) {
			f.dst, f.dport, f.dnat = ap.Addr(), int(ap.Port()), true
			return f, vAccept, "", nil
		}), 3, nil
	}
	return nil, 0, nil
}

// parseStatement reads an update, counter, jump, goto, verdict or
// masquerade at the start of t; a nil expr and no error when t starts with
// none.
func parseStatement(t []string) (expr, int, error) {
	switch {
	case hasPrefix(t, "update", "*", "{") || (len(t) >= 3 && t[0] == "update" && strings.HasPrefix(t[2], "{")):
		// Recording into an affinity set: the history is the trace's
		// input, so it has no effect on this trace, but an element
		// timeout of its own sets how long the client is remembered.
		return parseUpdate(t)
	case hasPrefix(t, "counter", "packets", "*", "bytes", "*"):
		// nft's listing of a counter with its values.
		return alwaysMatch, 5, nil
	case t[0] == "counter":
		return alwaysMatch, 1, nil
	case len(t) >= 2 && (t[0] == "jump" || t[0] == "goto"):
		v, target := vJump, t[1]
		if t[0] == "goto" {
			v = vGoto
		}
		return stmtFunc(func(_ *Tracer, f flow) (flow, verdict, string, error) { return f, v, target, nil }), 2, nil
	case t[0] == "return" || t[0] == "drop" || t[0] == "reject" || t[0] == "accept":
		v, _, _ := parseVerdict(t[:1])
		return stmtFunc(func(_ *Tracer, f flow) (flow, verdict, string, error) { return f, v, "", nil }), 1, nil
	case t[0] == "masquerade":
		n := 1
		if len(t) > 1 && t[1] == "fully-random" {
			n = 2
		}
		return stmtFunc(func(_ *Tracer, f flow) (flow, verdict, string, error) {
			f.masq = true
			return f, vAccept, "", nil
		}), n, nil
	}
	return nil, 0, nil
}

// jhashExpr is `jhash ip saddr mod N seed S ==|!= K`: the kernel's jhash
// of the source address, scaled into N buckets (proxy.JHashBucket).
type jhashExpr struct {
	mod, seed, k uint32
	neg          bool
}

// parseJHash reads `jhash ip saddr mod N seed S ==|!= K`.
func parseJHash(t []string) (expr, int, error) {
	mod, err1 := strconv.ParseUint(t[4], 10, 32)
	seed, err2 := strconv.ParseUint(t[6], 0, 32)
	k, err3 := strconv.ParseUint(t[8], 10, 32)
	if err1 != nil || err2 != nil || err3 != nil || mod == 0 {
		return nil, 0, fmt.Errorf("bad jhash match %q", strings.Join(t[:9], " "))
	}
	return &jhashExpr{mod: uint32(mod), seed: uint32(seed), k: uint32(k), neg: t[7] == "!="}, 9, nil
}

func (j *jhashExpr) eval(_ *Tracer, f flow, _ trace.History) ([]exprResult, error) {
	return one(j.holds(f.src), f)
}

func (j *jhashExpr) holds(src netip.Addr) bool {
	return (proxy.JHashBucket(src, j.mod, j.seed) == j.k) != j.neg
}

// updateExpr is `update @set { ip saddr [timeout D] }`.
type updateExpr struct {
	set     string
	timeout time.Duration // 0: the set's
}

func (u *updateExpr) eval(_ *Tracer, f flow, _ trace.History) ([]exprResult, error) {
	return one(true, f)
}

func parseUpdate(t []string) (expr, int, error) {
	u := &updateExpr{set: strings.TrimPrefix(t[1], "@")}
	w := strings.Fields(strings.Trim(t[2], "{}"))
	switch {
	case len(w) == 2 && w[0] == "ip" && w[1] == "saddr":
	case len(w) == 4 && w[0] == "ip" && w[1] == "saddr" && w[2] == "timeout":
		d, err := time.ParseDuration(w[3])
		if err != nil || d <= 0 {
			return nil, 0, fmt.Errorf("bad update timeout %q", w[3])
		}
		u.timeout = d
	default:
		return nil, 0, fmt.Errorf("unknown update %q", t[2])
	}
	return u, 3, nil
}

// elementTimeout is one rule's own timeout for a set's elements, for the
// clients its jhash matches select.
type elementTimeout struct {
	timeout time.Duration
	when    []*jhashExpr
}

// recordTimeouts notes the element timeouts of a rule's updates, with the
// jhash matches before them.
func (t *Tracer) recordTimeouts(exprs []expr) {
	var when []*jhashExpr
	for _, e := range exprs {
		switch x := e.(type) {
		case *jhashExpr:
			when = append(when, x)
		case *updateExpr:
			if x.timeout > 0 {
				t.timeouts[x.set] = append(t.timeouts[x.set], elementTimeout{x.timeout, slices.Clone(when)})
			}
		}
	}
}

// setTimeout is how long the set remembers src: the timeout of the rule
// that refreshes it for src, if it has its own, else the set's (nil: no
// timeout).
func (t *Tracer) setTimeout(set *knftables.FakeSet, src netip.Addr) *time.Duration {
	for _, et := range t.timeouts[set.Name] {
		if !slices.ContainsFunc(et.when, func(j *jhashExpr) bool { return !j.holds(src) }) {
			return &et.timeout
		}
	}
	return set.Timeout
}

// parseAddrMatch reads `ip saddr|daddr [!=] VALUE` with VALUE an address,
// a prefix, an anonymous set of them, or a named set (@name; an affinity
// set is looked up in the client's history).
func parseAddrMatch(t []string) (expr, int, error) {
	src := t[1] == "saddr"
	neg := t[2] == "!="
	i := 2
	if neg {
		i = 3
	}
	if i >= len(t) {
		return nil, 0, fmt.Errorf("missing address after %q", strings.Join(t, " "))
	}
	val := t[i]
	addr := func(f flow) netip.Addr {
		if src {
			return f.src
		}
		return f.dst
	}
	if strings.HasPrefix(val, "@") {
		set := val[1:]
		return matchFunc(func(tr *Tracer, f flow, h trace.History) (bool, error) {
			var in bool
			if strings.HasPrefix(set, PrefixAffinity) {
				s := tr.table.Sets[set]
				if s == nil {
					return false, fmt.Errorf("no set %q", set)
				}
				age, ok := h[set]
				timeout := tr.setTimeout(s, f.src)
				in = ok && (timeout == nil || age < *timeout)
			} else {
				s, ok := tr.sets[set]
				if !ok {
					return false, fmt.Errorf("no set %q", set)
				}
				in = s[addr(f).String()]
			}
			return in != neg, nil
		}), i + 1, nil
	}
	var prefixes []netip.Prefix
	items := []string{val}
	if strings.HasPrefix(val, "{") {
		items = strings.Split(strings.Trim(val, "{} "), ",")
	}
	for _, it := range items {
		it = strings.TrimSpace(it)
		p, err := netip.ParsePrefix(it)
		if err != nil {
			a, err2 := netip.ParseAddr(it)
			if err2 != nil {
				return nil, 0, fmt.Errorf("bad address %q", it)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		prefixes = append(prefixes, p)
	}
	return matchFunc(func(_ *Tracer, f flow, _ trace.History) (bool, error) {
		a := addr(f)
		in := false
		for _, p := range prefixes {
			in = in || p.Contains(a)
		}
		return in != neg, nil
	}), i + 1, nil
}
