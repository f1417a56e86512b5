package dataplane

import (
	"fmt"
	"net/netip"

	"github.com/kpsim/kpsim/dataplane/proxy"
)

// DefaultMasqueradeBit is kube-proxy's --iptables-masquerade-bit: the mark
// 0x4000.
const DefaultMasqueradeBit = 14

// NodeConfig is what every backend needs to know about its node and the
// cluster besides the cluster state. Each backend's Config embeds it, and
// its own defaults call Default and Validate.
type NodeConfig struct {
	// NodeName is the node whose rules are programmed (it decides which
	// endpoints are local).
	NodeName string
	// ClusterCIDR is the cluster's pod range, kube-proxy's local-traffic
	// detector: traffic to a cluster IP from outside it is masqueraded (the
	// iptables and nftables layouts also short-circuit pod traffic to
	// external destinations). The zero value disables the detector.
	ClusterCIDR netip.Prefix
	// ServiceCIDRs are the cluster's service ranges (the scenario's
	// cluster.serviceCIDR; kube-proxy reads them from the ServiceCIDR
	// objects): nftables mode drops traffic to an address in them that is
	// no Service's cluster IP. Empty: no such rule.
	ServiceCIDRs []netip.Prefix
	// NodeIPs are the node's own addresses that accept node port traffic
	// (kube-proxy's default --nodeport-addresses=primary in nftables mode:
	// the node IP). Empty: every local address but loopback.
	NodeIPs []netip.Addr
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeBit is the bit of the masquerade mark (0: 14, mark 0x4000).
	MasqueradeBit int
	// Faults are the named faults to build in (nil: none).
	Faults proxy.Faults
	// PreferSameNode turns on the PreferSameTrafficDistribution gate for
	// topology hints (off by default, as in kube-proxy v1.33).
	PreferSameNode bool
}

// Default fills the zero fields that have a default: MasqueradeBit.
func (c *NodeConfig) Default() {
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = DefaultMasqueradeBit
	}
}

// Validate checks the fields after Default: a masquerade bit in 0..31 and an
// IPv4 cluster CIDR, service CIDRs and node IPs (these backends are IPv4
// only).
func (c *NodeConfig) Validate() error {
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("masquerade bit %d is outside 0..31", c.MasqueradeBit)
	}
	if c.ClusterCIDR.IsValid() && !c.ClusterCIDR.Addr().Is4() {
		return fmt.Errorf("cluster CIDR %s is not IPv4", c.ClusterCIDR)
	}
	for _, p := range c.ServiceCIDRs {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("service CIDR %s is not IPv4", p)
		}
	}
	for _, a := range c.NodeIPs {
		if !a.Is4() {
			return fmt.Errorf("node IP %s is not IPv4", a)
		}
	}
	return nil
}
