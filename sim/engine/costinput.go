package engine

import (
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

// CostInput describes a node's rules for one service port to the cost
// model: its verdict, or its endpoints (every one reachable) and affinity.
func (r *Rules) CostInput(name cluster.ServicePortName) cost.ServicePortInput {
	in := cost.ServicePortInput{Name: name}
	switch r.Verdict {
	case Reject:
		in.Reject = true
	case Drop:
		in.Drop = true
	default:
		in.Endpoints = len(r.Backends)
		in.Reachable = len(r.Backends)
		in.Affinity = r.AffinityTimeout > 0
	}
	return in
}
