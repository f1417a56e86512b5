package iptables

import (
	"fmt"
	"strings"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Top-level chains, as kube-proxy names them.
const (
	ChainServices         = "KUBE-SERVICES"
	ChainExternalServices = "KUBE-EXTERNAL-SERVICES"
	ChainNodePorts        = "KUBE-NODEPORTS"
	ChainPostrouting      = "KUBE-POSTROUTING"
	ChainMarkMasq         = "KUBE-MARK-MASQ"
	ChainForward          = "KUBE-FORWARD"
	ChainProxyFirewall    = "KUBE-PROXY-FIREWALL"
	ChainKubeletFirewall  = "KUBE-FIREWALL"
	// ChainCanary is kube-proxy's KUBE-PROXY-CANARY: an empty chain in the
	// mangle, nat and filter tables that its iptables monitor creates at
	// start and polls, to notice that someone flushed the tables.
	ChainCanary = "KUBE-PROXY-CANARY"
)

// CanaryTables are the tables that hold ChainCanary, in the order kube-proxy's
// monitor creates it.
var CanaryTables = []string{"mangle", "nat", "filter"}

// Prefixes of the per-service-port and per-endpoint chains, and of our ipset
// affinity sets. Each is followed by a 16-character hash, which keeps chain
// names within iptables' 28-character limit (and set names within ipset's 31).
const (
	PrefixSVC = "KUBE-SVC-" // Cluster policy: the cascade over cluster endpoints
	PrefixSVL = "KUBE-SVL-" // Local policy: the cascade over local endpoints
	PrefixEXT = "KUBE-EXT-" // external destinations (node ports)
	PrefixFW  = "KUBE-FW-"  // loadBalancerSourceRanges (not rendered here)
	PrefixSEP = "KUBE-SEP-" // one endpoint: hairpin masquerade and DNAT
	PrefixAFF = "KUBE-AFF-" // ipset affinity option: one hash:ip set per endpoint
)

// IsServiceChain reports whether a chain is one of the per-service-port or
// per-endpoint chains a sync creates and deletes (kube-proxy's
// isServiceChainName): those are the only chains stale-chain cleanup touches.
func IsServiceChain(name string) bool {
	for _, p := range []string{PrefixSVC, PrefixSVL, PrefixEXT, PrefixFW, PrefixSEP} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// hash16 is kube-proxy's chain-name hash: sha256, base32 (standard
// alphabet), first 16 characters.
func hash16(s string) string {
	var h hash
	hashTo(&h, []byte(s))
	return string(h[:])
}

// protocol is the lower-case protocol kube-proxy hashes and writes in rules.
func protocol(spn cluster.ServicePortName) string {
	switch spn.Protocol {
	case "TCP":
		return "tcp"
	case "UDP":
		return "udp"
	case "SCTP":
		return "sctp"
	}
	return strings.ToLower(string(spn.Protocol))
}

// portName is spn.String(), "namespace/name:port" (or "namespace/name"),
// without fmt.
func portName(spn cluster.ServicePortName) string {
	if spn.Port == "" {
		return spn.Namespace + "/" + spn.Name
	}
	return spn.Namespace + "/" + spn.Name + ":" + spn.Port
}

// PortProtoHash is kube-proxy's portProtoHash(svcPortName.String(),
// lower(protocol)), the suffix shared by a service port's SVC, SVL, EXT and
// FW chains.
func PortProtoHash(spn cluster.ServicePortName) string {
	return hash16(spn.String() + protocol(spn))
}

// ServiceChain is the service port's Cluster-policy chain, KUBE-SVC-<hash>
// (kube-proxy's servicePortPolicyClusterChain).
func ServiceChain(spn cluster.ServicePortName) string { return PrefixSVC + PortProtoHash(spn) }

// LocalChain is the service port's Local-policy chain, KUBE-SVL-<hash>.
func LocalChain(spn cluster.ServicePortName) string { return PrefixSVL + PortProtoHash(spn) }

// ExternalChain is the service port's external-destination chain,
// KUBE-EXT-<hash>.
func ExternalChain(spn cluster.ServicePortName) string { return PrefixEXT + PortProtoHash(spn) }

// EndpointChain is kube-proxy's servicePortEndpointChainName: KUBE-SEP- and
// the hash of service port name, lower-case protocol and endpoint "ip:port".
func EndpointChain(spn cluster.ServicePortName, endpoint string) string {
	return PrefixSEP + hash16(spn.String()+protocol(spn)+endpoint)
}

// AffinitySet names the ipset of the ipset affinity option for one endpoint.
// The timeout is part of the hashed input: a set's timeout is fixed when it
// is created, so a Service whose timeout changes gets new sets (and its
// clients lose their affinity once, as they would with a new list).
// timeout < 0 means a set without timeout (the affinity-no-timeout fault).
func AffinitySet(spn cluster.ServicePortName, endpoint string, timeout int) string {
	return PrefixAFF + hash16(fmt.Sprintf("%s%s%s/timeout=%d", spn.String(), protocol(spn), endpoint, timeout))
}
