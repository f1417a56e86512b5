package scenario

import (
	"slices"
	"strings"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Target is one service port as a client's services and protocol select
// it: the Service ("namespace/name"), the port's name ("" when unnamed)
// and its protocol ("TCP", "UDP", ...). A check's Target is the service
// port it resolves to (cluster.ResolvePort).
type Target struct {
	Service, Port, Protocol string
}

// Sends reports whether the client's pods send connections to t: its
// protocol, when it has one, is t's, and its services are empty (every
// Service) or name t's Service, alone (each of its ports) or with t's port.
func (cl *Client) Sends(t Target) bool {
	if cl.Protocol != "" && cl.Protocol != t.Protocol {
		return false
	}
	if len(cl.Services) == 0 {
		return true
	}
	for _, s := range cl.Services {
		svc, port, hasPort := strings.Cut(s, ":")
		if svc == t.Service && (!hasPort || port == t.Port) {
			return true
		}
	}
	return false
}

// Nodes lists the nodes check c is evaluated from, c checking the
// service port t, among the cluster's nodes all: its ClientNodes when it
// names them, in its order; else every node where a client pod sends to t
// (Client.Sends; a client without nodes runs on every node), each once,
// sorted. A node whose clients do not send to t has no traffic to t to
// check. This is the one definition sim run and sim conform both use.
//
// Clients count where the check's clients stand (CheckRoute): pods for a
// pod check, host clients for a host check; for a check from outside the
// nodes are the entry nodes, ClientNodes or, without them, the nodes of the
// outside clients that send to t (every node for one without nodes), or
// every node when the scenario has no outside client (the harness then
// adds one). A load-balancer balance check and a health check have no
// client node of their own: one verdict covers the cluster (nil).
func (c *Check) Nodes(sc *Scenario, all []string, t Target) []string {
	from, _ := CheckRoute(c)
	switch c.Type {
	case CheckExternalLocalBalance, CheckHealthCheck:
		return nil
	}
	if len(c.ClientNodes) > 0 {
		return c.ClientNodes
	}
	if sc.Traffic == nil {
		if from == cluster.Outside {
			return slices.Sorted(slices.Values(all))
		}
		return nil
	}
	seen := map[string]bool{}
	var out []string
	outside := false
	for i := range sc.Traffic.Clients {
		cl := &sc.Traffic.Clients[i]
		where := cl.Where
		if where == "" {
			where = cluster.InPod
		}
		outside = outside || where == cluster.Outside
		if where != from || !cl.Sends(t) {
			continue
		}
		nodes := cl.Nodes
		if len(nodes) == 0 {
			nodes = all
		}
		for _, n := range nodes {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	if from == cluster.Outside && !outside {
		out = slices.Clone(all)
	}
	slices.Sort(out)
	return out
}
