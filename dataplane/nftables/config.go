// Package nftables renders kube-proxy's nftables dataplane for one node from
// the cluster state into knftables transactions, without touching the
// kernel, in two layouts:
//
//   - LayoutKubeProxy is kube-proxy's `ip kube-proxy` table (about v1.31:
//     partial sync, cluster-ips), hashed chain names included: a chain per
//     service port and policy, a chain per endpoint reached through an
//     anonymous `numgen random mod N vmap`, per-endpoint affinity sets.
//   - LayoutFast keeps the same observable behaviour without the
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
	"net/netip"

	"github.com/kpsim/kpsim/dataplane/proxy"
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

// Defaults, as kube-proxy's.
const (
	// DefaultTable is kube-proxy's table name (family ip).
	DefaultTable = "kube-proxy"
	// DefaultMasqueradeBit gives the mark 0x4000.
	DefaultMasqueradeBit = 14
)

// Config is what the renderer needs besides the cluster state.
type Config struct {
	// NodeName is the node whose rules are rendered (it decides which
	// endpoints are local).
	NodeName string
	// Layout is LayoutKubeProxy (default when empty) or LayoutFast.
	Layout Layout
	// Table is the nftables table (family ip); empty means "kube-proxy".
	Table string
	// ClusterCIDR is the pod range, kube-proxy's local-traffic detector:
	// traffic to a cluster IP from outside it is masqueraded, and pod
	// traffic to external destinations is short-circuited. The zero value
	// disables the detector.
	ClusterCIDR netip.Prefix
	// ServiceCIDRs, when set, add kube-proxy's "drop traffic to unallocated
	// ClusterIPs" rule to cluster-ips-check.
	ServiceCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeBit is the bit of the masquerade mark (0: 14, mark 0x4000).
	MasqueradeBit int
	// Faults are the named faults to build in (nil: none).
	Faults proxy.Faults
	// PreferSameNode turns on the PreferSameTrafficDistribution gate.
	PreferSameNode bool
	// NoCounters leaves out the per-endpoint and per-verdict counters (the
	// `counter` statement of endpoint DNAT rules and the `counter` flag of
	// the no-endpoint maps and DNAT maps). kube-proxy has none; with
	// counters on, `nft list` shows what each endpoint received.
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
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = DefaultMasqueradeBit
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("masquerade bit %d is outside 0..31", c.MasqueradeBit)
	}
	if c.ClusterCIDR.IsValid() && !c.ClusterCIDR.Addr().Is4() {
		return fmt.Errorf("cluster CIDR %s is not IPv4", c.ClusterCIDR)
	}
	for _, p := range c.ServiceCIDRs {
		if !p.Addr().Is4() {
			return fmt.Errorf("service CIDR %s is not IPv4", p)
		}
	}
	return nil
}
