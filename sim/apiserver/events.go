package apiserver

import (
	"fmt"
	"sort"
	"time"

	"github.com/kpsim/kpsim/sim/scenario"
)

// Action is what one timeline step does to the API.
type Action string

// Actions of timeline steps.
const (
	ActSetReady      Action = "set-ready"      // ready=serving=Ready
	ActTerminate     Action = "terminate"      // ready=false, serving kept, terminating=true
	ActRemove        Action = "remove"         // the endpoint leaves its slice
	ActScale         Action = "scale"          // endpoints added or removed to reach Replicas
	ActServiceUpdate Action = "service-update" // Service fields changed
	ActAdd           Action = "add"            // a ready endpoint at Endpoint on Node joins the last slice
	ActRestore       Action = "restore"        // the slices' endpoints are put back as Snapshot holds them
)

// Step is one API write of the timeline, at a time from the start of the run.
type Step struct {
	At      time.Duration
	Action  Action
	Event   int // index in the scenario's events
	Service string
	// Which endpoints: by pod, by address, or the first Count in address order.
	Pod, Endpoint string
	Count         int
	Ready         bool
	Replicas      int
	Update        *scenario.Event // for service updates
	// Node is the node of an added endpoint (ActAdd).
	Node string
	// Snapshot is what ActRestore writes back (Cluster.Snapshot).
	Snapshot Snapshot
}

// AllEndpoints as a step's Count picks every endpoint of the Service.
const AllEndpoints = 1 << 30

// String describes the step for logs and reports.
func (s Step) String() string {
	target := s.Pod
	if target == "" {
		target = s.Endpoint
	}
	switch {
	case target == "" && s.Count >= AllEndpoints:
		target = "every endpoint"
	case target == "" && s.Count > 0:
		target = fmt.Sprintf("%d endpoint(s)", s.Count)
	}
	switch s.Action {
	case ActSetReady:
		return fmt.Sprintf("%s %s %s ready=%t", s.At, s.Service, target, s.Ready)
	case ActScale:
		return fmt.Sprintf("%s %s scale to %d", s.At, s.Service, s.Replicas)
	case ActAdd:
		return fmt.Sprintf("%s %s add %s on %s", s.At, s.Service, s.Endpoint, s.Node)
	case ActRestore:
		return fmt.Sprintf("%s %s restore its endpoints", s.At, s.Service)
	}
	return fmt.Sprintf("%s %s %s %s", s.At, s.Service, target, s.Action)
}

// Timeline expands the scenario's events into API writes ordered by time
// (stable: events at the same time keep their file order). A flap becomes
// 2×count readiness writes; a pod deletion becomes terminate, then remove
// after the grace period.
func Timeline(sc *scenario.Scenario) []Step {
	var out []Step
	for i := range sc.Events {
		e := &sc.Events[i]
		base := Step{At: e.At.Duration, Event: i, Service: e.Service, Pod: e.Pod, Endpoint: e.Endpoint, Count: e.Endpoints}
		switch e.Type {
		case scenario.EventReadiness:
			s := base
			s.Action, s.Ready = ActSetReady, *e.Ready
			out = append(out, s)
		case scenario.EventFlap:
			period := e.Period.Duration
			down := time.Duration(float64(period) * e.Duty)
			for k := 0; k < e.Count; k++ {
				s := base
				s.At = base.At + time.Duration(k)*period
				s.Action, s.Ready = ActSetReady, false
				out = append(out, s)
				s.At += down
				s.Ready = true
				out = append(out, s)
			}
		case scenario.EventDeletePod:
			s := base
			s.Action = ActTerminate
			out = append(out, s)
			s.At += e.GracePeriod.Duration
			s.Action = ActRemove
			out = append(out, s)
		case scenario.EventScale:
			s := base
			s.Action, s.Replicas = ActScale, *e.Replicas
			out = append(out, s)
		case scenario.EventServiceUpdate:
			s := base
			s.Action, s.Update = ActServiceUpdate, e
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].At < out[b].At })
	return out
}
