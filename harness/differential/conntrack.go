package differential

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/dataplane/conntrack"
)

// The conntrack comparison: before each step the same flows are planted in
// both sides' conntrack tables of every compared node (their tables emptied
// first), as clients would have them established: for every UDP service
// port, from each of its frontends (cluster IP, external IPs, load-balancer
// ingress IPs, the node's address at its node port) one flow NATed to each
// of its first plantedPerFrontend serving endpoints; for every TCP service
// port one flow from its cluster IP to its first endpoint. None of them is
// stale before the step, so a cleanup that a sync in the middle of the step
// runs (kube-proxy syncs per event, ours once per write) finds nothing
// that one at its end would not. Flows that are not NATed (made before a
// Service's rules existed) are left out: kube-proxy deletes them only in a
// sync that has both the Service and an endpoint change, and its two
// watches may deliver a new Service after its slices, so whether it does
// depends on that order, not on its logic (which the conntrack package's
// tests and the udp-flow check hold). After the step settles, Compare
// lists both tables' planted flows and diffs them: which flows each
// proxy's conntrack cleanup left. Their client is one address
// of TEST-NET-1 (RFC 5737), which nothing else in the run uses, each flow
// from a port of its own, so the listing leaves out the proxies' own
// connections (kube-proxy's to the API server, the health checks).
var plantedClient = netip.MustParseAddr("192.0.2.77")

// plantedPort is the first planted flow's client port.
const plantedPort = 10000

// Bounds of the planted flows: endpoints per frontend, and flows in all.
const (
	plantedPerFrontend = 3
	maxPlanted         = 4000
	plantedTimeout     = 600 // seconds: longer than any comparison
)

// openConntrack opens both sides' tables of every compared node.
func (e *Env) openConntrack() error {
	for _, p := range e.pairs {
		var err error
		if p.upCT, err = conntrack.NewNamespaceTable(p.upNS); err != nil {
			return err
		}
		if p.oursCT, err = conntrack.NewNamespaceTable(p.oursNS); err != nil {
			return err
		}
	}
	return nil
}

// plantFlows empties both sides' tables and plants the flows of the API's
// current Services (see plantedClient).
func (e *Env) plantFlows(ctx context.Context) error {
	svcs, err := e.cp.Client().CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("could not list the Services to plant flows: %w", err)
	}
	sls, err := e.cp.Client().DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("could not list the EndpointSlices to plant flows: %w", err)
	}
	for _, p := range e.pairs {
		for side, t := range map[string]*conntrack.NamespaceTable{"kube-proxy's": p.upCT, "our": p.oursCT} {
			addr := p.node.IP
			if t == p.oursCT {
				addr = p.oursIP
			}
			if err := t.Flush(); err != nil {
				return fmt.Errorf("node %s: could not empty %s conntrack table: %w", p.node.Name, side, err)
			}
			if _, err := t.Create(PlantedFlows(svcs.Items, sls.Items, addr)); err != nil {
				return fmt.Errorf("node %s: %s table: %w", p.node.Name, side, err)
			}
		}
	}
	return nil
}

