package differential

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// ScenarioConfig is the comparison of an expanded scenario file in mode on
// the named nodes (empty: the first node in name order): their Node objects'
// InternalIPs and labels, the scenario's node network, pod CIDR (the
// cluster CIDR), service CIDR and masqueradeAll; Seed writes every object
// of the file through apiserver.Seed before the proxies start.
func ScenarioConfig(exp *scenario.Expanded, mode cluster.Mode, nodes []string) (Config, error) {
	sc := exp.Scenario
	cfg := Config{Mode: mode, MasqueradeAll: sc.Proxy.MasqueradeAll}
	var err error
	if cfg.ServiceCIDR, err = netip.ParsePrefix(sc.Cluster.ServiceCIDR); err != nil {
		return Config{}, fmt.Errorf("scenario %s: cluster.serviceCIDR: %w", exp.File, err)
	}
	if cfg.ClusterCIDR, err = netip.ParsePrefix(sc.Cluster.PodCIDR); err != nil {
		return Config{}, fmt.Errorf("scenario %s: cluster.podCIDR: %w", exp.File, err)
	}
	if cfg.NodeNetwork, err = netip.ParsePrefix(sc.Cluster.NodeNetwork); err != nil {
		return Config{}, fmt.Errorf("scenario %s: cluster.nodeNetwork: %w", exp.File, err)
	}
	byName := map[string]*corev1.Node{}
	var names []string
	addrs := map[string]netip.Addr{}
	for _, n := range exp.Nodes {
		byName[n.Name] = n
		names = append(names, n.Name)
		if ip, ok := scenario.NodeIPv4(n); ok {
			addrs[n.Name] = ip
		}
	}
	slices.Sort(names)
	if len(nodes) == 0 && len(names) > 0 {
		nodes = names[:1]
	}
	for _, name := range nodes {
		n, ok := byName[name]
		if !ok {
			return Config{}, fmt.Errorf("scenario %s has no node %q (nodes: %s)", exp.File, name, strings.Join(names, ", "))
		}
		if !addrs[name].Is4() {
			return Config{}, fmt.Errorf("scenario %s: node %s has no IPv4 InternalIP", exp.File, name)
		}
		cfg.Nodes = append(cfg.Nodes, Node{Name: name, IP: addrs[name], Labels: n.Labels})
	}
	cfg.Seed = func(ctx context.Context, c kubernetes.Interface) error {
		if _, err := apiserver.Seed(ctx, c, exp, apiserver.SeedOptions{NodeAddrs: addrs}); err != nil {
			return fmt.Errorf("could not seed scenario %s: %w", exp.File, err)
		}
		return nil
	}
	return cfg, nil
}
