package diagnose

// The nftables readers: `nft list ruleset` / `nft list table ip kube-proxy`
// (ReadNFT) and `nft -j list ruleset` (ReadNFTJSON). Both forms become the
// same nftTables (nft_text.go, nft_json.go); only kube-proxy's `ip
// kube-proxy` table is read, every other table is Ignored. That table is
// loaded into a knftables.Fake and dataplane/nftables's tracer gives each
// service port's probabilities: a new connection from a client without
// affinity state is traced to every ClusterIP:port of the service-ips
// map, so numgen buckets (and whatever a fault made of them) are read as
// the kernel would apply them. The layout is kube-proxy's: v1.37's inline
// `dnat ip to numgen random mod N map { 0 : ip . port, ... }`, and the
// per-endpoint chains of 1.29-1.36 (and of v1.37 with ClientIP affinity),
// `numgen random mod N vmap { 0 : goto endpoint-..., ... }`.
//
// kube-proxy writes no counters in nftables mode, so a dump carries no
// count of new connections per endpoint; where a user added counters to
// the endpoint chains' rules, they are used. The affinity sets' elements
// (the client addresses, with the time left) are the state the analysis
// can use instead.

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/scenario"
)

// nftTable is one table of a listing, in either form.
type nftTable struct {
	family, name string
	line         Line
	lines        int
	comment      string
	chains       []*nftChain
	sets         []*nftSet // sets and maps
	skipped      []Skipped
}

type nftChain struct {
	name            string
	line            Line
	typ, hook, prio string // base chains
	policy          string
	rules           []nftRule
}

type nftRule struct {
	text    string // as knftables holds a rule: words joined by spaces, no comment
	comment string
	counter *[2]uint64 // packets, bytes of its counter, when it has one
	line    Line
	bad     string // why the JSON reader could not turn it into text
}

type nftSet struct {
	name    string
	isMap   bool
	typ     string
	typeof  bool
	flags   []string
	timeout *time.Duration
	comment string
	elems   []nftElem
	line    Line
	skipped []Skipped
}

type nftElem struct {
	key, value       []string
	timeout, expires time.Duration
	comment          string
	line             Line
}

// CountersWhyNFT is Dump.CountersWhy for an nftables dump without counters.
const CountersWhyNFT = "kube-proxy adds no counters in nftables mode: the dump shows the rules and the affinity sets' clients, not how many connections each endpoint received"

// ReadNFT reads `nft list ruleset` or `nft list table ip kube-proxy`
// output; input whose first non-space byte is `{` is read as `nft -j list
// ruleset` (ReadNFTJSON).
func ReadNFT(file string, data []byte) (*Dump, error) {
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		return ReadNFTJSON(file, data)
	}
	tables, err := parseNFTText(file, data)
	if err != nil {
		return nil, err
	}
	return buildNFTDump(file, FormatNFT, tables)
}

// ReadNFTAuto is ReadNFT: it tells the text form from JSON by the first
// non-space byte.
func ReadNFTAuto(file string, data []byte) (*Dump, error) { return ReadNFT(file, data) }

// ReadNFTJSON reads `nft -j list ruleset` (or `nft -j list table ...`)
// output.
func ReadNFTJSON(file string, data []byte) (*Dump, error) {
	tables, err := parseNFTJSON(file, data)
	if err != nil {
		return nil, err
	}
	return buildNFTDump(file, FormatNFTJSON, tables)
}

// nftKube is the kube-proxy table being read.
type nftKube struct {
	d       *Dump
	tb      *nftTable
	chains  map[string]*nftChain
	sets    map[string]*nftSet
	fake    *knftables.Fake
	tracer  *nftables.Tracer
	client  netip.Addr
	pods    netip.Prefix // the pod range the services chain names, if any
	skipped map[*nftRule]bool
	// nodeTr traces with a node address as local (node ports), made on
	// first use; extAddrs is service-ips by external chain.
	nodeTr   *nftables.Tracer
	extAddrs map[string]netip.AddrPort
}

