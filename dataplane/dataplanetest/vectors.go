package dataplanetest

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// VectorState is NewState holding a reference vector's service port,
// ns1/svc1 (port unnamed) at 172.30.1.1:80, with its endpoints: "local"
// ones on ThisNode, "remote" ones on OtherNode.
func VectorState(v testenv.Vector) (*cluster.State, *cluster.ServicePort) {
	st := NewState()
	sp := ClusterIPPort(Name("ns1", "svc1", ""), "172.30.1.1", 80)
	sp.Type = corev1.ServiceType(v.Service.Type)
	sp.NodePort, sp.InternalLocal, sp.ExternalLocal = v.Service.NodePort, v.Service.InternalLocal, v.Service.ExternalLocal
	var eps []*cluster.Endpoint
	for _, e := range v.Endpoints {
		node := OtherNode
		if e.Local() {
			node = ThisNode
		}
		x := EP(e.IP, 80, node, e.Cond)
		x.ZoneHints = e.ZoneHints
		eps = append(eps, x)
	}
	Add(st, sp, eps...)
	return st, sp
}

// VectorTargets are a vector's outcomes in mode as the tracers print them:
// " masq" after each endpoint an external flow reaches masqueraded.
func VectorTargets(v testenv.Vector, mode string) (pod, external string) {
	o := v.Outcomes(mode)
	if !v.ExternalMasquerade {
		return o.Pod, o.External
	}
	var ext []string
	for _, t := range strings.Split(o.External, ", ") {
		if _, err := netip.ParseAddrPort(t); err == nil {
			t += " masq"
		}
		ext = append(ext, t)
	}
	return o.Pod, strings.Join(ext, ", ")
}
