package conform

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/apiserver"
)

// machine is what the checks need from the place they run. The kernel
// machine (below) is the node namespaces with their proxies, the prober's
// raw sockets and the wall clock; the simulated machine (machine_sim.go) is
// the simulator's engines with a virtual clock, which the harness
// calibration drives through the same check code (calibration_test.go).
// Everything a check decides goes through here, so that a calibration
// exercises the run's own probe plan, counting and decisions.
type machine interface {
	// clients lists the client pods, node by node.
	clients() []*netns.Client
	// phase starts a counting phase: counts reset, packets of earlier
	// phases are ignored from now on.
	phase()
	// flush empties every node's connection tracking table.
	flush()
	// send sends a batch of probes and returns how many went out.
	send(ctx context.Context, b Probe, r *rand.Rand) (int, error)
	// collect waits until expected packets were seen (or the rest are
	// lost) and returns the phase's counts.
	collect(expected int) Counts
	// counters are a node's rule counters (nil when unavailable).
	counters(node string) []dataplane.Counter
	// idle lets time pass (virtual time on the simulated machine).
	idle(ctx context.Context, d time.Duration) error
	// now is the time since the machine started.
	now() time.Duration
	// quiesce waits until no packet of an earlier phase is still arriving.
	quiesce()
	// apply writes one timeline step through the API and waits until every
	// node has programmed it, returning how long each node took.
	apply(ctx context.Context, step apiserver.Step) (map[string]time.Duration, error)
}

// kernelMachine is the real thing: a suite's namespaces, proxies and
// prober.
type kernelMachine struct {
	s      *suite
	prober *Prober
	start  time.Time
}

// clients are the client pods that are not endpoints (a hairpin check's
// endpoint pods send only for it: endpointPod).
func (k *kernelMachine) clients() []*netns.Client {
	return slices.DeleteFunc(slices.Clone(k.s.topo.Clients()), func(c *netns.Client) bool { return c.Config.Endpoint })
}
func (k *kernelMachine) phase()               { k.prober.Phase() }
func (k *kernelMachine) collect(n int) Counts { return k.prober.Collect(n) }
func (k *kernelMachine) now() time.Duration   { return time.Since(k.start) }

func (k *kernelMachine) send(ctx context.Context, b Probe, r *rand.Rand) (int, error) {
	return k.prober.Send(ctx, b, r)
}

// flush empties the node namespaces' connection tables, so that one
// phase's probes never meet another's entries (and the shared kernel table
// does not fill up).
func (k *kernelMachine) flush() { _ = k.prober.Flush() }

func (k *kernelMachine) counters(name string) []dataplane.Counter {
	return k.s.px.counters(name)
}

func (k *kernelMachine) idle(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// quiesce waits until no probe of an earlier phase is still arriving (on a
// slow machine, such as the emulated VM, a large phase's packets can still
// be queued when its collection ends; each one would move IPVS's rr
// pointer). Bounded by 30 s.
func (k *kernelMachine) quiesce() {
	deadline := time.Now().Add(30 * time.Second)
	prev := k.prober.Collect(0).Foreign
	for time.Now().Before(deadline) {
		time.Sleep(quietPeriod + 50*time.Millisecond)
		cur := k.prober.Collect(0).Foreign
		if cur == prev {
			return
		}
		prev = cur
	}
}

func (k *kernelMachine) apply(ctx context.Context, step apiserver.Step) (map[string]time.Duration, error) {
	return k.s.px.apply(ctx, step)
}

// applyModel writes a timeline step into the suite's model (the oracle's
// state) and waits until its tracker has received every write (the
// model's informers deliver them asynchronously).
func (s *suite) applyModel(ctx context.Context, step apiserver.Step) error {
	before := s.m.Tracker.Seq()
	writes, err := s.m.Cluster.Apply(ctx, step)
	if err != nil {
		return &applyError{err}
	}
	deadline := time.Now().Add(settleTimeout)
	for s.m.Tracker.Seq() < before+uint64(writes) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the model's tracker did not receive %d writes within %s", writes, settleTimeout)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return nil
}

// applyError is an API write that failed (not a settle timeout).
type applyError struct{ err error }

func (e *applyError) Error() string { return e.err.Error() }
func (e *applyError) Unwrap() error { return e.err }

// kernelOnly is the kernel machine, or an error saying the check needs
// the real kernel (real TCP connections, for instance).
func (s *suite) kernelOnly(what string) (*kernelMachine, error) {
	if k, ok := s.mc.(*kernelMachine); ok {
		return k, nil
	}
	return nil, fmt.Errorf("%s needs the kernel: it is not simulated", what)
}