func buildNFTDump(file string, format Format, tables []*nftTable) (*Dump, error) {
	d := &Dump{File: file, Format: format, Mode: "nftables", CountersWhy: CountersWhyNFT, Ports: []*ServicePort{}}
	var kube *nftTable
	for _, tb := range tables {
		switch {
		case tb.family == "ip" && tb.name == "kube-proxy" && kube == nil:
			kube = tb
		case tb.family == "ip6" && tb.name == "kube-proxy":
			d.Ignored = append(d.Ignored, Ignored{What: "table ip6 kube-proxy (kube-proxy's IPv6 rules: only IPv4 is read)",
				Lines: tb.lines, First: tb.line})
		default:
			d.Ignored = append(d.Ignored, Ignored{What: "table " + tb.family + " " + tb.name, Lines: tb.lines, First: tb.line})
		}
	}
	if kube == nil {
		return d, nil
	}
	k := &nftKube{d: d, tb: kube, chains: map[string]*nftChain{}, sets: map[string]*nftSet{}, skipped: map[*nftRule]bool{}}
	d.Skipped = append(d.Skipped, kube.skipped...)
	if err := k.load(); err != nil {
		return nil, err
	}
	if err := k.ports(); err != nil {
		return nil, err
	}
	k.frontends()
	k.externalPaths()
	slices.SortFunc(d.Ports, func(a, b *ServicePort) int {
		if c := a.ClusterIP.Compare(b.ClusterIP); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return a.Port - b.Port
		}
		return strings.Compare(a.Protocol, b.Protocol)
	})
	k.counters()
	return d, nil
}

// load builds the Fake and the tracer. Rules the tracer does not
// understand, and rules or elements that name a chain, set or map the
// dump does not define, are left out and reported. The table is filled
// in place, not through a transaction: knftables.Fake looks every new
// element up linearly (quadratic in a map's size: minutes for the
// service-ips map of 5000 Services), and the checks a transaction would
// make are made here.
func (k *nftKube) load() error {
	fam := knftables.IPv4Family
	f := knftables.NewFake(fam, "kube-proxy")
	table := &knftables.FakeTable{Table: knftables.Table{Family: fam, Name: "kube-proxy"},
		Flowtables: map[string]*knftables.FakeFlowtable{}, Chains: map[string]*knftables.FakeChain{},
		Sets: map[string]*knftables.FakeSet{}, Maps: map[string]*knftables.FakeMap{}, Counters: map[string]*knftables.FakeCounter{}}
	if k.tb.comment != "" {
		table.Comment = knftables.PtrTo(k.tb.comment)
	}
	f.Table = table
	f.Tables = map[knftables.Family]map[string]*knftables.FakeTable{fam: {"kube-proxy": table}}
	if err := k.loadChains(table); err != nil {
		return err
	}
	lines := k.loadSets(table)
	k.dropDanglingElements(table, lines)
	k.loadRules(table)
	client, err := k.clientAddr()
	if err != nil {
		return err
	}
	k.client, k.fake = client, f
	t, err := nftables.NewTracer(f)
	if err != nil {
		return &scenario.FieldError{File: k.tb.line.File, Pos: scenario.Pos{Line: k.tb.line.Line, Column: 1}, Field: "table ip kube-proxy",
			Message: "expected rules the tracer reads: " + err.Error()}
	}
	k.tracer = t
	return nil
}

// loadChains adds the dump's chains, without rules, to table (the second
// of two chains of one name is left out); a base chain's priority that
// knftables cannot read is the error.
func (k *nftKube) loadChains(table *knftables.FakeTable) error {
	fam := table.Family
	for _, c := range k.tb.chains {
		if k.chains[c.name] != nil {
			k.d.Skipped = append(k.d.Skipped, Skipped{Line: c.line, Reason: "chain " + c.name + " is listed twice: the second is left out"})
			continue
		}
		k.chains[c.name] = c
		ch := knftables.Chain{Family: fam, Table: "kube-proxy", Name: c.name}
		if c.hook != "" {
			if _, err := knftables.ParsePriority(fam, c.prio); err != nil {
				return &scenario.FieldError{File: c.line.File, Pos: scenario.Pos{Line: c.line.Line, Column: 1}, Field: "chain " + c.name,
					Message: fmt.Sprintf("expected a base chain priority (a number or filter, dstnat, srcnat, ... with an offset), found %q", c.prio)}
			}
			ch.Type = knftables.PtrTo(knftables.BaseChainType(c.typ))
			ch.Hook = knftables.PtrTo(knftables.BaseChainHook(c.hook))
			ch.Priority = knftables.PtrTo(knftables.BaseChainPriority(c.prio))
		}
		table.Chains[c.name] = &knftables.FakeChain{Chain: ch}
	}
	return nil
}

