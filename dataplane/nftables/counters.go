package nftables

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Where the counters are:
//   - kube-proxy layout: the `counter` of each endpoint chain's DNAT rule
//     counts the new connections sent to that endpoint (a connection's
//     first packet is the only one that traverses nat chains);
//   - fast layout: each element of an endpoint map counts the connections
//     its bucket sent; a service port in cascade mode (affinity) has a
//     `counter` in each per-endpoint rule of its chains;
//   - both: each element of no-endpoint-services and no-endpoint-nodeports
//     counts the connections rejected or dropped for that destination.

// Refs maps the table's objects back to service ports and endpoints.
type Refs struct {
	// Chains maps each service port's own chains (policy, external and
	// endpoint chains) to it.
	Chains map[string]cluster.ServicePortName
	// Elements maps the counted elements to their service port, keyed by
	// map name, a space, and the element key without the fast layout's
	// bucket ("no-endpoint-services 172.30.0.46 . tcp . 80",
	// "cluster-ip-endpoints-tcp 172.30.0.41 . tcp . 80").
	Elements map[string]cluster.ServicePortName
}

// countedMap reports whether a map's elements are counters this package
// reads, and whether their keys end with a bucket.
func countedMap(name string) (counted, bucket bool) {
	switch {
	case name == MapNoEndpointServices || name == MapNoEndpointNodePorts:
		return true, false
	case strings.Contains(name, "-endpoints-"):
		return true, true
	}
	return false, false
}

// Refs returns the references of the committed table.
func (r *Renderer) Refs() Refs {
	refs := Refs{Chains: map[string]cluster.ServicePortName{}, Elements: map[string]cluster.ServicePortName{}}
	if r.committed == nil {
		return refs
	}
	for spn, rec := range r.committed.services {
		for _, c := range rec.chains {
			refs.Chains[c.name] = spn
		}
		for _, s := range rec.shared {
			counted, bucket := countedMap(s.container)
			if !counted {
				continue
			}
			key := s.key
			if bucket {
				key = key[:len(key)-1]
			}
			refs.Elements[s.container+" "+strings.Join(key, " . ")] = spn
		}
	}
	return refs
}

// element adds one counted element: its map, key parts and value (an
// endpoint address and port, or a verdict).
func (c counts) element(refs Refs, mapName string, key []string, value string, pk, by uint64) {
	counted, bucket := countedMap(mapName)
	if !counted || len(key) == 0 {
		return
	}
	if bucket {
		key = key[:len(key)-1]
	}
	spn, ok := refs.Elements[mapName+" "+strings.Join(key, " . ")]
	if !ok {
		return
	}
	if !bucket {
		c.add(spn, verdictTarget(value), pk, by)
		return
	}
	ip, port, _ := strings.Cut(strings.TrimSpace(value), " . ")
	if ep := joinEndpoint(ip, port); ep != "" {
		c.add(spn, ep, pk, by)
	}
}

// counts sums counters by service port and endpoint.
type counts map[[2]string]*dataplane.Counter

func (c counts) add(spn cluster.ServicePortName, ep string, pk, by uint64) {
	k := [2]string{spn.String() + "/" + string(spn.Protocol), ep}
	x := c[k]
	if x == nil {
		x = &dataplane.Counter{ServicePort: spn, Endpoint: ep}
		c[k] = x
	}
	x.Packets += pk
	x.Bytes += by
}

func (c counts) sorted() []dataplane.Counter {
	out := make([]dataplane.Counter, 0, len(c))
	for _, x := range c {
		out = append(out, *x)
	}
	dataplane.SortCounters(out)
	return out
}

// verdictTarget names a no-endpoint verdict as a counter's endpoint.
func verdictTarget(v string) string {
	if strings.Contains(v, ChainReject) || strings.Contains(v, "reject") {
		return trace.OutcomeReject
	}
	return trace.OutcomeDrop
}

