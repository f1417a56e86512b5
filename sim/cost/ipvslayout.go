package cost

import corev1 "k8s.io/api/core/v1"

// ipvsLayout is which of IPVS mode's ipsets are not empty on a node: its
// iptables rules (kube-proxy's writeIptablesRules, dataplane/ipvs
// rules.go) match a set only when it holds something, so they, and the
// rules a first packet walks, depend on it but not on the Service count.
type ipvsLayout struct {
	ports, loopBack, lb, lbLocal, ext, extLocal, fw, srcIP bool
	// nodePort and nodePortLocal are KUBE-NODE-PORT-<proto>(-LOCAL) for
	// TCP, UDP and SCTP, in KUBE-NODE-PORT's order.
	nodePort, nodePortLocal [3]bool
	// noNodeAccess are the load-balancer IPs with source ranges that leave
	// the node out (KUBE-IPVS-OUT-FILTER drops the node's own traffic).
	noNodeAccess int
}

func protoIndex(p corev1.Protocol) int {
	switch p {
	case corev1.ProtocolUDP:
		return 1
	case corev1.ProtocolSCTP:
		return 2
	}
	return 0
}

// note adds a service port's entries.
func (l *ipvsLayout) note(s *ServicePortInput) {
	x := &s.External
	l.ports = true
	l.loopBack = l.loopBack || s.Local > 0
	if x.ExternalIPs > 0 {
		l.ext = l.ext || !x.Local
		l.extLocal = l.extLocal || x.Local
	}
	if lb := x.LoadBalancerIPs; lb > 0 {
		l.lb = true
		l.lbLocal = l.lbLocal || x.Local
		if x.SourceRanges > 0 {
			l.fw = true
			l.srcIP = l.srcIP || x.FromNode
			if !x.FromNode {
				l.noNodeAccess += lb
			}
		}
	}
	if x.NodePort {
		p := protoIndex(s.Name.Protocol)
		l.nodePort[p] = true
		l.nodePortLocal[p] = l.nodePortLocal[p] || x.Local
	}
}

// servicesRules are nat KUBE-SERVICES' rules in order: the loopback
// RETURN, the jump to KUBE-LOAD-BALANCER, the cluster IPs' masquerade,
// KUBE-EXTERNAL-IP's three and -LOCAL's two, the jump to KUBE-NODE-PORT
// (-m addrtype --dst-type LOCAL), and the ACCEPTs of KUBE-CLUSTER-IP and
// KUBE-LOAD-BALANCER.
func (l *ipvsLayout) servicesRules() int {
	return 1 + b2i(l.lb) + b2i(l.ports) + 3*b2i(l.ext) + 2*b2i(l.extLocal) + 1 + b2i(l.ports) + b2i(l.lb)
}

// nodePortRules are KUBE-NODE-PORT's rules before proto's -LOCAL rule
// (proto < 0: all of them).
func (l *ipvsLayout) nodePortRules(proto int) int {
	n := 0
	for p := range 3 {
		if p == proto {
			return n
		}
		n += b2i(l.nodePortLocal[p]) + b2i(l.nodePort[p])
	}
	return n
}

// rules are the iptables rules of the restore, chain declarations aside:
// nat KUBE-SERVICES, KUBE-NODE-PORT, KUBE-LOAD-BALANCER (the -LOCAL RETURN
// and the masquerade jump), KUBE-POSTROUTING (the hairpin masquerade and
// three) and KUBE-MARK-MASQ; filter KUBE-PROXY-FIREWALL's jump to
// KUBE-SOURCE-RANGES-FIREWALL, whose CIDR and IP RETURNs and DROP,
// KUBE-IPVS-OUT-FILTER's per-address DROP, KUBE-FORWARD's two, the
// health-check ACCEPT and KUBE-IPVS-FILTER's six.
func (l *ipvsLayout) rules() int {
	nat := l.servicesRules() + l.nodePortRules(-1) + b2i(l.lbLocal) + 1 + b2i(l.loopBack) + 3 + 1
	filter := 2*b2i(l.fw) + b2i(l.srcIP) + 1 + l.noNodeAccess + 2 + 1 + 6
	return nat + filter
}