// loadSets adds the dump's sets and maps with their elements to table
// (the second of two sets of one name, and of two elements of one key, is
// left out) and returns each element's line.
func (k *nftKube) loadSets(table *knftables.FakeTable) map[*knftables.Element]Line {
	fam := table.Family
	lines := map[*knftables.Element]Line{}
	for _, s := range k.tb.sets {
		if k.sets[s.name] != nil {
			k.d.Skipped = append(k.d.Skipped, Skipped{Line: s.line, Reason: "set " + s.name + " is listed twice: the second is left out"})
			continue
		}
		k.sets[s.name] = s
		k.d.Skipped = append(k.d.Skipped, s.skipped...)
		var flags []knftables.SetFlag
		for _, fl := range s.flags {
			flags = append(flags, knftables.SetFlag(fl))
		}
		var elems []*knftables.Element
		seen := map[string]bool{}
		for _, e := range s.elems {
			key := strings.Join(e.key, " . ")
			if seen[key] {
				k.d.Skipped = append(k.d.Skipped, Skipped{Line: e.line, Reason: "element " + key + " of " + s.name + " is listed twice"})
				continue
			}
			seen[key] = true
			el := &knftables.Element{Family: fam, Table: "kube-proxy", Key: e.key, Value: e.value}
			if s.isMap {
				el.Map = s.name
			} else {
				el.Set = s.name
			}
			elems = append(elems, el)
			lines[el] = e.line
		}
		if s.isMap {
			table.Maps[s.name] = &knftables.FakeMap{Map: knftables.Map{Family: fam, Table: "kube-proxy", Name: s.name, Type: s.typ, Flags: flags, Timeout: s.timeout}, Elements: elems}
		} else {
			table.Sets[s.name] = &knftables.FakeSet{Set: knftables.Set{Family: fam, Table: "kube-proxy", Name: s.name, Type: s.typ, Flags: flags, Timeout: s.timeout}, Elements: elems}
		}
	}
	return lines
}

// dropDanglingElements leaves out (and reports) the map elements that
// name a chain the dump does not define.
func (k *nftKube) dropDanglingElements(table *knftables.FakeTable, lines map[*knftables.Element]Line) {
	for _, s := range k.tb.sets {
		m := table.Maps[s.name]
		if m == nil || k.sets[s.name] != s {
			continue
		}
		kept := m.Elements[:0]
		for _, el := range m.Elements {
			if len(el.Value) == 1 {
				if w := strings.Fields(el.Value[0]); len(w) == 2 && (w[0] == "goto" || w[0] == "jump") && k.chains[w[1]] == nil {
					k.d.Skipped = append(k.d.Skipped, Skipped{Line: lines[el],
						Reason: "element " + strings.Join(el.Key, " . ") + " of " + m.Name + " names chain " + w[1] + ", which the dump does not define"})
					continue
				}
			}
			kept = append(kept, el)
		}
		m.Elements = kept
	}
}

// loadRules adds each chain's rules to table, leaving out (and reporting)
// the ones the reader or the tracer does not understand and the ones that
// name what the dump does not define.
func (k *nftKube) loadRules(table *knftables.FakeTable) {
	for _, c := range k.tb.chains {
		if k.chains[c.name] != c {
			continue
		}
		fc := table.Chains[c.name]
		for i := range c.rules {
			r := &c.rules[i]
			if r.bad != "" {
				k.skip(r, "the rule has an expression the reader does not understand ("+r.bad+"): left out")
				continue
			}
			if why := k.refProblem(r.text); why != "" {
				k.skip(r, why)
				continue
			}
			if err := nftables.CheckRule(r.text); err != nil {
				k.skip(r, "the tracer does not understand this rule ("+err.Error()+"): left out")
				continue
			}
			fc.Rules = append(fc.Rules, &knftables.Rule{Family: table.Family, Table: "kube-proxy", Chain: c.name, Rule: r.text})
		}
	}
}

