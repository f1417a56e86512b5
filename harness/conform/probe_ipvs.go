package conform

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// In IPVS mode the node namespace's conntrack count does not measure new
// connections: IPVS deletes a connection's conntrack entry when its own
// entry expires, 10 s after the backend's reset (CLOSE; IPVS has no knob for
// that timeout), and a block of 30,000 probes takes longer than that in the
// microVM. Measured there (Debian 6.1, TCG, about 2,800 probes/s): 6,000 to
// 12,000 entries left after blocks of 30,807 probes that all arrived, with
// the conntrack timeouts held at 600 s. IPVS's own total of scheduled
// connections (/proc/net/ip_vs_stats, per namespace, never decreasing) is
// what counts there: a probe that follows a live IPVS connection is not
// scheduled and not counted; a probe on a closed one is rescheduled
// (conn_reuse_mode) and counted.
const counterIPVS = "IPVS scheduled connections (/proc/net/ip_vs_stats)"

// ipvsStatsWait bounds the wait for the IPVS estimator: the kernel (6.1)
// folds the per-CPU counters into the exported totals every 2 s.
var ipvsStatsWait = timeScaled(5 * time.Second)

// usesIPVS reports whether a node namespace has IPVS virtual services.
// /proc/net follows the process's namespace; /proc/thread-self/net that of
// the thread Do switched.
func usesIPVS(ns *netns.Namespace) bool {
	var b []byte
	err := ns.Do(func() (err error) { b, err = os.ReadFile("/proc/thread-self/net/ip_vs"); return })
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "TCP ") || strings.HasPrefix(l, "UDP ") || strings.HasPrefix(l, "SCTP ") || strings.HasPrefix(l, "FWM ") {
			return true
		}
	}
	return false
}

// ipvsConns reads the namespace's total of connections IPVS scheduled.
func ipvsConns(ns *netns.Namespace) (int64, error) {
	var b []byte
	if err := ns.Do(func() (err error) { b, err = os.ReadFile("/proc/thread-self/net/ip_vs_stats"); return }); err != nil {
		return 0, fmt.Errorf("could not read /proc/net/ip_vs_stats: %w", err)
	}
	return parseIPVSStats(string(b))
}

// parseIPVSStats takes the total connections (hexadecimal, first column of
// the third line) from /proc/net/ip_vs_stats:
//
//	Total Incoming Outgoing         Incoming         Outgoing
//	Conns  Packets  Packets            Bytes            Bytes
//	  4A      1F4        0             1E78                0
func parseIPVSStats(s string) (int64, error) {
	lines := strings.Split(s, "\n")
	if len(lines) < 3 || !strings.Contains(lines[1], "Conns") {
		return 0, fmt.Errorf("unexpected /proc/net/ip_vs_stats: %q", s)
	}
	f := strings.Fields(lines[2])
	if len(f) == 0 {
		return 0, fmt.Errorf("unexpected /proc/net/ip_vs_stats: %q", s)
	}
	n, err := strconv.ParseInt(f[0], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("could not parse the connection total %q of /proc/net/ip_vs_stats: %w", f[0], err)
	}
	return n, nil
}
