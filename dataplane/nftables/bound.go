package nftables

import (
	"fmt"
	"time"
)

// The bound of one nft call. A sync that is slow is a measurement, not an
// error, so a call is bounded by what its size predicts, not by a fixed
// time: BoundFloor, or BoundPerOperation for each operation of the
// transaction (each object of the table for a listing or a deletion),
// whichever is longer.
//
// BoundPerOperation is three times the slowest per-operation rate measured
// here: `sim calibrate --mode nftables --layout kube-proxy`, 5000 x 10, a
// full sync of 20 549 operations in 33.5 s (1.6 ms per operation) with
// the 2 shared cores at load average 18 (10000 x 10: 41 049 operations in
// 49.5 s, 1.2 ms). On a quiet machine the same sync is about 0.2-0.6 ms per
// operation, and the kube-proxy v1.31 layout's 175 047 operations loaded by
// `nft -f` in 82 s (0.47 ms; the fixed 30 s bound killed it). The cost
// grows superlinearly with the table (one anonymous map per service chain),
// hence the factor. A slower machine, or the microVM's emulated CPU, raises
// the bound with --nft-timeout.
const (
	BoundFloor        = 30 * time.Second
	BoundPerOperation = 5 * time.Millisecond
)

// TimeoutFlag is the flag of the commands that program nftables (sim
// calibrate, sim conform, sim rules --listed) that sets the bound.
const TimeoutFlag = "--nft-timeout"

// Bound is the limit of one nft call and how it was derived.
type Bound struct {
	Limit time.Duration
	// Operations is the size the limit was derived from.
	Operations int
	// Fixed reports a limit given by TimeoutFlag rather than derived.
	Fixed bool
}

// CallBound returns the bound of a call of ops operations: fixed if it is
// positive (TimeoutFlag), else max(BoundFloor, ops x BoundPerOperation).
func CallBound(ops int, fixed time.Duration) Bound {
	if fixed > 0 {
		return Bound{Limit: fixed, Operations: ops, Fixed: true}
	}
	limit := time.Duration(ops) * BoundPerOperation
	if ops < 0 || limit < BoundFloor {
		limit = BoundFloor
	}
	return Bound{Limit: limit, Operations: ops}
}

// Derivation says in words where the limit comes from.
func (b Bound) Derivation() string {
	if b.Fixed {
		return fmt.Sprintf("%s %s", TimeoutFlag, b.Limit)
	}
	return fmt.Sprintf("max(%s, %d operations x %s per operation)", BoundFloor, b.Operations, BoundPerOperation)
}

// TimeoutError is an nft call stopped at its bound. The kernel may or may
// not have taken the transaction (Backend resets its renderer).
type TimeoutError struct {
	// Call names the call: "transaction", "listing of the table",
	// "deletion of the table".
	Call  string
	Bound Bound
	// Err is what running nft returned (usually "signal: killed").
	Err error
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("the nft %s (%d operations) was still running when it reached its bound of %s, so it was stopped (%v); "+
		"the bound is %s. A slow nft call is a measurement, not a dataplane error: to let it finish, raise the bound with %s DUR (for example %s %s)",
		e.Call, e.Bound.Operations, e.Bound.Limit, e.Err, e.Bound.Derivation(), TimeoutFlag, TimeoutFlag, suggest(e.Bound.Limit))
}

func (e *TimeoutError) Unwrap() error { return e.Err }

// suggest is a bound four times lim, in whole minutes.
func suggest(lim time.Duration) time.Duration {
	return (4*lim + time.Minute - 1).Truncate(time.Minute)
}