// PlantedFlows are the flows planted for the Services and slices, the
// node-port ones at nodeIP, in a fixed order with fixed clients (so both
// sides get the same).
func PlantedFlows(svcs []corev1.Service, sls []discoveryv1.EndpointSlice, nodeIP netip.Addr) []*netlink.ConntrackFlow {
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for i := range sls {
		s := &sls[i]
		k := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		bySvc[k] = append(bySvc[k], s)
	}
	slices.SortFunc(svcs, func(a, b corev1.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var out []*netlink.ConntrackFlow
	add := func(proto uint8, dst, reply netip.AddrPort) {
		if len(out) >= maxPlanted {
			return
		}
		out = append(out, plantedFlow(proto, netip.AddrPortFrom(plantedClient, uint16(plantedPort+len(out))), dst, reply))
	}
	for i := range svcs {
		s := &svcs[i]
		cip, err := netip.ParseAddr(s.Spec.ClusterIP)
		if err != nil || !cip.Is4() {
			continue // headless, ExternalName, IPv6
		}
		for _, sp := range s.Spec.Ports {
			eps := endpointsOf(bySvc[s.Namespace+"/"+s.Name], sp.Name, sp.Protocol)
			switch {
			case sp.Protocol == corev1.ProtocolTCP && len(eps) > 0:
				add(unix.IPPROTO_TCP, netip.AddrPortFrom(cip, uint16(sp.Port)), eps[0])
			case sp.Protocol == corev1.ProtocolUDP:
				for _, fe := range frontends(s, sp, cip, nodeIP) {
					for _, ep := range eps[:min(plantedPerFrontend, len(eps))] {
						add(unix.IPPROTO_UDP, fe, ep)
					}
				}
			}
		}
	}
	return out
}

// frontends are a service port's destinations as a client's flow has them.
func frontends(s *corev1.Service, sp corev1.ServicePort, cip, nodeIP netip.Addr) []netip.AddrPort {
	port := uint16(sp.Port)
	out := []netip.AddrPort{netip.AddrPortFrom(cip, port)}
	var ips []string
	ips = append(ips, s.Spec.ExternalIPs...)
	for _, in := range s.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	for _, x := range ips {
		if a, err := netip.ParseAddr(x); err == nil && a.Is4() {
			out = append(out, netip.AddrPortFrom(a, port))
		}
	}
	if sp.NodePort != 0 {
		out = append(out, netip.AddrPortFrom(nodeIP, uint16(sp.NodePort)))
	}
	return out
}

// endpointsOf lists the serving endpoints of a service port (by the
// slices' port name and protocol; serving as kube-proxy reads it: the
// serving condition, or when it is not set the ready one, nil being
// ready), in slice order.
func endpointsOf(sls []*discoveryv1.EndpointSlice, name string, proto corev1.Protocol) []netip.AddrPort {
	slices.SortFunc(sls, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	var out []netip.AddrPort
	for _, s := range sls {
		for _, p := range s.Ports {
			pp := corev1.ProtocolTCP
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			if p.Port == nil || pp != proto || (p.Name != nil && *p.Name != name) || (p.Name == nil && name != "") {
				continue
			}
			for _, ep := range s.Endpoints {
				ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
				if len(ep.Addresses) == 0 || !ptrOr(ep.Conditions.Serving, ready) {
					continue
				}
				if a, err := netip.ParseAddr(ep.Addresses[0]); err == nil && a.Is4() {
					out = append(out, netip.AddrPortFrom(a, uint16(*p.Port)))
				}
			}
		}
	}
	return out
}

// plantedFlow is a flow from client to dst whose replies come from reply
// (dst itself: not NATed); a TCP one is established.
func plantedFlow(proto uint8, client, dst, reply netip.AddrPort) *netlink.ConntrackFlow {
	f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: plantedTimeout,
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: client.Addr().AsSlice(), SrcPort: client.Port(), DstIP: dst.Addr().AsSlice(), DstPort: dst.Port()},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: reply.Addr().AsSlice(), SrcPort: reply.Port(), DstIP: client.Addr().AsSlice(), DstPort: client.Port()}}
	if proto == unix.IPPROTO_TCP {
		f.ProtoInfo = &netlink.ProtoInfoTCP{State: 3} // ESTABLISHED
	}
	return f
}

// plantedLeft lists the planted flows left in t, described, with the
// side's node address (ours) written as the node's (so both sides read
// alike), sorted.
func plantedLeft(t *conntrack.NamespaceTable, ours, node netip.Addr) ([]string, error) {
	flows, err := t.List()
	if err != nil {
		return nil, fmt.Errorf("could not list the conntrack table: %w", err)
	}
	var out []string
	for _, f := range flows {
		src, ok := netip.AddrFromSlice(f.Forward.SrcIP)
		if !ok || src.Unmap() != plantedClient {
			continue
		}
		d := "conntrack " + conntrack.Describe(f)
		if ours.IsValid() {
			d = strings.ReplaceAll(d, " "+ours.String()+":", " "+node.String()+":")
		}
		out = append(out, d)
	}
	slices.Sort(out)
	return out, nil
}

// compareConntrack diffs the planted flows both sides' cleanups left.
func (e *Env) compareConntrack(p *pair) ([]string, error) {
	up, err := plantedLeft(p.upCT, netip.Addr{}, p.node.IP)
	if err != nil {
		return nil, fmt.Errorf("node %s, kube-proxy: %w", p.node.Name, err)
	}
	ours, err := plantedLeft(p.oursCT, p.oursIP, p.node.IP)
	if err != nil {
		return nil, fmt.Errorf("node %s, ours: %w", p.node.Name, err)
	}
	return Diff(up, ours), nil
}

func ptrOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}