func (k *nftKube) skip(r *nftRule, why string) {
	k.skipped[r] = true
	k.d.Skipped = append(k.d.Skipped, Skipped{Line: r.line, Reason: why})
}

// refProblem says which chain, set or map a rule names that the dump does
// not define (knftables.Fake refuses such a rule), "" when none.
func (k *nftKube) refProblem(rule string) string {
	words := strings.Split(rule, " ")
	for i, w := range words {
		if strings.HasPrefix(w, "@") && !strings.Contains(w, ",") {
			if k.sets[w[1:]] == nil {
				return "the rule names set or map " + w[1:] + ", which the dump does not define: left out"
			}
			if i > 0 && (words[i-1] == "map" || words[i-1] == "vmap") && !k.sets[w[1:]].isMap {
				return "the rule uses set " + w[1:] + " as a map: left out"
			}
			if i > 0 && (words[i-1] == "offload" || words[i-1] == "add") {
				return "the rule uses a flowtable: left out"
			}
		} else if (w == "goto" || w == "jump") && i < len(words)-1 && k.chains[words[i+1]] == nil {
			return "the rule names chain " + words[i+1] + ", which the dump does not define: left out"
		}
	}
	return ""
}

// clientAddr is the source of the traced connections: an address of the
// cluster's pod range that is not this node's (the masquerade rule of
// `services`, `ip daddr @cluster-ips ip saddr != POD-CIDR ...`, names the
// range), else a documentation address. The source changes no numgen
// share; it matters only to the faults that hash it.
func (k *nftKube) clientAddr() (netip.Addr, error) {
	if c := k.chains["services"]; c != nil {
		for _, r := range c.rules {
			w := strings.Fields(r.text)
			for i := 0; i+3 < len(w); i++ {
				if w[i] == "ip" && w[i+1] == "saddr" && w[i+2] == "!=" {
					if p, err := netip.ParsePrefix(w[i+3]); err == nil && p.Addr().Is4() && p.Bits() <= 30 {
						k.pods = p.Masked()
						// The range's last but one address.
						a := p.Masked().Addr().As4()
						n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
						n |= 1<<(32-p.Bits()) - 1
						n--
						return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), nil
					}
				}
			}
		}
	}
	return netip.MustParseAddr("192.0.2.1"), nil
}

// nftPortKey is a verdict map element's key: ip . proto . port.
func nftPortKey(key []string) (netip.Addr, string, int, bool) {
	if len(key) != 3 {
		return netip.Addr{}, "", 0, false
	}
	a, err := netip.ParseAddr(key[0])
	if err != nil || !a.Is4() {
		return netip.Addr{}, "", 0, false
	}
	port, err := strconv.Atoi(key[2])
	if err != nil || port < 1 || port > 65535 {
		return netip.Addr{}, "", 0, false
	}
	proto := key[1]
	if proto != "tcp" && proto != "udp" && proto != "sctp" {
		return netip.Addr{}, "", 0, false
	}
	return a, proto, port, true
}

// portNameFromChain reads "ns/svc:port" from a service chain's name,
// `service-HASH-ns/svc/proto/port` (also local-, external-), "" when the
// name is not of that form.
func portNameFromChain(chain string) string {
	for _, pre := range []string{nftables.PrefixService, nftables.PrefixLocal, nftables.PrefixExternal} {
		rest, ok := strings.CutPrefix(chain, pre)
		if !ok {
			continue
		}
		_, rest, ok = strings.Cut(rest, "-") // the hash
		if !ok {
			return ""
		}
		parts := strings.Split(rest, "/")
		if len(parts) != 4 {
			return ""
		}
		name := parts[0] + "/" + parts[1]
		if parts[3] != "" {
			name += ":" + parts[3]
		}
		return name
	}
	return ""
}

