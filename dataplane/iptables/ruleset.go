package iptables

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kpsim/kpsim/dataplane/restore"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Ruleset is one render: the texts to apply and what they hold.
type Ruleset struct {
	// Full reports a full render (every chain written).
	Full bool
	// Restore is the input of `iptables-restore --noflush` (filter, then
	// nat). Declared chains are flushed and rewritten, other chains are
	// kept; stale service chains are declared and then deleted with -X.
	Restore string
	// Jumps is the restore text of the jump rules from the built-in chains
	// (PREROUTING, OUTPUT, POSTROUTING, INPUT, FORWARD) to kube-proxy's
	// chains. kube-proxy inserts them with single iptables calls, only on
	// full syncs and only when missing; with --noflush, built-in chains are
	// not flushed, so apply this text once per namespace, after Restore (it
	// refers to chains that Restore creates). JumpRules gives the same rules
	// as arguments, for an -C/-I check.
	Jumps string
	// IPSetRestore creates the affinity sets of the ipset option, for
	// `ipset restore -exist` before Restore ("" when there are none).
	IPSetRestore string
	// IPSetDestroy destroys stale affinity sets, for `ipset restore` after
	// Restore (a set can only be destroyed once no rule refers to it).
	IPSetDestroy string
	// Lines is the number of lines of Restore.
	Lines int
	// NATRules, NATChains, FilterRules and FilterChains count the whole
	// ruleset (including, in a partial render, the chains left as they were),
	// as kube-proxy's sync_proxy_rules_iptables_total{table} does.
	NATRules, NATChains, FilterRules, FilterChains int
	// Chains maps chain and set names, and service destinations, to service
	// ports and endpoints, for counters.
	Chains *ChainMap
	// NoLocalEndpoints counts the service ports with a Local policy and no
	// local endpoint, by "internal" and "external".
	NoLocalEndpoints map[string]int
	// Stale lists the chains this render deletes; StaleSets the ipsets.
	Stale, StaleSets []string
	// Lingering lists the stale chains a large-cluster render leaves in
	// place, rules and all (Config.StaleChainPeriod); a later render
	// deletes them. lingering maps them to their service ports.
	Lingering []string
	lingering map[string]cluster.ServicePortName

	// outs is what each service port contributed (the renderer's cache),
	// gen the renderer's count of this render.
	outs map[cluster.ServicePortName]*svcOut
	gen  uint64
}

// ChainRef says what a chain or set belongs to.
type ChainRef struct {
	ServicePort cluster.ServicePortName
	// Endpoint is "ip:port" for SEP chains and AFF sets, else "".
	Endpoint string
	// Kind is the name's prefix (PrefixSVC, PrefixSEP, ...).
	Kind string
}

// ChainMap maps rendered names back to service ports and endpoints. Its
// index is built on first use (counters are read far less often than rules
// are rendered); it is safe for concurrent use.
type ChainMap struct {
	outs     map[cluster.ServicePortName]*svcOut
	once     sync.Once
	chains   map[string]ChainRef
	services map[string]cluster.ServicePortName
}

func (m *ChainMap) index() {
	m.once.Do(func() {
		n := 0
		for _, o := range m.outs {
			n += o.refs()
		}
		m.chains = make(map[string]ChainRef, n)
		m.services = make(map[string]cluster.ServicePortName, len(m.outs)+len(m.outs)/4)
		for _, o := range m.outs {
			o.index(m.chains, m.services)
		}
	})
}

// Chain says what a KUBE-SVC-/SVL-/EXT-/SEP- chain or a KUBE-AFF- set
// belongs to.
func (m *ChainMap) Chain(name string) (ChainRef, bool) {
	if m == nil {
		return ChainRef{}, false
	}
	m.index()
	r, ok := m.chains[name]
	return r, ok
}

// Service names the service port of a destination key (see ServiceKey): a
// cluster IP and port, or a node port.
func (m *ChainMap) Service(key string) (cluster.ServicePortName, bool) {
	if m == nil {
		return cluster.ServicePortName{}, false
	}
	m.index()
	s, ok := m.services[key]
	return s, ok
}