// ParseCountersJSON maps the counters of `nft -j list table ip <table>` to
// service ports and endpoints, sorted. Objects it cannot map are skipped.
func ParseCountersJSON(data []byte, refs Refs) ([]dataplane.Counter, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("could not parse nft json output: %w", err)
	}
	type counter struct {
		Packets uint64 `json:"packets"`
		Bytes   uint64 `json:"bytes"`
	}
	c := counts{}
	for _, obj := range doc.Nftables {
		if raw, ok := obj["rule"]; ok {
			var rl struct {
				Chain string                       `json:"chain"`
				Expr  []map[string]json.RawMessage `json:"expr"`
			}
			if err := json.Unmarshal(raw, &rl); err != nil {
				return nil, fmt.Errorf("could not parse nft json rule: %w", err)
			}
			spn, ok := refs.Chains[rl.Chain]
			if !ok {
				continue
			}
			var cnt *counter
			ep := ""
			for _, e := range rl.Expr {
				if v, ok := e["counter"]; ok {
					cnt = &counter{}
					if err := json.Unmarshal(v, cnt); err != nil {
						return nil, fmt.Errorf("could not parse nft json counter: %w", err)
					}
				}
				if v, ok := e["dnat"]; ok {
					var d struct {
						Addr any `json:"addr"`
						Port any `json:"port"`
					}
					if err := json.Unmarshal(v, &d); err == nil {
						if a, ok := d.Addr.(string); ok {
							ep = joinEndpoint(a, fmt.Sprint(d.Port))
						}
					}
				}
			}
			if cnt != nil && ep != "" {
				c.add(spn, ep, cnt.Packets, cnt.Bytes)
			}
			continue
		}
		raw, ok := obj["map"]
		if !ok {
			continue
		}
		var m struct {
			Name string              `json:"name"`
			Elem [][]json.RawMessage `json:"elem"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("could not parse nft json map: %w", err)
		}
		if counted, _ := countedMap(m.Name); !counted {
			continue
		}
		for _, pair := range m.Elem {
			if len(pair) != 2 {
				continue
			}
			var key struct {
				Elem *struct {
					Val     json.RawMessage `json:"val"`
					Counter *counter        `json:"counter"`
				} `json:"elem"`
			}
			if err := json.Unmarshal(pair[0], &key); err != nil || key.Elem == nil || key.Elem.Counter == nil {
				continue
			}
			var k struct {
				Concat []any `json:"concat"`
			}
			if err := json.Unmarshal(key.Elem.Val, &k); err != nil {
				continue
			}
			parts := make([]string, len(k.Concat))
			for i, p := range k.Concat {
				parts[i] = fmt.Sprint(p)
			}
			value := string(pair[1])
			var v struct {
				Concat []any `json:"concat"`
			}
			if err := json.Unmarshal(pair[1], &v); err == nil && len(v.Concat) == 2 {
				value = fmt.Sprintf("%v . %v", v.Concat[0], v.Concat[1])
			}
			c.element(refs, m.Name, parts, value, key.Elem.Counter.Packets, key.Elem.Counter.Bytes)
		}
	}
	return c.sorted(), nil
}

func joinEndpoint(ip, port string) string {
	a, err := netip.ParseAddr(strings.TrimSpace(ip))
	if err != nil {
		return ""
	}
	p, err := strconv.ParseUint(strings.TrimSpace(port), 10, 16)
	if err != nil {
		return ""
	}
	return netip.AddrPortFrom(a, uint16(p)).String()
}

var (
	counterRE  = regexp.MustCompile(`counter packets (\d+) bytes (\d+)`)
	dnatToRE   = regexp.MustCompile(`dnat (?:ip )?to (\d+\.\d+\.\d+\.\d+):(\d+)`)
	blockRE    = regexp.MustCompile(`^\s*(chain|map|set) (\S+) \{\s*$`)
	commentRE  = regexp.MustCompile(` comment "(?:[^"\\]|\\.)*"`)
	elementsRE = regexp.MustCompile(`^\s*elements = \{(.*)$`)
)