// ports fills Dump.Ports from the service-ips and no-endpoint-services
// maps.
func (k *nftKube) ports() error {
	byKey := map[string]*ServicePort{}
	if m := k.sets["service-ips"]; m != nil && m.isMap {
		for _, e := range m.elems {
			ip, proto, port, ok := nftPortKey(e.key)
			verdict := strings.Fields(strings.Join(e.value, " "))
			if !ok || len(verdict) != 2 || (verdict[0] != "goto" && verdict[0] != "jump") {
				k.d.Skipped = append(k.d.Skipped, Skipped{Line: e.line, Reason: "service-ips element is not \"IP . PROTO . PORT : goto CHAIN\""})
				continue
			}
			key := strings.Join(e.key, " . ")
			if byKey[key] != nil || k.chains[verdict[1]] == nil {
				continue // reported by load
			}
			sp := &ServicePort{Name: portNameFromChain(verdict[1]), ClusterIP: ip, Port: port, Protocol: proto,
				Chain: verdict[1], Scheduler: "numgen", Exact: true, Endpoints: []*Endpoint{},
				Evidence: []Line{e.line, k.chains[verdict[1]].line}}
			if sp.Name == "" {
				sp.Name = e.comment
			}
			sp.LocalOnly = strings.HasPrefix(verdict[1], nftables.PrefixLocal)
			if strings.HasPrefix(verdict[1], nftables.PrefixExternal) {
				_, sp.ExternalLocal = k.reach(verdict[1])
			}
			if err := k.fill(sp); err != nil {
				return err
			}
			byKey[key] = sp
			k.d.Ports = append(k.d.Ports, sp)
		}
	}
	if m := k.sets["no-endpoint-services"]; m != nil && m.isMap {
		for _, e := range m.elems {
			ip, proto, port, ok := nftPortKey(e.key)
			if !ok {
				k.d.Skipped = append(k.d.Skipped, Skipped{Line: e.line, Reason: "no-endpoint-services element is not \"IP . PROTO . PORT : VERDICT\""})
				continue
			}
			what := ""
			switch v := strings.Join(e.value, " "); {
			case v == "drop":
				what = "DROP"
			case v == "reject" || strings.HasSuffix(v, " reject-chain"):
				what = "REJECT"
			default:
				k.d.Skipped = append(k.d.Skipped, Skipped{Line: e.line, Reason: "no-endpoint-services verdict " + strconv.Quote(v) + " is neither drop nor the reject chain"})
				continue
			}
			key := strings.Join(e.key, " . ")
			sp := byKey[key]
			if sp == nil {
				sp = &ServicePort{Name: e.comment, ClusterIP: ip, Port: port, Protocol: proto, Chain: "no-endpoint-services",
					Scheduler: "numgen", Exact: true, Endpoints: []*Endpoint{}, Evidence: []Line{e.line}}
				byKey[key] = sp
				k.d.Ports = append(k.d.Ports, sp)
			} else {
				sp.Evidence = append(sp.Evidence, e.line)
			}
			sp.NoEndpoints = what
			// kube-proxy drops (rather than rejects) only for a Local
			// traffic policy without a local endpoint.
			if what == "DROP" {
				sp.LocalOnly = true
			}
		}
	}
	return nil
}

