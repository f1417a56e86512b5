// Package ipvs is kube-proxy's IPVS mode (pkg/proxy/ipvs/proxier.go, about
// v1.33) behind the dataplane.Backend interface: one IPVS virtual server per
// ClusterIP service port (and per node address and node port), one real
// server per endpoint, the service addresses bound to the kube-ipvs0 dummy
// device, kube-proxy's ipsets and its small constant set of iptables rules,
// and its sysctls, all inside one node's network namespace.
//
// The package is split the way the iptables backend is: Render is pure and
// turns the cluster state into a Plan (virtual servers, addresses, ipset
// entries, iptables-restore text); Backend reconciles the kernel with a Plan
// through two small interfaces, Interface (the IPVS netlink calls of
// github.com/moby/ipvs, kube-proxy's library) and System (the dummy device,
// ipset and iptables-restore, sysctls). Both have behavioural fakes (Fake,
// FakeSystem), so every rule of the reconciliation, graceful termination
// included, is unit-tested without a kernel. See README.md.
package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// DummyDevice is the dummy link that holds every service address, so that
// the kernel treats them as local and IPVS sees the packets on LOCAL_IN
// (kube-proxy's defaultDummyDevice).
const DummyDevice = "kube-ipvs0"

// Schedulers IPVS supports and kube-proxy accepts (mh since v1.30 with
// FlagSourceHash).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "sed", "nq", "sh", "dh", "mh"}

// DefaultScheduler is kube-proxy's: round robin.
const DefaultScheduler = "rr"

// Service flags, as kube-proxy's utilipvs names them (include/uapi/linux/
// ip_vs.h: IP_VS_SVC_F_*).
const (
	// FlagPersistent is IP_VS_SVC_F_PERSISTENT: ClientIP affinity, with the
	// persistence timeout in Service.Timeout (`ipvsadm -p`).
	FlagPersistent uint32 = 0x1
	// FlagHashed is IP_VS_SVC_F_HASHED, which the kernel sets on every
	// service in its table; it is masked out when comparing.
	FlagHashed uint32 = 0x2
	// FlagSourceHash is IP_VS_SVC_F_SCHED2 (IP_VS_SVC_F_SCHED_MH_PORT):
	// with mh, hash the source port as well as the source address.
	// kube-proxy sets it for mh only.
	FlagSourceHash uint32 = 0x10
)

// Variants of the iptables userland used for the constant rules.
const (
	VariantNFT    = "nft"
	VariantLegacy = "legacy"
)

// noTimeout is the persistence timeout the affinity-no-timeout fault
// programs: 180 days. The kernel multiplies the timeout by HZ in 32 bits
// (ip_vs_ctl.c), so it must stay below 2^32/1000 s; kube-proxy's own
// maximum is 86400 s.
const noTimeout = 180 * 24 * 3600

// Config is what the backend needs besides the cluster state.
type Config struct {
	// NodeConfig is the node, the pod range (kube-proxy's local-traffic
	// detector; the zero ClusterCIDR disables it), the masquerade settings,
	// the faults and the PreferSameTrafficDistribution gate.
	dataplane.NodeConfig
	// Scheduler is the IPVS scheduler of every virtual server ("" is rr).
	Scheduler string
	// IPTablesVariant is "nft" (default) or "legacy": which iptables
	// userland applies the constant rules.
	IPTablesVariant string
	// NodeIPs are the node's own addresses: a node port gets one virtual
	// server per address. Empty: node ports are not programmed.
	NodeIPs []netip.Addr
	// TCPTimeout, TCPFinTimeout and UDPTimeout are `ipvsadm --set`
	// (kube-proxy's --ipvs-tcp-timeout, ...); zero keeps the kernel's.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
	// GracefulCheckPeriod is how often real servers kept at weight 0 are
	// checked for remaining connections (kube-proxy's
	// rsCheckDeleteInterval, one minute); they are also checked at every
	// sync. Negative: only at syncs.
	GracefulCheckPeriod time.Duration
	// StatsWait bounds how long Counters waits for the kernel's 2-second
	// stats estimator to publish the latest packets (0: 2.2 s).
	StatsWait time.Duration
}

func (c *Config) defaults() error {
	if c.Scheduler == "" {
		c.Scheduler = DefaultScheduler
	}
	if !slices.Contains(Schedulers, c.Scheduler) {
		return fmt.Errorf("unknown ipvs scheduler %q (valid: %v)", c.Scheduler, Schedulers)
	}
	switch c.IPTablesVariant {
	case "":
		c.IPTablesVariant = VariantNFT
	case VariantNFT, VariantLegacy:
	default:
		return fmt.Errorf("unknown iptables backend %q (nft or legacy)", c.IPTablesVariant)
	}
	c.NodeConfig.Default()
	if err := c.NodeConfig.Validate(); err != nil {
		return err
	}
	for _, a := range c.NodeIPs {
		if !a.Is4() {
			return fmt.Errorf("node address %s is not IPv4", a)
		}
	}
	if c.GracefulCheckPeriod == 0 {
		c.GracefulCheckPeriod = time.Minute
	}
	if c.StatsWait == 0 {
		c.StatsWait = 2200 * time.Millisecond
	}
	return c.buildableFaults()
}

// hashSchedulers give each client address a fixed real server from a table
// (ip_vs_sh.c: 256 slots in blocks of each weight; ip_vs_dh.c: slots by
// destination address, weights ignored; ip_vs_mh.c: a permutation table of
// 251 or more slots), so a weight sets a share of client addresses, rounded
// to the table, not of connections.
var hashSchedulers = []string{"sh", "dh", "mh"}

// buildableFaults refuses the faults IPVS cannot build: per-client
// affinity faults (dataplane metadata) and skew-at-mde with a hash
// scheduler.
func (c *Config) buildableFaults() error {
	if err := c.Faults.CheckModes(cluster.ModeIPVS); err != nil {
		return err
	}
	if c.Faults.Has(proxy.FaultSkewAtMDE) && slices.Contains(hashSchedulers, c.Scheduler) {
		return proxy.NotBuiltError(proxy.FaultSkewAtMDE, cluster.ModeIPVS, fmt.Sprintf(
			"scheduler %s maps each client address to a real server through a hash table, so weights cannot raise one share by exactly %g (use rr, wrr, lc, wlc, sed or nq)",
			c.Scheduler, proxy.SkewMDE))
	}
	return nil
}

// schedulerFor is the scheduler a virtual server is programmed with. The
// uniform-probability fault gives the last real server weight 2, and
// skew-at-mde weights the first one up (proxy.MDESkewWeights); rr and lc
// ignore weights (ip_vs_rr.c and ip_vs_lc.c only skip weight 0), so these
// faults also swap them for their weighted twins, wrr and wlc, to make the
// weights count.
func (c *Config) schedulerFor() string {
	if c.Faults.Has(proxy.FaultUniformProbability) || c.Faults.Has(proxy.FaultSkewAtMDE) {
		switch c.Scheduler {
		case "rr":
			return "wrr"
		case "lc":
			return "wlc"
		}
	}
	return c.Scheduler
}

// masqMark is the mark as kube-proxy prints it in the IPVS rules ("0x4000").
func (c *Config) masqMark() string { return fmt.Sprintf("%#x", 1<<uint(c.MasqueradeBit)) }
