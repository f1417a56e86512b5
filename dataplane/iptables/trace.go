package iptables

// The tracer walks the first packet of a NEW connection through the fake's
// tables, as kube-proxy's tracePacket does, but it carries probabilities: at
// each -m statistic rule the flow splits into a matching and a non-matching
// part, weighted by the kernel's quantised probability. It also models the
// `recent` and `set` affinity matches from a client history (which lists or
// sets hold the source, and since when), so affinity can be tested.
//
// Path of the packet (netfilter hook order):
//   - from the node itself (source is a local address): nat OUTPUT, filter
//     OUTPUT, nat POSTROUTING;
//   - otherwise (from a pod or another host): nat PREROUTING, then filter
//     INPUT if the (possibly DNATed) destination is local, else filter
//     FORWARD and nat POSTROUTING.
//
// The cluster match (xt_cluster, which the affinity-leak and
// affinity-overstay faults use) is evaluated on the packet's source with the
// kernel's hash (proxy.JHashBucket).
//
// Not modelled: conntrack beyond the NEW state and the DNAT pseudo-state,
// recording into lists and sets (--set, -j SET), interfaces, the
// ip_list_tot eviction of recent lists (the history says what is in them).

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
)

// flow is a share of the connection with its state.
type flow struct {
	p      float64
	mark   uint32
	dst    netip.Addr
	dport  int
	dnat   bool
	masq   bool
	reject string // final verdict DROP or REJECT, "" while accepted
}

type flowKey struct {
	mark   uint32
	dst    netip.Addr
	dport  int
	dnat   bool
	masq   bool
	reject string
}

func (f flow) key() flowKey {
	return flowKey{f.mark, f.dst, f.dport, f.dnat, f.masq, f.reject}
}

// merge adds up flows in the same state, keeping the first one's position.
func merge(in []flow) []flow {
	if len(in) < 2 {
		return in
	}
	idx := map[flowKey]int{}
	out := in[:0:0]
	for _, f := range in {
		if f.p <= 0 {
			continue
		}
		if i, ok := idx[f.key()]; ok {
			out[i].p += f.p
			continue
		}
		idx[f.key()] = len(out)
		out = append(out, f)
	}
	return out
}

type tracer struct {
	f        *Fake
	pkt      trace.Packet
	hist     trace.History
	fromHost bool
	// setTimeout is each set's entry timeout in seconds (-1: none), from
	// the -j SET rules that add to it, else from the set.
	setTimeout map[string]int
	// steps counts rule evaluations, against maxSteps.
	steps int
}

// maxDepth bounds chain nesting, as a loop guard (the kernel refuses loops).
const maxDepth = 64

// maxSteps bounds the rule evaluations of one trace. Chains that each jump
// twice to the next are no loop, but walking them is exponential in their
// depth; a dump read from elsewhere may hold anything. kube-proxy's rules
// need a few per endpoint.
const maxSteps = 1 << 19

// Trace walks the first packet of a new connection from src to dst:dport
// through the tables and returns the probability of each outcome.
func (f *Fake) Trace(src netip.Addr, proto string, dst netip.Addr, dport int, h trace.History) (trace.Result, error) {
	return f.TracePacket(trace.Packet{Src: src, Protocol: proto, Dst: dst, DPort: dport}, h)
}