// fill finds a port's endpoints (the DNAT targets its chains name, in
// order), their probabilities (the tracer's) and the affinity state. A
// port whose own address is external (an external or load-balancer IP:
// its chain is external-B) is for clients outside the cluster: its
// endpoints are those its chain sends them to (not the short-circuit of
// pod and node traffic) and the trace starts outside the cluster, inside
// the source ranges when it has some.
func (k *nftKube) fill(sp *ServicePort) error {
	outside := strings.HasPrefix(sp.Chain, nftables.PrefixExternal)
	byAddr := map[netip.AddrPort]*Endpoint{}
	var walk func(chain string, depth int)
	add := func(ap netip.AddrPort, chain string, line Line) *Endpoint {
		if ep := byAddr[ap]; ep != nil {
			if ep.Chain == "" {
				ep.Chain = chain
			}
			return ep
		}
		ep := &Endpoint{Addr: ap, Chain: chain, Evidence: line}
		byAddr[ap] = ep
		sp.Endpoints = append(sp.Endpoints, ep)
		return ep
	}
	visited := map[string]bool{}
	walk = func(chain string, depth int) {
		c := k.chains[chain]
		if c == nil || visited[chain] || depth > 8 {
			return
		}
		visited[chain] = true
		endpointChain := ""
		if strings.HasPrefix(chain, nftables.PrefixEndpoint) {
			endpointChain = chain
		}
		for i := range c.rules {
			r := &c.rules[i]
			if k.skipped[r] || (outside && strings.HasPrefix(chain, nftables.PrefixExternal) && strings.Contains(r.text, "saddr")) {
				continue // an external chain's short-circuit of pod and node traffic
			}
			for _, ap := range dnatTargets(r.text) {
				add(ap, endpointChain, r.line)
			}
			for _, target := range chainTargets(r.text) {
				walk(target, depth+1)
			}
		}
	}
	walk(sp.Chain, 0)
	src := k.client
	if outside {
		src = k.outsideSource(sp.ClusterIP, sp.Protocol, sp.Port)
	}
	res, err := k.tracer.Trace(trace.Packet{Src: src, Protocol: sp.Protocol, Dst: sp.ClusterIP, DPort: sp.Port}, nil)
	if err != nil {
		// Rules the tracer reads but cannot follow (a chain that
		// loops, a map value it cannot use): the port's shares are
		// unknown.
		sp.Exact = false
		k.d.Skipped = append(k.d.Skipped, Skipped{Line: sp.Evidence[0],
			Reason: fmt.Sprintf("could not trace a new connection to %s:%d/%s: %v; its shares are unknown", sp.ClusterIP, sp.Port, sp.Protocol, err)})
		k.affinity(sp)
		return nil
	}
	for _, o := range res {
		ap, err := netip.ParseAddrPort(o.Target)
		if err != nil {
			switch o.Target {
			case trace.OutcomeDrop:
				if sp.NoEndpoints == "" && o.P > 0.999 {
					sp.NoEndpoints = "DROP"
				}
			case trace.OutcomeReject:
				if sp.NoEndpoints == "" && o.P > 0.999 {
					sp.NoEndpoints = "REJECT"
				}
			}
			continue
		}
		ep := byAddr[ap]
		if ep == nil {
			ep = add(ap, "", sp.Evidence[len(sp.Evidence)-1])
		}
		ep.P += o.P
	}
	k.affinity(sp)
	return nil
}

// dnatTargets are the ip:port a rule DNATs to: `dnat to A:P`, or the
// values of an inline `dnat ... map { K : A . P, ... }`.
func dnatTargets(rule string) []netip.AddrPort {
	w := strings.Fields(rule)
	var out []netip.AddrPort
	for i := 0; i < len(w); i++ {
		if w[i] != "dnat" {
			continue
		}
		j := i + 1
		for j < len(w) && w[j] != "to" {
			j++
		}
		if j+1 < len(w) {
			if ap, err := netip.ParseAddrPort(w[j+1]); err == nil {
				out = append(out, ap)
				continue
			}
		}
		// an inline map: "{ 0 : A . P , 1-2 : A . P }"
		for ; j < len(w) && w[j] != "{"; j++ {
		}
		for ; j+4 < len(w) && w[j] != "}"; j++ {
			if w[j] == ":" && w[j+2] == "." {
				a, err1 := netip.ParseAddr(w[j+1])
				port, err2 := strconv.ParseUint(strings.TrimSuffix(w[j+3], ","), 10, 16)
				if err1 == nil && err2 == nil {
					out = append(out, netip.AddrPortFrom(a, uint16(port)))
				}
			}
		}
	}
	return out
}

