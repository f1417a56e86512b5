// Package nftables renders kube-proxy's nftables dataplane for one node from
// the cluster state into knftables transactions, without touching the
// kernel, in two layouts:
//
//   - LayoutKubeProxy is kube-proxy v1.37.2's `ip kube-proxy` table, rule
//     for rule, hashed chain names included: a chain per service port and
//     policy whose endpoints are inline
//     (`dnat ip addr . port to numgen random mod N map { ... }`), endpoint
//     chains and sets only for ClientIP affinity, hairpin masquerade through
//     the hairpin-connections set, stale chains deleted a sync later.
//   - LayoutFast, our own variant, keeps the same observable behaviour without the
//     per-endpoint chains whose verdict-map references make a full load grow
//     superlinearly on the kernel: endpoint choice is
//     `dnat ip to numgen random mod N map @dnat-...`, hairpin masquerade is
//     one set lookup after DNAT, and ClientIP affinity lives in per-endpoint
//     rules of the service chain. See README.md.
//
// Renderer keeps what the kernel took (Commit) so that a partial render
// sends only changed chains and map elements. Backend applies renders
// through a knftables.Interface (the real one inside a node namespace, or
// knftables.Fake in tests). Trace walks a new connection through a Fake's
// state carrying the probability of each outcome, and ParseCountersJSON /
// ParseCountersText map `nft list` counters back to service ports and
// endpoints.
package nftables

import (
	"fmt"

	"github.com/kpsim/kpsim/dataplane"
)

// Layout selects the table layout.
type Layout string

const (
	// LayoutKubeProxy is kube-proxy's layout: the fidelity layout, and the
	// default.
	LayoutKubeProxy Layout = "kube-proxy"
	// LayoutFast is our layout without per-endpoint chains, whose full load
	// grows linearly (see README.md).
	LayoutFast Layout = "fast"
)

// DefaultTable is kube-proxy's table name (family ip).
const DefaultTable = "kube-proxy"

// Config is what the renderer needs besides the cluster state.
type Config struct {
	// NodeConfig is the node, the pod range (kube-proxy's local-traffic
	// detector; the zero ClusterCIDR disables it), the masquerade settings,
	// the faults and the PreferSameTrafficDistribution gate.
	dataplane.NodeConfig
	// Layout is LayoutKubeProxy (default when empty) or LayoutFast.
	Layout Layout
	// Table is the nftables table (family ip); empty means "kube-proxy".
	Table string
	// NoCounters leaves out the fast layout's per-endpoint and per-verdict
	// counters (the `counter` statement of its cascade rules and the
	// `counter` flag of the no-endpoint maps and endpoint maps); with
	// counters on, `nft list` shows what each endpoint received. The
	// kube-proxy layout has none, as kube-proxy.
	NoCounters bool
}

func (c *Config) defaults() error {
	switch c.Layout {
	case "":
		c.Layout = LayoutKubeProxy
	case LayoutKubeProxy, LayoutFast:
	default:
		return fmt.Errorf("unknown nftables layout %q (valid: %s, %s)", c.Layout, LayoutKubeProxy, LayoutFast)
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	c.NodeConfig.Default()
	if err := c.NodeConfig.Validate(); err != nil {
		return err
	}
	return nil
}