// Len is the number of chain and set names mapped.
func (m *ChainMap) Len() int {
	if m == nil {
		return 0
	}
	m.index()
	return len(m.chains)
}

// ServiceKey keys a service destination: "tcp 172.30.0.41:80", or
// "tcp *:30001" for a node port (ip "").
func ServiceKey(proto, ip string, port int) string {
	if ip == "" {
		ip = "*"
	}
	return fmt.Sprintf("%s %s:%d", strings.ToLower(proto), ip, port)
}

// AffinityList is the name of the affinity list (recent) or set (ipset) that
// remembers the clients of an endpoint of a service port: what the tracer's
// History is keyed by.
func AffinityList(mode AffinityMode, spn cluster.ServicePortName, endpoint string, timeout int) string {
	if mode == AffinityIPSet {
		return AffinitySet(spn, endpoint, timeout)
	}
	return EndpointChain(spn, endpoint)
}

// JumpRule is one jump from a built-in chain, as iptables arguments.
type JumpRule struct {
	Table string // "nat" or "filter"
	Chain string // the built-in chain
	// Args are the rule's arguments after the chain, for example
	// {"-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}.
	Args []string
}

// JumpRules lists kube-proxy's jumps from the built-in chains
// (iptablesJumpChains, the postrouting jump and kubelet's firewall jumps), in
// the order kube-proxy ensures them; each is inserted at the top of its chain.
func JumpRules() []JumpRule {
	newConn := []string{"-m", "conntrack", "--ctstate", "NEW"}
	j := func(table, chain, comment string, extra []string, target string) JumpRule {
		args := append([]string{}, extra...)
		if comment != "" {
			args = append(args, "-m", "comment", "--comment", comment)
		}
		return JumpRule{Table: table, Chain: chain, Args: append(args, "-j", target)}
	}
	return []JumpRule{
		j("filter", "INPUT", "kubernetes externally-visible service portals", newConn, ChainExternalServices),
		j("filter", "FORWARD", "kubernetes externally-visible service portals", newConn, ChainExternalServices),
		j("filter", "INPUT", "kubernetes health check service ports", nil, ChainNodePorts),
		j("filter", "FORWARD", "kubernetes service portals", newConn, ChainServices),
		j("filter", "OUTPUT", "kubernetes service portals", newConn, ChainServices),
		j("filter", "FORWARD", "kubernetes forwarding rules", nil, ChainForward),
		j("filter", "INPUT", "kubernetes load balancer firewall", newConn, ChainProxyFirewall),
		j("filter", "OUTPUT", "kubernetes load balancer firewall", newConn, ChainProxyFirewall),
		j("filter", "FORWARD", "kubernetes load balancer firewall", newConn, ChainProxyFirewall),
		j("filter", "INPUT", "", nil, ChainKubeletFirewall),
		j("filter", "OUTPUT", "", nil, ChainKubeletFirewall),
		j("nat", "OUTPUT", "kubernetes service portals", nil, ChainServices),
		j("nat", "PREROUTING", "kubernetes service portals", nil, ChainServices),
		j("nat", "POSTROUTING", "kubernetes postrouting rules", nil, ChainPostrouting),
	}
}

// jumpRestore renders JumpRules as restore text, with the declaration of
// ChainCanary in each of CanaryTables (kube-proxy's monitor creates the
// canaries before the first sync). Rules are appended in the order
// kube-proxy would have inserted them at the top, so that in a fresh
// namespace the built-in chains end up as kube-proxy leaves them.
func (r *Renderer) jumpRestore() string {
	var b strings.Builder
	rules := JumpRules()
	for _, table := range []string{"filter", "mangle", "nat"} {
		b.WriteString("*" + table + "\n")
		if slices.Contains(CanaryTables, table) {
			b.WriteString(chainLine(ChainCanary) + "\n")
		}
		// Each kube-proxy insert goes to position 1, so the last one
		// ensured comes first: append in reverse order.
		for i := len(rules) - 1; i >= 0; i-- {
			if rules[i].Table != table {
				continue
			}
			b.WriteString("-A " + rules[i].Chain + " " + restore.JoinArgs(rules[i].Args) + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
