package apiserver

import (
	"context"
	"fmt"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// SyncTimeout bounds the initial informer sync.
const SyncTimeout = 2 * time.Minute

// Model is a scenario loaded all the way: expanded into objects, held in the
// fake clientset, watched by informers, with one tracker drained once.
type Model struct {
	Loaded   *scenario.Loaded
	Expanded *scenario.Expanded
	Cluster  *Cluster
	Tracker  *cluster.Tracker
	State    *cluster.State
}

// Open loads a scenario file and brings its cluster up. Bad input returns a
// scenario.ErrorList. Close the model when done.
func Open(ctx context.Context, file string, seed *uint64) (*Model, error) {
	l, err := scenario.LoadFile(file)
	if err != nil {
		return nil, err
	}
	c, exp, err := Load(l, seed)
	if err != nil {
		return nil, err
	}
	return start(ctx, l, exp, c)
}

// OpenLoaded brings up the cluster of a scenario already loaded (and
// validated) with scenario.LoadFile.
func OpenLoaded(ctx context.Context, l *scenario.Loaded, seed *uint64) (*Model, error) {
	c, exp, err := Load(l, seed)
	if err != nil {
		return nil, err
	}
	return start(ctx, l, exp, c)
}

// OpenExpanded brings up the cluster of an already expanded scenario.
func OpenExpanded(ctx context.Context, l *scenario.Loaded, exp *scenario.Expanded) (*Model, error) {
	c, err := New(exp)
	if err != nil {
		return nil, err
	}
	return start(ctx, l, exp, c)
}

func start(ctx context.Context, l *scenario.Loaded, exp *scenario.Expanded, c *Cluster) (*Model, error) {
	t, err := c.AddTracker()
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx, SyncTimeout); err != nil {
		c.Stop()
		return nil, fmt.Errorf("could not start the cluster model: %w", err)
	}
	st, _ := t.Drain()
	return &Model{Loaded: l, Expanded: exp, Cluster: c, Tracker: t, State: st}, nil
}

// Release stops the informers and drops the cluster model: the fake
// clientset with its copy of every object, the informers' caches and the
// tracker (whose maps point into those caches), so that the garbage
// collector can free them. Loaded and Expanded stay. A consumer that has
// taken what it needs from State (the simulator, once its timeline is
// captured) calls it: at 30,000 Services those objects are about 300 MB
// of live heap. Close after Release does nothing.
func (m *Model) Release() {
	m.Close()
	m.Cluster, m.Tracker, m.State = nil, nil, nil
}

// Close stops the informers.
func (m *Model) Close() {
	if m.Cluster != nil {
		m.Cluster.Stop()
	}
}
