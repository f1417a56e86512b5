// Package iptables renders kube-proxy's iptables layout for one node from the
// cluster state, as iptables-restore input, without touching the kernel; it
// also holds a behavioural fake of the nat and filter tables, a tracer that
// walks a NEW connection through them with its probabilities, and the parser
// that maps iptables-save counters back to service ports and endpoints.
//
// The layout is kube-proxy's (pkg/proxy/iptables/proxier.go, v1.37.2),
// limits included: a `recent` list per endpoint for ClientIP affinity holds at
// most 100 clients. Beside it, AffinityIPSet is an option of our own that keeps
// affinity in ipset hash:ip sets with per-entry timeouts instead. See README.md
// for the chain flow and the faults.
//
// The Backend that applies a Ruleset to a kernel lives elsewhere; it calls
// Renderer.Render, runs iptables-restore --noflush (and ipset restore), and
// calls Renderer.Commit when the kernel took it.
package iptables

import (
	"fmt"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/sim/cluster"
)

// AffinityMode chooses how ClientIP session affinity is programmed.
type AffinityMode string

const (
	// AffinityRecent is kube-proxy's layout: one `recent` list per endpoint
	// chain, checked with --rcheck --seconds T --reap and refreshed with
	// --set. A list holds at most ip_list_tot (100) addresses.
	AffinityRecent AffinityMode = "recent"
	// AffinityIPSet is our option: one ipset hash:ip set with timeout per
	// endpoint, matched with -m set --match-set and refreshed with
	// -j SET --add-set ... --exist --timeout T. No 100-client limit.
	AffinityIPSet AffinityMode = "ipset"
)

// DefaultLargeClusterThreshold is kube-proxy's
// largeClusterEndpointsThreshold: above this many endpoints, the
// per-endpoint comments are left out.
const DefaultLargeClusterThreshold = cluster.LargeClusterEndpoints

// Config is what the renderer needs besides the cluster state.
type Config struct {
	// NodeConfig is the node, the pod range (the zero ClusterCIDR means no
	// local-traffic rule and no pod short-circuit in KUBE-EXT chains), the
	// masquerade settings and the faults.
	dataplane.NodeConfig
	// Affinity is AffinityRecent (default when empty) or AffinityIPSet.
	Affinity AffinityMode
	// LargeClusterThreshold is the endpoint count above which per-endpoint
	// comments are dropped (0: 1000; negative: never).
	LargeClusterThreshold int
	// ConntrackTCPLiberal reports nf_conntrack_tcp_be_liberal=1, which makes
	// kube-proxy leave out its INVALID-state DROP rule.
	ConntrackTCPLiberal bool
	// StaleChainPeriod is how long, in large-cluster mode, stale service
	// chains are left in place (not flushed, still holding their rules)
	// before a render deletes them: kube-proxy skips its iptables-save and
	// the deletion unless syncPeriod has passed since the last one (0: 30 s,
	// kube-proxy's default --iptables-sync-period; negative: delete on every
	// render). Not applied with AffinityIPSet, whose stale sets cannot be
	// destroyed while a chain still matches them.
	StaleChainPeriod time.Duration
	// Now is the renderer's clock (nil: time.Now).
	Now func() time.Time
}

// DefaultStaleChainPeriod is kube-proxy's default syncPeriod.
const DefaultStaleChainPeriod = 30 * time.Second

func (c *Config) defaults() error {
	switch c.Affinity {
	case "":
		c.Affinity = AffinityRecent
	case AffinityRecent, AffinityIPSet:
	default:
		return fmt.Errorf("unknown affinity mode %q (valid: %s, %s)", c.Affinity, AffinityRecent, AffinityIPSet)
	}
	if c.LargeClusterThreshold == 0 {
		c.LargeClusterThreshold = DefaultLargeClusterThreshold
	}
	if c.StaleChainPeriod == 0 {
		c.StaleChainPeriod = DefaultStaleChainPeriod
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.NodeConfig.Default()
	return c.NodeConfig.Validate()
}
