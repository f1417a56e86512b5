package dataplane

import (
	"slices"

	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// SortCounters orders counters by service port (cluster.CompareNames), then
// endpoint: endpoints "ip:port" by address and port, then the verdicts
// ("DROP", "REJECT") by name (trace.CompareTarget). Every backend's Counters
// returns this order.
func SortCounters(cs []Counter) {
	slices.SortFunc(cs, func(a, b Counter) int {
		if c := cluster.CompareNames(a.ServicePort, b.ServicePort); c != 0 {
			return c
		}
		return trace.CompareTarget(a.Endpoint, b.Endpoint)
	})
}