// TracePacket is Trace with a Packet.
func (f *Fake) TracePacket(pkt trace.Packet, h trace.History) (trace.Result, error) {
	pkt.Protocol = strings.ToLower(pkt.Protocol)
	t := &tracer{f: f, pkt: pkt, hist: h, fromHost: f.isLocal(pkt.Src), setTimeout: map[string]int{}}
	for n, s := range f.Sets {
		t.setTimeout[n] = s.Timeout
	}
	for _, tb := range f.Tables {
		for _, c := range tb.Chains {
			for _, r := range c.Rules {
				// A rule that adds only other clients (the cluster
				// match of affinity-overstay) does not set this one's.
				if r.addSet != "" && r.addTimeout >= 0 && r.clusterMatch(pkt.Src) {
					t.setTimeout[r.addSet] = r.addTimeout
				}
			}
		}
	}
	flows := []flow{{p: 1, dst: pkt.Dst, dport: pkt.DPort}}
	var done []flow
	hook := func(table, chain string, in []flow) ([]flow, error) {
		out, err := t.hook(table, chain, in)
		if err != nil {
			return nil, err
		}
		var pass []flow
		for _, fl := range out {
			if fl.reject != "" {
				done = append(done, fl)
			} else {
				pass = append(pass, fl)
			}
		}
		return pass, nil
	}
	var err error
	if t.fromHost {
		if flows, err = hook("nat", "OUTPUT", flows); err != nil {
			return nil, err
		}
		if flows, err = hook("filter", "OUTPUT", flows); err != nil {
			return nil, err
		}
		if flows, err = hook("nat", "POSTROUTING", flows); err != nil {
			return nil, err
		}
	} else {
		if flows, err = hook("nat", "PREROUTING", flows); err != nil {
			return nil, err
		}
		var input, forward []flow
		for _, fl := range flows {
			if f.isLocal(fl.dst) {
				input = append(input, fl)
			} else {
				forward = append(forward, fl)
			}
		}
		if input, err = hook("filter", "INPUT", input); err != nil {
			return nil, err
		}
		if forward, err = hook("filter", "FORWARD", forward); err != nil {
			return nil, err
		}
		if forward, err = hook("nat", "POSTROUTING", forward); err != nil {
			return nil, err
		}
		flows = append(input, forward...)
	}
	return result(append(done, flows...)), nil
}

func result(flows []flow) trace.Result {
	type key struct {
		target string
		masq   bool
	}
	sum := map[key]float64{}
	for _, fl := range flows {
		k := key{trace.OutcomeAccept, fl.masq}
		switch {
		case fl.reject != "":
			k = key{fl.reject, false}
		case fl.dnat:
			k.target = netip.AddrPortFrom(fl.dst, uint16(fl.dport)).String()
		}
		sum[k] += fl.p
	}
	out := make(trace.Result, 0, len(sum))
	for k, p := range sum {
		out = append(out, trace.Outcome{Target: k.target, Masquerade: k.masq, P: p})
	}
	out.Sort()
	return out
}

// hook runs flows through a built-in chain and applies its policy to what
// falls off its end. Flows come back accepted (reject "") or with a DROP or
// REJECT verdict.
func (t *tracer) hook(table, chain string, in []flow) ([]flow, error) {
	if len(in) == 0 {
		return nil, nil
	}
	tb := t.f.Tables[table]
	c := tb.Chains[chain]
	if c == nil {
		return nil, fmt.Errorf("could not trace: chain %s missing from table %s", chain, table)
	}
	verdicts, returned, err := t.run(tb, c, in, 0)
	if err != nil {
		return nil, err
	}
	for _, fl := range returned {
		if c.Policy == "DROP" {
			fl.reject = trace.OutcomeDrop
		}
		verdicts = append(verdicts, fl)
	}
	return merge(verdicts), nil
}

// run walks flows through one chain. It returns the flows that got a verdict
// (ACCEPT, DROP, REJECT, or a terminating NAT target) and those that returned
// from the chain (RETURN or its end).
func (t *tracer) run(tb *Table, c *Chain, active []flow, depth int) (verdicts, returned []flow, err error) {
	if depth > maxDepth {
		return nil, nil, fmt.Errorf("could not trace: chains nested deeper than %d at %s", maxDepth, c.Name)
	}
	for _, r := range c.Rules {
		if len(active) == 0 {
			break
		}
		var next []flow
		for _, fl := range active {
			if t.steps++; t.steps > maxSteps {
				return nil, nil, fmt.Errorf("could not trace: more than %d rule evaluations at %s", maxSteps, c.Name)
			}
			q := t.matchP(r, fl)
			if q < 1 {
				miss := fl
				miss.p *= 1 - q
				next = append(next, miss)
			}
			if q <= 0 {
				continue
			}
			hit := fl
			hit.p *= q
			v, cont, ret, err := t.target(tb, r, hit, depth)
			if err != nil {
				return nil, nil, err
			}
			verdicts = append(verdicts, v...)
			next = append(next, cont...)
			returned = append(returned, ret...)
		}
		active = merge(next)
	}
	return verdicts, merge(append(returned, active...)), nil
}

