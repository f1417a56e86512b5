// Package dataplane programs the Linux kernel the way kube-proxy does, inside
// network namespaces that each run creates. Each mode (iptables, nftables,
// IPVS) is a Backend in its own package; this package holds what they share:
// the Backend contract, named faults and the sync loop.
//
// Endpoint eligibility is in dataplane/proxy, written from kube-proxy's
// documented behaviour, shared with the simulator's engines (which model the
// subject) and never with the simulator's oracle (sim/oracle): a bug the
// oracle and the subject shared would be invisible to every conformance run.
package dataplane

import (
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Backend programs one node's Service rules. Implementations keep what they
// applied so that a partial sync writes only what changed.
type Backend interface {
	// Sync makes the kernel match st for this backend's node. changed names
	// the service ports changed since the previous Sync; full forces a full
	// rewrite (always true on the first Sync).
	Sync(st *cluster.State, changed []cluster.ServicePortName, full bool) (SyncResult, error)
	// Dump returns the applied ruleset as canonical, sorted text.
	Dump() (string, error)
	// Counters returns the kernel's packet counters mapped to service port
	// and endpoint.
	Counters() ([]Counter, error)
	// Cleanup removes everything the backend installed.
	Cleanup() error
}

// SyncResult describes one sync.
type SyncResult struct {
	Full     bool
	Duration time.Duration
	// Bytes is the size of the restore text or transaction sent.
	Bytes int
	// Lines is the number of rules or objects sent.
	Lines int
	// NoLocalEndpoints counts service ports with Local policy and no local
	// endpoint, by "internal" or "external".
	NoLocalEndpoints map[string]int
}

// Counter is a packet counter for one endpoint of a service port (Endpoint
// empty: the service-level rule, e.g. REJECT or DROP).
type Counter struct {
	ServicePort cluster.ServicePortName
	Endpoint    string // ip:port, or "REJECT"/"DROP"
	Packets     uint64
	Bytes       uint64
}
