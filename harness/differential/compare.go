package differential

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/dataplane"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// ReadBack lists a namespace's ruleset the way the comparison reads both
// sides: `iptables-save` (every IPv4 table) in iptables mode, `nft list
// table ip kube-proxy` in nftables mode.
func ReadBack(ns *netns.Namespace, mode cluster.Mode) (string, error) {
	var out []byte
	var err error
	switch mode {
	case cluster.ModeIPTables:
		out, err = ns.Exec("iptables-save")
	case cluster.ModeNFTables:
		out, err = ns.Exec("nft", "list", "table", "ip", "kube-proxy")
	default:
		return "", fmt.Errorf("could not read back a %s ruleset: only iptables and nftables modes", mode)
	}
	if err != nil {
		return "", fmt.Errorf("could not read back the rules of %s: %w", ns.Name, err)
	}
	return string(out), nil
}

// Result is one compared node's two rulesets after a step.
type Result struct {
	Node string
	// Upstream and Ours are the read-back texts as listed.
	Upstream, Ours string
	// Diff is Diff of the normalized texts: empty when identical.
	Diff []string
	// Lines is the number of normalized lines of upstream's ruleset.
	Lines int
}

// Compare reads both sides of every compared node back and diffs them.
func (e *Env) Compare() ([]Result, error) {
	var out []Result
	for _, p := range e.pairs {
		up, err := ReadBack(p.upNS, e.cfg.Mode)
		if err != nil {
			return nil, err
		}
		ours, err := ReadBack(p.oursNS, e.cfg.Mode)
		if err != nil {
			return nil, err
		}
		nu, err := Normalize(e.cfg.Mode, up)
		if err != nil {
			return nil, err
		}
		no, err := Normalize(e.cfg.Mode, ours)
		if err != nil {
			return nil, err
		}
		// The marker Service's port moves with every settle, after our
		// side's sync (settleUpstream): its lines are the comparison's own.
		isMarker := func(l string) bool { return strings.Contains(l, serviceMarkerName) }
		nu, no = slices.DeleteFunc(nu, isMarker), slices.DeleteFunc(no, isMarker)
		r := Result{Node: p.node.Name, Upstream: up, Ours: ours, Diff: Diff(nu, no), Lines: len(nu)}
		hd, err := e.compareHealth(p)
		if err != nil {
			return nil, err
		}
		r.Diff = append(r.Diff, hd...)
		cd, err := e.compareConntrack(p)
		if err != nil {
			return nil, err
		}
		r.Diff = append(r.Diff, cd...)
		out = append(out, r)
	}
	return out, nil
}

// healthPorts lists the health check node ports of the apiserver's
// Services (LoadBalancer, externalTrafficPolicy Local), by Service.
func (e *Env) healthPorts() (map[string]int32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := e.cp.Client().CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("could not list the Services for their health check node ports: %w", err)
	}
	out := map[string]int32{}
	for _, s := range l.Items {
		if s.Spec.HealthCheckNodePort != 0 {
			out[s.Namespace+"/"+s.Name] = s.Spec.HealthCheckNodePort
		}
	}
	return out, nil
}

// compareHealth asks both sides' health check node ports of every Service
// that has one (from inside each side's namespace, at its node address, as
// a load balancer would) and returns a diff line per answer that differs:
// the status and the body's localEndpoints.
func (e *Env) compareHealth(p *pair) ([]string, error) {
	ports, err := e.healthPorts()
	if err != nil {
		return nil, err
	}
	var diff []string
	for _, svc := range slices.Sorted(maps.Keys(ports)) {
		port := uint16(ports[svc])
		up := dataplane.AskHealth(context.Background(), p.upNS.Do, netip.AddrPortFrom(p.node.IP, port), "/")
		ours := dataplane.AskHealth(context.Background(), p.oursNS.Do, netip.AddrPortFrom(p.oursIP, port), "/")
		if up.Summary() != ours.Summary() {
			diff = append(diff, fmt.Sprintf("-health check %s (port %d): %s", svc, port, up.Summary()), fmt.Sprintf("+health check %s (port %d): %s", svc, port, ours.Summary()))
		}
	}
	return diff, nil
}

// Upstream reads back upstream's ruleset of compared node i.
func (e *Env) Upstream(i int) (string, error) { return ReadBack(e.pairs[i].upNS, e.cfg.Mode) }

// Ours reads back our ruleset of compared node i.
func (e *Env) Ours(i int) (string, error) { return ReadBack(e.pairs[i].oursNS, e.cfg.Mode) }

// ReadBackCommand is the command ReadBack runs in mode, for headers.
func ReadBackCommand(mode cluster.Mode) string {
	if mode == cluster.ModeNFTables {
		return "nft list table ip kube-proxy"
	}
	return "iptables-save"
}
