package iptables

import (
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/restore"
	"github.com/kpsim/kpsim/sim/cluster"
)

// ParseCounters maps the per-rule counters of `iptables-save -c` output back
// to service ports and endpoints:
//   - the DNAT rule of each KUBE-SEP- chain counts the new connections sent to
//     that endpoint (only a connection's first packet traverses nat);
//   - the REJECT and DROP rules of filter KUBE-SERVICES and
//     KUBE-EXTERNAL-SERVICES count the connections refused for a service port
//     (Endpoint "REJECT" or "DROP").
//
// Rules it cannot map (other chains, or chains and destinations missing from
// m) are skipped. The result is sorted by service port, then endpoint.
// iptables-save writes rules in its own order (-s/-d/-p first, /32 prefixes);
// the parser does not depend on it.
func ParseCounters(save string, m *ChainMap) []dataplane.Counter {
	type key struct {
		spn cluster.ServicePortName
		ep  string
	}
	sum := map[key]*dataplane.Counter{}
	add := func(spn cluster.ServicePortName, ep string, pk, by uint64) {
		k := key{spn, ep}
		c := sum[k]
		if c == nil {
			c = &dataplane.Counter{ServicePort: spn, Endpoint: ep}
			sum[k] = c
		}
		c.Packets += pk
		c.Bytes += by
	}
	table := ""
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "*") {
			table = line[1:]
			continue
		}
		if !strings.HasPrefix(line, "[") {
			continue
		}
		end := strings.IndexByte(line, ']')
		if end < 0 {
			continue
		}
		pk, by, ok := parsePair(line[1:end])
		if !ok {
			continue
		}
		args, err := restore.Tokenize(line[end+1:])
		if err != nil || len(args) < 2 || args[0] != "-A" {
			continue
		}
		chain, rest := args[1], args[2:]
		target := argAfter(rest, "-j")
		switch {
		case table == "nat" && strings.HasPrefix(chain, PrefixSEP) && target == "DNAT":
			if ref, ok := m.Chain(chain); ok {
				add(ref.ServicePort, ref.Endpoint, pk, by)
			}
		case table == "filter" && (chain == ChainServices || chain == ChainExternalServices) && (target == "REJECT" || target == "DROP"):
			proto := argAfter(rest, "-p")
			port, _ := strconv.Atoi(argAfter(rest, "--dport"))
			ip := ""
			if d := argAfter(rest, "-d"); d != "" {
				if p, err := parsePrefix(d); err == nil {
					ip = p.Addr().String()
				}
			}
			if spn, ok := m.Service(ServiceKey(proto, ip, port)); ok {
				add(spn, target, pk, by)
			}
		}
	}
	out := make([]dataplane.Counter, 0, len(sum))
	for _, c := range sum {
		out = append(out, *c)
	}
	dataplane.SortCounters(out)
	return out
}

func parsePair(s string) (uint64, uint64, bool) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, false
	}
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return x, y, err1 == nil && err2 == nil
}

// argAfter is the value following flag (not negated) in args, or "".
func argAfter(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag && (i == 0 || args[i-1] != "!") {
			return args[i+1]
		}
	}
	return ""
}
