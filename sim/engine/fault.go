package engine

import (
	"errors"
	"fmt"
)

// Fault is a deliberate bug in an engine's choice of endpoint. It exists for
// the tests of the checks that must catch it: the simulator's engine
// self-check (sim/simulate) compares the engines' draws with the oracle, and
// a self-check that passes an engine with one of these faults proves
// nothing. The zero value, NoFault, is the correct engine; each fault
// changes one mode's engine and leaves the others alone.
type Fault uint8

// The faults.
const (
	NoFault Fault = iota
	// FaultUniformProbability: every iptables statistic rule matches with
	// 1/n, n the chain's endpoint count, instead of 1/(n−i). The shares
	// become 1/n, (1/n)(1−1/n), ... and the last endpoint takes the rest
	// (for 3 endpoints 1/3, 2/9, 4/9): the conformance suite's
	// uniform-probability fault, in the engine. Invisible with 2 endpoints.
	FaultUniformProbability
	// FaultMovedBucket: nftables numgen's last bucket (N−1 of mod N) goes to
	// the first endpoint, which gets twice its share; the last gets none.
	FaultMovedBucket
	// FaultRotationStall: ipvs rr and wrr choose the real server they chose
	// last again every tenth scheduled connection, instead of moving on.
	FaultRotationStall
)

var faultNames = [...]string{"", "uniform-probability", "moved-bucket", "rotation-stall"}

// ErrUnknownFault is wrapped by ParseFault's error.
var ErrUnknownFault = errors.New("unknown engine fault")

// ParseFault reads a fault name ("" is NoFault).
func ParseFault(s string) (Fault, error) {
	for i, n := range faultNames {
		if n == s {
			return Fault(i), nil
		}
	}
	return 0, fmt.Errorf("could not use engine fault %q (known: uniform-probability, moved-bucket, rotation-stall): %w", s, ErrUnknownFault)
}

// String is the fault's name ("" for NoFault).
func (f Fault) String() string {
	if int(f) < len(faultNames) {
		return faultNames[f]
	}
	return fmt.Sprintf("Fault(%d)", uint8(f))
}

// Mode is the mode whose engine the fault changes (0 for NoFault).
func (f Fault) Mode() Mode {
	switch f {
	case FaultUniformProbability:
		return IPTables
	case FaultMovedBucket:
		return NFTables
	case FaultRotationStall:
		return IPVS
	}
	return 0
}

// rotationStallEvery is FaultRotationStall's period in scheduled
// connections.
const rotationStallEvery = 10
