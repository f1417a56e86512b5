package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Base chains, named "${type}-${hook}" as kube-proxy names them.
const (
	ChainFilterPrerouting = "filter-prerouting" // fast layout
	// ChainFilterPreroutingPreDNAT and ChainFilterOutputPreDNAT are
	// kube-proxy's (v1.37) filter chains before DNAT (firewall-check).
	ChainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	ChainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	ChainFilterInput             = "filter-input"
	ChainFilterForward           = "filter-forward"
	ChainFilterOutput            = "filter-output"
	ChainFilterOutputPostDNAT    = "filter-output-post-dnat" // fast layout
	ChainNATPrerouting           = "nat-prerouting"
	ChainNATOutput               = "nat-output"
	ChainNATPostrouting          = "nat-postrouting"
	// ChainFilterPreroutingPostDNAT is the fast layout's own base chain: it
	// sees forwarded packets after DNAT (hairpin masquerade).
	ChainFilterPreroutingPostDNAT = "filter-prerouting-post-dnat"
)

// Top-level chains, maps and sets, as kube-proxy names them.
const (
	ChainServices               = "services"
	ChainServiceEndpointsCheck  = "service-endpoints-check"
	ChainNodePortEndpointsCheck = "nodeport-endpoints-check"
	ChainReject                 = "reject-chain"
	ChainClusterIPsCheck        = "cluster-ips-check"
	ChainFirewallCheck          = "firewall-check"
	ChainMarkForMasquerade      = "mark-for-masquerade" // fast layout
	ChainMasquerading           = "masquerading"
	MapServiceIPs               = "service-ips"
	MapServiceNodePorts         = "service-nodeports"
	MapNoEndpointServices       = "no-endpoint-services"
	MapNoEndpointNodePorts      = "no-endpoint-nodeports"
	MapFirewallIPs              = "firewall-ips"
	SetClusterIPs               = "cluster-ips"
	SetHairpinEndpoints         = "hairpin-endpoints" // fast layout only
	// SetHairpinConnections is kube-proxy's (v1.37) hairpin set:
	// `ep . ep . proto . port` for each endpoint on this node.
	SetHairpinConnections = "hairpin-connections"
	// SetNodePortIPs holds the addresses that accept node port traffic.
	SetNodePortIPs = "nodeport-ips"
)

const (
	// chainNamePrefixLengthMax is kube-proxy's bound on name prefixes, and
	// chainNameBaseLengthMax the room left for the hashed base.
	chainNamePrefixLengthMax = 16
	chainNameBaseLengthMax   = knftables.NameLengthMax - chainNamePrefixLengthMax
	// The no-endpoint verdicts.
	noEndpointVerdictReject = "goto " + ChainReject
	noEndpointVerdictDrop   = "drop"
)

// Prefixes of per-service-port and per-endpoint objects (each at most 16
// characters, kube-proxy's chainNamePrefixLengthMax).
const (
	PrefixService  = "service-"  // Cluster policy chain
	PrefixLocal    = "local-"    // Local policy chain
	PrefixExternal = "external-" // external destinations (node ports, external and load-balancer IPs)
	PrefixFirewall = "firewall-" // loadBalancerSourceRanges of the load-balancer IPs
	PrefixEndpoint = "endpoint-" // kube-proxy layout: one endpoint of a ClientIP affinity Service
	PrefixAffinity = "affinity-" // ClientIP affinity set of one endpoint
)

// HashAndTruncate is kube-proxy's hashAndTruncate: the first 8 characters of
// base32(sha256(name)), "-", then name, cut to knftables.NameLengthMax-16
// characters with "..." when longer.
func HashAndTruncate(name string) string {
	h := sha256.Sum256([]byte(name))
	s := base32.StdEncoding.EncodeToString(h[:])[:8] + "-" + name
	if len(s) > chainNameBaseLengthMax {
		s = s[:chainNameBaseLengthMax-3] + "..."
	}
	return s
}

// protocol is the lower-case protocol kube-proxy writes in names and rules.
func protocol(spn cluster.ServicePortName) string {
	return strings.ToLower(string(spn.Protocol))
}

// ServicePortBase is kube-proxy's servicePortChainNameBase:
// HashAndTruncate("namespace/name/protocol/port"), e.g.
// "ULMVA6XW-ns1/svc1/tcp/p80".
func ServicePortBase(spn cluster.ServicePortName) string {
	return HashAndTruncate(fmt.Sprintf("%s/%s/%s/%s", spn.Namespace, spn.Name, protocol(spn), spn.Port))
}

// EndpointBase is kube-proxy's servicePortEndpointChainNameBase:
// HashAndTruncate("namespace/name/protocol/port__ip/port") (":" of an IPv6
// address written "."), e.g. "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80".
func EndpointBase(spn cluster.ServicePortName, endpoint string) string {
	ip, port := endpoint, ""
	if ap, err := netip.ParseAddrPort(endpoint); err == nil {
		ip, port = ap.Addr().String(), fmt.Sprint(ap.Port())
	}
	return endpointBase(spn, ip, port)
}

func endpointBase(spn cluster.ServicePortName, ip, port string) string {
	ip = strings.ReplaceAll(ip, ":", ".")
	return HashAndTruncate(spn.Namespace + "/" + spn.Name + "/" + protocol(spn) + "/" + spn.Port + "__" + ip + "/" + port)
}

// ServiceChain is the service port's Cluster policy chain.
func ServiceChain(spn cluster.ServicePortName) string { return PrefixService + ServicePortBase(spn) }

// LocalChain is the service port's Local policy chain.
func LocalChain(spn cluster.ServicePortName) string { return PrefixLocal + ServicePortBase(spn) }

// ExternalChain is the service port's external-destinations chain.
func ExternalChain(spn cluster.ServicePortName) string { return PrefixExternal + ServicePortBase(spn) }

// FirewallChain is the service port's loadBalancerSourceRanges chain.
func FirewallChain(spn cluster.ServicePortName) string { return PrefixFirewall + ServicePortBase(spn) }

// EndpointChain is the kube-proxy layout's chain of one endpoint ("ip:port").
func EndpointChain(spn cluster.ServicePortName, endpoint string) string {
	return PrefixEndpoint + EndpointBase(spn, endpoint)
}

// AffinitySet is the ClientIP affinity set of one endpoint ("ip:port"): the
// same name in both layouts, so that a client's affinity history means the
// same in each.
func AffinitySet(spn cluster.ServicePortName, endpoint string) string {
	return PrefixAffinity + EndpointBase(spn, endpoint)
}

// IsServiceChain reports whether a chain belongs to a service port (it has
// a "/" in its name, as kube-proxy's isServiceChainName checks): only those
// are created and deleted by syncs.
func IsServiceChain(name string) bool { return strings.Contains(name, "/") }