// ParseCountersText maps the counters of `nft list table ip <table>` to
// service ports and endpoints, sorted. Objects it cannot map are skipped.
func ParseCountersText(text string, refs Refs) []dataplane.Counter {
	c := counts{}
	lines := strings.Split(text, "\n")
	kind, name := "", ""
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := blockRE.FindStringSubmatch(line); m != nil {
			kind, name = m[1], m[2]
			continue
		}
		if strings.TrimSpace(line) == "}" {
			kind, name = "", ""
			continue
		}
		switch kind {
		case "chain":
			spn, ok := refs.Chains[name]
			if !ok {
				continue
			}
			cm := counterRE.FindStringSubmatch(line)
			dm := dnatToRE.FindStringSubmatch(line)
			if cm == nil || dm == nil {
				continue
			}
			pk, _ := strconv.ParseUint(cm[1], 10, 64)
			by, _ := strconv.ParseUint(cm[2], 10, 64)
			if ep := joinEndpoint(dm[1], dm[2]); ep != "" {
				c.add(spn, ep, pk, by)
			}
		case "map":
			m := elementsRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			body := m[1]
			for !strings.HasSuffix(strings.TrimSpace(body), "}") && i+1 < len(lines) {
				i++
				body += " " + strings.TrimSpace(lines[i])
			}
			body = strings.TrimSuffix(strings.TrimSpace(body), "}")
			body = commentRE.ReplaceAllString(body, "")
			textMapElements(c, name, body, refs)
		}
	}
	return c.sorted()
}

func textMapElements(c counts, mapName, body string, refs Refs) {
	if counted, _ := countedMap(mapName); !counted {
		return
	}
	for _, item := range strings.Split(body, ",") {
		key, value, ok := strings.Cut(item, " : ")
		if !ok {
			continue
		}
		cm := counterRE.FindStringSubmatch(key)
		if cm == nil {
			continue
		}
		pk, _ := strconv.ParseUint(cm[1], 10, 64)
		by, _ := strconv.ParseUint(cm[2], 10, 64)
		c.element(refs, mapName, splitKey(counterRE.ReplaceAllString(key, "")), value, pk, by)
	}
}

// splitKey splits "a . b . c" into its parts.
func splitKey(s string) []string {
	parts := strings.Split(strings.TrimSpace(s), " . ")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// ParseCountersDump maps a knftables.Fake dump (which has no counter
// values) to zero counters for every endpoint and verdict element: the
// shape of Counters without a kernel.
func ParseCountersDump(dump string, refs Refs) []dataplane.Counter {
	c := counts{}
	counted := map[string]bool{} // maps declared with a counter per element
	for _, line := range strings.Split(dump, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && f[0] == "add" && f[1] == "map":
			counted[f[4]] = strings.Contains(line, "; counter ;")
		case len(f) >= 5 && f[0] == "add" && f[1] == "rule":
			spn, ok := refs.Chains[f[4]]
			if !ok || !strings.Contains(line, " counter ") {
				continue
			}
			if dm := dnatToRE.FindStringSubmatch(line); dm != nil {
				if ep := joinEndpoint(dm[1], dm[2]); ep != "" {
					c.add(spn, ep, 0, 0)
				}
			}
		case len(f) >= 5 && f[0] == "add" && f[1] == "element" && counted[f[4]]:
			open, end := strings.Index(line, "{"), strings.LastIndex(line, "}")
			if open < 0 || end < open {
				continue
			}
			body := line[open+1 : end]
			body = commentRE.ReplaceAllString(body, "")
			key, value, ok := strings.Cut(body, " : ")
			if !ok {
				continue
			}
			c.element(refs, f[4], splitKey(key), value, 0, 0)
		}
	}
	return c.sorted()
}
