package testenv

import (
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The reference vectors are plain data shared by the oracle's, the
// engine's and the dataplane's tests. This loader imports nothing of the
// module, so the oracle's test can read them without sharing code with the
// dataplane: only the expectations, written from kube-proxy's
// documentation and tests, are shared.
//
//go:embed testdata/vectors.yaml
var vectorsYAML []byte

// Vector is one reference case of endpoint selection: a service port, its
// endpoints and what each test expects (testdata/vectors.yaml documents the
// fields).
type Vector struct {
	// Name says what the case shows; unique in the file.
	Name string `json:"name"`
	// Service is the service port's type, node port and traffic policies.
	Service VectorService `json:"service"`
	// Zone is the zone of the proxy's node, for topology hints.
	Zone string `json:"zone,omitempty"`
	// Endpoints are the service port's endpoints, all on port 80.
	Endpoints []VectorEndpoint `json:"endpoints"`
	// VectorOutcomes are the traffic outcomes in every mode but those of
	// ByMode; empty in a case with eligibility expectations only.
	VectorOutcomes
	// ExternalMasquerade says external flows reach the endpoints SNATed.
	ExternalMasquerade bool `json:"externalMasquerade,omitempty"`
	// ByMode holds the outcomes of a mode ("iptables", "nftables", "ipvs")
	// that differ; a field left empty keeps the common outcome.
	ByMode map[string]VectorOutcomes `json:"byMode,omitempty"`
	// Eligibility is what endpoint categorisation returns, if the case
	// checks it.
	Eligibility *VectorEligibility `json:"eligibility,omitempty"`
}

// VectorService is a service port 172.30.1.1:80 of the vectors.
type VectorService struct {
	// Type is "ClusterIP" (the file's default), "NodePort" or
	// "LoadBalancer".
	Type string `json:"type,omitempty"`
	// NodePort is the node port, 0 for none; external flows enter by it.
	NodePort int32 `json:"nodePort,omitempty"`
	// InternalLocal is internalTrafficPolicy Local.
	InternalLocal bool `json:"internalLocal,omitempty"`
	// ExternalLocal is externalTrafficPolicy Local.
	ExternalLocal bool `json:"externalLocal,omitempty"`
}

// VectorEndpoint is one endpoint 10.0.1.x:80 of the vectors.
type VectorEndpoint struct {
	// IP is the endpoint's address.
	IP string `json:"ip"`
	// Node is "local" (the proxy's node) or "remote".
	Node string `json:"node"`
	// Cond holds R (ready), S (serving) and T (terminating), each present
	// or not.
	Cond string `json:"cond"`
	// ZoneHints are the endpoint's zone hints.
	ZoneHints []string `json:"zoneHints,omitempty"`
}

// VectorOutcomes are the outcomes of the two flows: "DROP", "REJECT" or the
// endpoints reached, "ip:port, ip:port" in kube-proxy's order.
type VectorOutcomes struct {
	// Pod is a pod on the proxy's node to the cluster IP.
	Pod string `json:"pod,omitempty"`
	// External is a client outside the cluster to the node port; empty
	// when the case has no external flow.
	External string `json:"external,omitempty"`
}

// VectorEligibility is endpoint categorisation's result: the IPs of each
// set, whether any endpoint exists, and the topology used.
type VectorEligibility struct {
	// Cluster are the endpoints for traffic under the Cluster policy.
	Cluster []string `json:"cluster,omitempty"`
	// Local are the endpoints for traffic under the Local policy.
	Local []string `json:"local,omitempty"`
	// Reachable are all endpoints some traffic can reach.
	Reachable []string `json:"reachable,omitempty"`
	// HasAny says the service port has any endpoint at all.
	HasAny bool `json:"hasAny"`
	// Topology is the topology mode used, "" for none.
	Topology string `json:"topology,omitempty"`
}

// Local reports whether the endpoint is on the proxy's node.
func (e VectorEndpoint) Local() bool { return e.Node == "local" }

// Ready reports the endpoint's ready condition.
func (e VectorEndpoint) Ready() bool { return strings.Contains(e.Cond, "R") }

// Serving reports the endpoint's serving condition.
func (e VectorEndpoint) Serving() bool { return strings.Contains(e.Cond, "S") }

// Terminating reports the endpoint's terminating condition.
func (e VectorEndpoint) Terminating() bool { return strings.Contains(e.Cond, "T") }

// HasTraffic reports whether the case has traffic outcomes to check.
func (v Vector) HasTraffic() bool { return v.Pod != "" }

// Outcomes are the case's traffic outcomes in mode, "" for the default
// mode (iptables).
func (v Vector) Outcomes(mode string) VectorOutcomes {
	o := v.VectorOutcomes
	if m, ok := v.ByMode[mode]; ok {
		if m.Pod != "" {
			o.Pod = m.Pod
		}
		if m.External != "" {
			o.External = m.External
		}
	}
	return o
}

// ReferenceVectors returns the cases of testdata/vectors.yaml, failing t if
// the file does not parse or a case is malformed.
func ReferenceVectors(t testing.TB) []Vector {
	t.Helper()
	vs, err := parseVectors(vectorsYAML)
	if err != nil {
		t.Fatalf("testdata/vectors.yaml: %v", err)
	}
	return vs
}

// TrafficVectors returns the reference vectors with traffic outcomes.
func TrafficVectors(t testing.TB) []Vector {
	t.Helper()
	return slices.DeleteFunc(ReferenceVectors(t), func(v Vector) bool { return !v.HasTraffic() })
}

func parseVectors(data []byte) ([]Vector, error) {
	var f struct {
		Cases []Vector `json:"cases"`
	}
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("could not parse: %w", err)
	}
	seen := map[string]bool{}
	for i := range f.Cases {
		if f.Cases[i].Service.Type == "" {
			f.Cases[i].Service.Type = "ClusterIP"
		}
		v := f.Cases[i]
		if v.Name == "" || seen[v.Name] {
			return nil, fmt.Errorf("case %d: name %q is empty or not unique", i+1, v.Name)
		}
		seen[v.Name] = true
		if err := v.check(); err != nil {
			return nil, fmt.Errorf("case %q: %w", v.Name, err)
		}
	}
	return f.Cases, nil
}

// check validates one case: known values, and expectations to check.
func (v Vector) check() error {
	switch {
	case !slices.Contains([]string{"ClusterIP", "NodePort", "LoadBalancer"}, v.Service.Type):
		return fmt.Errorf("unknown service type %q", v.Service.Type)
	case !v.HasTraffic() && v.Eligibility == nil:
		return fmt.Errorf("no expectation: neither pod nor eligibility")
	case v.External != "" && v.Service.NodePort == 0:
		return fmt.Errorf("an external outcome needs a node port to enter by")
	case v.ExternalMasquerade && v.External == "":
		return fmt.Errorf("externalMasquerade without an external outcome")
	}
	for mode := range v.ByMode {
		if !slices.Contains([]string{"iptables", "nftables", "ipvs"}, mode) {
			return fmt.Errorf("byMode: unknown mode %q", mode)
		}
	}
	for _, e := range v.Endpoints {
		if e.Node != "local" && e.Node != "remote" {
			return fmt.Errorf("endpoint %s: node %q is neither local nor remote", e.IP, e.Node)
		}
		if strings.Trim(e.Cond, "RST") != "" {
			return fmt.Errorf("endpoint %s: cond %q has letters other than R, S, T", e.IP, e.Cond)
		}
	}
	return nil
}
