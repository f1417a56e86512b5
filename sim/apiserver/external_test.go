package apiserver

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/sim/scenario"
)

// externalScenario has one Service of each external kind: a LoadBalancer
// with externalTrafficPolicy Local (no healthCheckNodePort given: the
// expansion allocates one), ingress addresses in both ipModes and a
// hostname, source ranges (one padded with spaces, as the API allows); a
// ClusterIP Service with external IPs (one IPv6, ignored); a LoadBalancer
// whose source ranges include a zero CIDR (allow any).
const externalScenario = `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: external}
cluster:
  nodes: [{name: node-a}, {name: node-b}]
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: shop, namespace: demo}
  spec:
    type: LoadBalancer
    clusterIP: 10.96.0.10
    externalTrafficPolicy: Local
    loadBalancerSourceRanges: ["203.0.113.0/25", " 198.51.100.0/24 "]
    ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30000}]
  status:
    loadBalancer:
      ingress:
      - {ip: 192.0.2.10}
      - {ip: 192.0.2.11, ipMode: Proxy}
      - {hostname: lb.example.com}
- apiVersion: v1
  kind: Service
  metadata: {name: ext, namespace: demo}
  spec:
    clusterIP: 10.96.0.11
    externalIPs: ["192.0.2.20", "2001:db8::20", "192.0.2.21"]
    externalTrafficPolicy: Local
    ports: [{name: http, port: 80, targetPort: 8080}]
- apiVersion: v1
  kind: Service
  metadata: {name: open, namespace: demo}
  spec:
    type: LoadBalancer
    clusterIP: 10.96.0.12
    loadBalancerSourceRanges: ["10.0.0.0/8", "0.0.0.0/0"]
    ports: [{name: http, port: 80, targetPort: 8080}]
  status:
    loadBalancer:
      ingress: [{ip: 192.0.2.30, ipMode: VIP}]
`

// TestExternalFieldsReachTheModel holds the cluster model's external
// fields against the scenario on both ways into the API (loaded into the
// fake clientset, and written through it as over a real API server, where
// the status goes through the status subresource): external IPs of the
// IPv4 family, the VIP-mode ingress addresses apart from the Proxy-mode
// ones, trimmed source ranges (none when one is a zero CIDR), the
// healthCheckNodePort allocated as the API server allocates it (the lowest
// free port after the Service's node ports) and kept when the policy stays
// Local, released when it becomes Cluster and allocated again when it goes
// back to Local.
func TestExternalFieldsReachTheModel(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "external.yaml")
	if err := os.WriteFile(file, []byte(externalScenario), 0o644); err != nil {
		t.Fatal(err)
	}
	addrs := func(l ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range l {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			m := p.open(t, file)
			st := m.State
			shop := st.Services[spn("demo", "shop", "http")]
			if shop == nil {
				t.Fatal("no demo/shop:http")
			}
			if !slices.Equal(shop.LoadBalancerIPs, addrs("192.0.2.10")) || !slices.Equal(shop.ProxyIPs, addrs("192.0.2.11")) {
				t.Errorf("shop ingress: VIP %v, Proxy %v", shop.LoadBalancerIPs, shop.ProxyIPs)
			}
			if want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("198.51.100.0/24")}; !slices.Equal(shop.SourceRanges, want) {
				t.Errorf("shop source ranges %v, want %v", shop.SourceRanges, want)
			}
			if !shop.ExternalLocal || shop.HealthCheckNodePort != scenario.NodePortMin+1 {
				t.Errorf("shop: Local %v, healthCheckNodePort %d, want Local and %d (the first free port after its node port)", shop.ExternalLocal, shop.HealthCheckNodePort, scenario.NodePortMin+1)
			}
			ext := st.Services[spn("demo", "ext", "http")]
			if !slices.Equal(ext.ExternalIPs, addrs("192.0.2.20", "192.0.2.21")) || !ext.ExternalLocal || ext.HealthCheckNodePort != 0 || ext.NodePort != 0 {
				t.Errorf("ext: external IPs %v, Local %v, health check %d, node port %d", ext.ExternalIPs, ext.ExternalLocal, ext.HealthCheckNodePort, ext.NodePort)
			}
			open := st.Services[spn("demo", "open", "http")]
			if len(open.SourceRanges) != 0 || !slices.Equal(open.LoadBalancerIPs, addrs("192.0.2.30")) {
				t.Errorf("open: source ranges %v (a zero CIDR allows any), ingress %v", open.SourceRanges, open.LoadBalancerIPs)
			}
			if open.NodePort == 0 || open.NodePort == shop.HealthCheckNodePort {
				t.Errorf("open: node port %d (shop's health check port is %d)", open.NodePort, shop.HealthCheckNodePort)
			}

			st, _ = applyDrain(t, m, Step{Action: ActServiceUpdate, Service: "demo/shop", Update: &scenarioEventT{ExternalTrafficPolicy: "Cluster"}})
			if sp := st.Services[spn("demo", "shop", "http")]; sp.ExternalLocal || sp.HealthCheckNodePort != 0 {
				t.Errorf("shop after Cluster: Local %v, health check %d", sp.ExternalLocal, sp.HealthCheckNodePort)
			}
			st, _ = applyDrain(t, m, Step{Action: ActServiceUpdate, Service: "demo/shop", Update: &scenarioEventT{ExternalTrafficPolicy: "Local"}})
			sp := st.Services[spn("demo", "shop", "http")]
			if !sp.ExternalLocal || sp.HealthCheckNodePort < scenario.NodePortMin || sp.HealthCheckNodePort == sp.NodePort || sp.HealthCheckNodePort == open.NodePort {
				t.Errorf("shop back to Local: Local %v, health check %d (node ports %d, %d)", sp.ExternalLocal, sp.HealthCheckNodePort, sp.NodePort, open.NodePort)
			}
			// The status survived the spec updates.
			got, err := m.Cluster.Client.CoreV1().Services("demo").Get(context.Background(), "shop", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Status.LoadBalancer.Ingress) != 3 {
				t.Errorf("status after the updates: %+v", got.Status.LoadBalancer)
			}
		})
	}
}
