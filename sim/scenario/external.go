package scenario

import (
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Load-balancer health-check defaults: the GCE cloud provider's health
// check of a Service's nodes (check_interval_sec 8, unhealthy_threshold 3,
// healthy_threshold 1).
const (
	DefaultHealthCheckInterval  = 8 * time.Second
	DefaultUnhealthyThreshold   = 3
	DefaultHealthyThreshold     = 1
	maxHealthCheckThreshold     = 100
	minHealthCheckInterval      = 100 * time.Millisecond
	DefaultPlacementSkew        = 1.0
	maxPlacementSkew            = 10.0
	externalClientViasAllowed   = "node-port, external-ip or load-balancer"
	internalClientViaNotAllowed = "pod and host clients connect to the cluster IP (sim run); give via only to clients with where: external"
)

// clientVia checks where an external client connects and its load
// balancer's health check, filling their defaults. It runs after the
// client's where has its default.
func (v *validator) clientVia(cp string, c *Client) {
	if c.Where != cluster.Outside {
		if c.Via != "" && c.Via != cluster.ViaClusterIP {
			v.r.at(cp+".via", "%s", internalClientViaNotAllowed)
		}
		if c.HealthCheck != nil {
			v.r.at(cp+".healthCheck", "a health check is a load balancer's: only clients with where: external and via: load-balancer have one")
		}
		c.Via = cluster.ViaClusterIP
		return
	}
	if c.Requests != nil || c.Pool != nil {
		v.r.at(cp+".requests", "requests and pools are pod clients' (sim run); a client outside the cluster opens new connections")
	}
	switch {
	case c.Via == "":
		c.Via = cluster.ViaLoadBalancer
	case !c.Via.Valid() || c.Via == cluster.ViaClusterIP:
		v.r.at(cp+".via", "clients outside the cluster connect through %s, not %q", externalClientViasAllowed, c.Via)
		return
	}
	if c.Via != cluster.ViaLoadBalancer {
		if c.HealthCheck != nil {
			v.r.at(cp+".healthCheck", "only a load balancer (via: load-balancer) probes the nodes; %s clients send to their nodes evenly", c.Via)
		}
		return
	}
	if c.HealthCheck == nil {
		c.HealthCheck = &HealthCheck{}
	}
	v.healthCheck(cp+".healthCheck", c.HealthCheck)
}

// healthCheck checks a load balancer's health check and fills its
// defaults.
func (v *validator) healthCheck(hp string, h *HealthCheck) {
	if h.Interval == nil {
		h.Interval = &metav1.Duration{Duration: DefaultHealthCheckInterval}
	} else if h.Interval.Duration < minHealthCheckInterval || h.Interval.Duration > time.Hour {
		v.r.at(hp+".interval", "must be between %s and 1h, got %s", minHealthCheckInterval, h.Interval.Duration)
	}
	threshold := func(field string, n *int, def int) {
		switch {
		case *n == 0:
			*n = def
		case *n < 1 || *n > maxHealthCheckThreshold:
			v.r.at(hp+"."+field, "must be between 1 and %d probes, got %d", maxHealthCheckThreshold, *n)
		}
	}
	threshold("unhealthyThreshold", &h.UnhealthyThreshold, DefaultUnhealthyThreshold)
	threshold("healthyThreshold", &h.HealthyThreshold, DefaultHealthyThreshold)
}

// externalTargets checks that an external client's explicit targets can
// be reached through its via (the ones the validator knows: Services of
// the objects section; a generated Service's node port depends on the
// draws, and sim run says when a generated target has none).
func (v *validator) externalTargets(cp string, c *Client) {
	if c.Where != cluster.Outside {
		return
	}
	for j, t := range c.Services {
		ref, _, ok := v.svcTarget(fmt.Sprintf("%s.services[%d]", cp, j), t)
		if !ok || ref == nil || ref.generated {
			continue
		}
		var has bool
		what := ""
		switch c.Via {
		case cluster.ViaNodePort:
			has, what = ref.nodePorts, "node port"
		case cluster.ViaExternalIP:
			has, what = ref.externalIPs, "external IP"
		case cluster.ViaLoadBalancer:
			has, what = ref.lbIP || ref.nodePorts, "load-balancer IP or node port"
		default:
			continue
		}
		if !has {
			v.r.at(fmt.Sprintf("%s.services[%d]", cp, j), "Service %s has no %s: a client outside the cluster cannot reach it through %s", t, what, c.Via)
		}
	}
}

// placement checks generate.placement and its parameters, filling their
// defaults.
func (v *validator) placement(g *Generate) {
	switch {
	case g.Placement == "":
		g.Placement = "spread"
	case !oneOf(g.Placement, Placements):
		v.r.at("generate.placement", "unknown placement %q (choose from %s)", g.Placement, choices(Placements))
	}
	if g.Placement == "skewed" {
		if g.PlacementSkew == 0 {
			g.PlacementSkew = DefaultPlacementSkew
		} else if !(g.PlacementSkew > 0 && g.PlacementSkew <= maxPlacementSkew) {
			v.r.at("generate.placementSkew", "must be above 0 and at most %g, got %g", maxPlacementSkew, g.PlacementSkew)
		}
	} else if g.PlacementSkew != 0 {
		v.r.at("generate.placementSkew", "applies to placement: skewed, not %s", g.Placement)
	}
	if g.Placement != "weighted" {
		if len(g.NodeWeights) > 0 {
			v.r.at("generate.nodeWeights", "applies to placement: weighted, not %s", g.Placement)
		}
		return
	}
	if len(g.NodeWeights) == 0 {
		v.r.at("generate.nodeWeights", "placement weighted needs the nodes' weights, for example {node-1: 1, node-2: 2}")
		return
	}
	names := make([]string, 0, len(g.NodeWeights))
	for n := range g.NodeWeights {
		names = append(names, n)
	}
	slices.Sort(names)
	positive := false
	for _, n := range names {
		w := g.NodeWeights[n]
		if _, ok := v.nodes[n]; !ok {
			v.r.at("generate.nodeWeights."+n, "node %q is not defined", n)
		}
		if !(w >= 0 && w <= 1e6) {
			v.r.at("generate.nodeWeights."+n, "must be between 0 and 10^6, got %g", w)
		}
		positive = positive || w > 0
	}
	if !positive {
		v.r.at("generate.nodeWeights", "at least one node needs a weight above 0")
	}
}
