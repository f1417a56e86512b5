package scenario

import (
	"slices"
	"strings"
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
func (c *Check) Nodes(sc *Scenario, all []string, t Target) []string {
	if len(c.ClientNodes) > 0 {
		return c.ClientNodes
	}
	if sc.Traffic == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for i := range sc.Traffic.Clients {
		cl := &sc.Traffic.Clients[i]
		if !cl.Sends(t) {
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
	slices.Sort(out)
	return out
}
