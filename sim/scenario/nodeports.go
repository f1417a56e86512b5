package scenario

// Node ports, given as the API server gives them (kubernetes
// pkg/registry/core/service/storage/alloc.go, initNodePorts): every port of a
// NodePort Service, and of a LoadBalancer Service unless
// allocateLoadBalancerNodePorts is false, gets a node port from the range
// when it has none; ports that share a port number (TCP and UDP 53) share a
// node port; a requested node port is kept. The API server picks a free port
// at random; here it is the lowest free one, so that the same input gives the
// same ports whatever the seed, and the ports a user gave are never taken.

import (
	corev1 "k8s.io/api/core/v1"
)

// The API server's default node port range (--service-node-port-range).
const (
	NodePortMin = 30000
	NodePortMax = 32767
	// nodePortRangeSize is how many node ports the range holds.
	nodePortRangeSize = NodePortMax - NodePortMin + 1
)

// allocatesNodePorts reports whether the API server gives node ports to the
// Service's ports that have none.
func allocatesNodePorts(s *corev1.Service) bool {
	switch s.Spec.Type {
	case corev1.ServiceTypeNodePort:
		return true
	case corev1.ServiceTypeLoadBalancer:
		return s.Spec.AllocateLoadBalancerNodePorts == nil || *s.Spec.AllocateLoadBalancerNodePorts
	}
	return false
}

// missingNodePorts counts the node ports the API server would allocate for
// s: one per port number none of whose ports requests one.
func missingNodePorts(s *corev1.Service) int {
	if !allocatesNodePorts(s) {
		return 0
	}
	requested := map[int32]bool{}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			requested[p.Port] = true
		}
	}
	seen := map[int32]bool{}
	n := 0
	for _, p := range s.Spec.Ports {
		if p.NodePort == 0 && !requested[p.Port] && !seen[p.Port] {
			seen[p.Port] = true
			n++
		}
	}
	return n
}

// nodePortAllocator hands out the lowest free node port of the range.
type nodePortAllocator struct {
	used map[int32]bool
	next int32
}

// newNodePortAllocator reserves every node port and health check node port
// requested by the objects' Services (validation has made them unique and in
// range).
func newNodePortAllocator(objects []Object) *nodePortAllocator {
	a := &nodePortAllocator{used: map[int32]bool{}, next: NodePortMin}
	for _, o := range objects {
		if s, ok := o.Object.(*corev1.Service); ok {
			for _, p := range s.Spec.Ports {
				if p.NodePort != 0 {
					a.used[p.NodePort] = true
				}
			}
			if s.Spec.HealthCheckNodePort != 0 {
				a.used[s.Spec.HealthCheckNodePort] = true
			}
		}
	}
	return a
}

func (a *nodePortAllocator) allocate() (int32, bool) {
	for a.next <= NodePortMax && a.used[a.next] {
		a.next++
	}
	if a.next > NodePortMax {
		return 0, false
	}
	a.used[a.next] = true
	return a.next, true
}

// assign gives node ports to the ports of s that need one, as initNodePorts
// does: a port takes the node port of another port with the same port
// number (requested or allocated), else the next free one; then the health
// check node port, as allocHealthCheckNodePort does. It reports false when
// the range is exhausted.
func (a *nodePortAllocator) assign(s *corev1.Service) bool {
	if !a.assignPorts(s) {
		return false
	}
	if NeedsHealthCheck(s) && s.Spec.HealthCheckNodePort == 0 {
		p, ok := a.allocate()
		if !ok {
			return false
		}
		s.Spec.HealthCheckNodePort = p
	}
	return true
}

func (a *nodePortAllocator) assignPorts(s *corev1.Service) bool {
	if !allocatesNodePorts(s) {
		return true
	}
	byPort := map[int32]int32{}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			if _, ok := byPort[p.Port]; !ok {
				byPort[p.Port] = p.NodePort
			}
		}
	}
	for i := range s.Spec.Ports {
		p := &s.Spec.Ports[i]
		if p.NodePort != 0 {
			continue
		}
		np, ok := byPort[p.Port]
		if !ok {
			if np, ok = a.allocate(); !ok {
				return false
			}
			byPort[p.Port] = np
		}
		p.NodePort = np
	}
	return true
}