// target applies a matched rule's target to a flow: it returns the flows with
// a verdict, those that continue with the next rule, and those that return.
func (t *tracer) target(tb *Table, r *Rule, fl flow, depth int) (verdicts, cont, ret []flow, err error) {
	switch r.target {
	case "":
		return nil, []flow{fl}, nil, nil
	case "ACCEPT":
		return []flow{fl}, nil, nil, nil
	case "DROP", "REJECT":
		fl.reject = r.target
		return []flow{fl}, nil, nil, nil
	case "RETURN":
		return nil, nil, []flow{fl}, nil
	case "DNAT":
		if r.toDest.IsValid() {
			fl.dst, fl.dport = r.toDest.Addr(), int(r.toDest.Port())
		} else {
			fl.dst = r.toDestIP
		}
		fl.dnat = true
		return []flow{fl}, nil, nil, nil
	case "MASQUERADE", "SNAT":
		fl.masq = true
		return []flow{fl}, nil, nil, nil
	case "MARK":
		switch r.markOp {
		case "--or-mark":
			fl.mark |= r.markArg
		case "--xor-mark":
			fl.mark ^= r.markArg
		case "--and-mark":
			fl.mark &= r.markArg
		case "--set-mark":
			fl.mark = r.markArg
		case "--set-xmark": // xt_MARK: (mark & ~mask) ^ value
			fl.mark = (fl.mark &^ r.markArgMask) ^ r.markArg
		}
		return nil, []flow{fl}, nil, nil
	case "SET":
		return nil, []flow{fl}, nil, nil
	}
	sub := tb.Chains[r.target]
	if sub == nil {
		return nil, nil, nil, fmt.Errorf("could not trace: rule jumps to missing chain %s", r.target)
	}
	v, back, err := t.run(tb, sub, []flow{fl}, depth+1)
	if err != nil {
		return nil, nil, nil, err
	}
	if r.isGoto {
		return v, nil, back, nil
	}
	return v, back, nil, nil
}

// matchP is the probability that the rule's matches all hold for the flow.
func (t *tracer) matchP(r *Rule, fl flow) float64 {
	if r.proto != "" && r.proto != t.pkt.Protocol {
		return 0
	}
	if !r.src.match(t.pkt.Src) || !r.dst.match(fl.dst) {
		return 0
	}
	if r.dport != 0 && (fl.dport == r.dport) == r.dportNeg {
		return 0
	}
	if r.markSet && (fl.mark&r.markM == r.markVal&r.markM) == r.markNeg {
		return 0
	}
	if r.srcLocal != 0 && t.f.isLocal(t.pkt.Src) != (r.srcLocal > 0) {
		return 0
	}
	if r.dstLocal != 0 && t.f.isLocal(fl.dst) != (r.dstLocal > 0) {
		return 0
	}
	if r.ctSet {
		in := r.ctStates["NEW"] || (fl.dnat && r.ctStates["DNAT"])
		if in == r.ctNeg {
			return 0
		}
	}
	if !r.clusterMatch(t.pkt.Src) {
		return 0
	}
	if r.recentCheck && !t.remembered(r.recentName, r.recentSeconds) {
		return 0
	}
	if r.matchSet != "" && !t.remembered(r.matchSet, t.setTimeout[r.matchSet]) {
		return 0
	}
	if r.probSet {
		return r.prob
	}
	return 1
}

// clusterMatch reports whether the rule's cluster matches (if any) hold for
// a connection from src: xt_cluster hashes the original source address, so
// DNAT does not change it.
func (r *Rule) clusterMatch(src netip.Addr) bool {
	for _, c := range r.clusters {
		in := proxy.JHashBucket(src, uint32(c.total), c.seed) == uint32(c.node-1)
		if in == c.neg {
			return false
		}
	}
	return true
}

// remembered reports whether the history holds the client in the list or
// set within the timeout (seconds; <= 0: any age).
func (t *tracer) remembered(name string, seconds int) bool {
	age, ok := t.hist[name]
	if !ok {
		return false
	}
	return seconds <= 0 || age <= time.Duration(seconds)*time.Second
}

func (f *Fake) isLocal(a netip.Addr) bool {
	if a.Is4() && a.As4()[0] == 127 {
		return true
	}
	return slices.Contains(f.LocalAddrs, a)
}