// chainTargets are the chains a rule jumps or goes to.
func chainTargets(rule string) []string {
	w := strings.Fields(rule)
	var out []string
	for i := 0; i+1 < len(w); i++ {
		if w[i] == "goto" || w[i] == "jump" {
			out = append(out, strings.TrimSuffix(w[i+1], ","))
		}
	}
	return out
}

// affinity reads ClientIP affinity: the service chain's `ip saddr
// @affinity-X goto endpoint-Y` rules, the sets' timeouts and elements.
func (k *nftKube) affinity(sp *ServicePort) {
	c := k.chains[sp.Chain]
	if c == nil {
		return
	}
	byChain := map[string]*Endpoint{}
	for _, ep := range sp.Endpoints {
		if ep.Chain != "" {
			byChain[ep.Chain] = ep
		}
	}
	for i := range c.rules {
		r := &c.rules[i]
		if k.skipped[r] {
			continue
		}
		w := strings.Fields(r.text)
		set, target := "", ""
		for j := 0; j+2 < len(w); j++ {
			if w[j] == "saddr" && strings.HasPrefix(w[j+1], "@"+nftables.PrefixAffinity) {
				set = w[j+1][1:]
			}
			if (w[j] == "goto" || w[j] == "jump") && set != "" {
				target = w[j+1]
			}
		}
		if n := len(w); set != "" && target == "" && n >= 2 && (w[n-2] == "goto" || w[n-2] == "jump") {
			target = w[n-1]
		}
		s := k.sets[set]
		if set == "" || s == nil {
			continue
		}
		if sp.Affinity == nil {
			sp.Affinity = &Affinity{Mechanism: "set", ClientsKnown: true, Evidence: r.line}
		}
		timeout := time.Duration(0)
		if s.timeout != nil {
			timeout = *s.timeout
		}
		if u := k.updateTimeout(target, set); u > 0 {
			timeout = u
		}
		sp.Affinity.Timeout = max(sp.Affinity.Timeout, timeout)
		ep := byChain[target]
		if ep == nil {
			continue
		}
		for _, e := range s.elems {
			if len(e.key) != 1 {
				continue
			}
			a, err := netip.ParseAddr(e.key[0])
			if err != nil {
				continue
			}
			ep.Clients = append(ep.Clients, Client{Addr: a, Expires: e.expires.Truncate(time.Second)})
		}
	}
}

// updateTimeout is the element timeout of the endpoint chain's `update
// @set { ip saddr timeout D }`, 0 when it has none of its own.
func (k *nftKube) updateTimeout(chain, set string) time.Duration {
	c := k.chains[chain]
	if c == nil {
		return 0
	}
	for _, r := range c.rules {
		w := strings.Fields(r.text)
		for j := 0; j+5 < len(w); j++ {
			if w[j] == "update" && w[j+1] == "@"+set && w[j+4] == "timeout" {
				if d, err := parseNFTDuration(strings.TrimSuffix(w[j+5], "}")); err == nil {
					return d
				}
			}
		}
	}
	return 0
}

// counters uses counters a user added to the endpoint chains' DNAT
// rules; Dump.Counters only when every endpoint of every port has one.
func (k *nftKube) counters() {
	all, any := true, false
	for _, sp := range k.d.Ports {
		for _, ep := range sp.Endpoints {
			var found *[2]uint64
			if c := k.chains[ep.Chain]; c != nil {
				for _, r := range c.rules {
					if r.counter != nil && len(dnatTargets(r.text)) > 0 {
						found = r.counter
					}
				}
			}
			if found == nil {
				all = false
				continue
			}
			any = true
			ep.Observed = found[0]
		}
	}
	if any && all {
		k.d.Counters = true
		k.d.CountersWhy = "the endpoint chains' DNAT rules carry counters (not kube-proxy's: someone added them)"
	} else if any {
		k.d.CountersWhy = CountersWhyNFT + "; some endpoint chains carry counters someone added, but not all, so none is used"
		for _, sp := range k.d.Ports {
			for _, ep := range sp.Endpoints {
				ep.Observed = 0
			}
		}
	}
}

// errNotNFTJSON marks JSON that is not an nft listing.
var errNotNFTJSON = errors.New(`expected {"nftables": [...]}`)
