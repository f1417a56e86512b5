package scenario

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The dumps a real kube-apiserver printed (make import-fixtures).
var importDumps = []string{"../../scenarios/testdata/import/kind.yaml", "../../scenarios/testdata/import/kubeadm.yaml"}

// TestImportDumpsLoad loads both cluster dumps unchanged, compares their
// warnings (every one positioned) with testdata/import/*.warnings, and
// expands them.
func TestImportDumpsLoad(t *testing.T) {
	for _, f := range importDumps {
		t.Run(filepath.Base(f), func(t *testing.T) {
			l, err := LoadFile(f)
			if err != nil {
				t.Fatalf("a real dump is rejected: %v", err)
			}
			var lines []string
			for _, w := range l.Warnings {
				if w.File != f || w.Pos.Line < 1 || w.Pos.Column < 1 || w.Field == "" {
					t.Errorf("warning without file:line:column and field: %+v", w)
				}
				lines = append(lines, w.Warning())
			}
			got := strings.Join(lines, "\n") + "\n"
			golden := filepath.Join("testdata", "import", strings.TrimSuffix(filepath.Base(f), ".yaml")+".warnings")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("missing golden file (run with -update): %v", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("warnings differ from %s (-want +got):\n%s", golden, diff)
			}
			if _, err := Expand(l, nil); err != nil {
				t.Fatalf("expand: %v", err)
			}
		})
	}
}

func expandFile(t *testing.T, f string) (*Loaded, *Expanded) {
	t.Helper()
	l, err := LoadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Expand(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l, e
}

func sliceOf(e *Expanded, ns, svc string) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, s := range e.Slices {
		if s.Namespace == ns && s.Labels[discoveryv1.LabelServiceName] == svc {
			out = append(out, s)
		}
	}
	return out
}

func serviceOf(e *Expanded, ns, name string) *corev1.Service {
	for _, s := range e.Services {
		if s.Namespace == ns && s.Name == name {
			return s
		}
	}
	return nil
}

// TestImportKind: the kind dump as kube-proxy sees it.
func TestImportKind(t *testing.T) {
	l, e := expandFile(t, importDumps[0])
	c := l.Scenario.Cluster
	if c.ServiceCIDR != "10.96.0.0/16" || c.PodCIDR != "10.244.0.0/16" || c.NodeNetwork != "172.18.0.0/16" {
		t.Errorf("inferred ranges %s, %s, %s; want 10.96.0.0/16, 10.244.0.0/16, 172.18.0.0/16", c.ServiceCIDR, c.PodCIDR, c.NodeNetwork)
	}
	if len(e.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(e.Nodes))
	}
	for _, n := range e.Nodes {
		if ip, _ := NodeIPv4(n); !strings.HasPrefix(ip.String(), "172.18.0.") {
			t.Errorf("node %s has address %v, want its InternalIP", n.Name, ip)
		}
	}
	// default/kubernetes points at the control plane's node address.
	k := sliceOf(e, "default", "kubernetes")
	if len(k) != 1 || len(k[0].Endpoints) != 1 || k[0].Endpoints[0].Addresses[0] != "172.18.0.3" || *k[0].Ports[0].Port != 6443 {
		t.Fatalf("default/kubernetes slice: %+v", k)
	}
	var types []string
	for _, ch := range l.Scenario.Checks {
		types = append(types, ch.Type+":"+ch.Service+":"+ch.Port)
	}
	want := []string{"distribution:default/web:", "distribution:kube-system/kube-dns:dns", "distribution:kube-system/kube-dns:dns-tcp", "distribution:kube-system/kube-dns:metrics"}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Errorf("default checks (-want +got):\n%s", diff)
	}
	if l.Scenario.Traffic == nil || len(l.Scenario.Traffic.Clients) != 1 || l.Scenario.Traffic.Connections != ImportConnections {
		t.Errorf("traffic section: %+v", l.Scenario.Traffic)
	}
}

// TestImportKubeadm: ExternalName and headless without rules, SCTP, the
// IPv4 half of a dual-stack Service, the IPv6 slice dropped, host-network
// endpoints, and the hints of trafficDistribution on generated slices.
func TestImportKubeadm(t *testing.T) {
	l, e := expandFile(t, importDumps[1])
	if s := serviceOf(e, "shop", "payments"); s == nil || s.Spec.Type != corev1.ServiceTypeExternalName || s.Spec.ClusterIP != "" {
		t.Errorf("ExternalName Service: %+v", s)
	}
	if s := serviceOf(e, "shop", "sig"); s == nil || s.Spec.Ports[0].Protocol != corev1.ProtocolSCTP {
		t.Errorf("SCTP Service: %+v", s)
	}
	cart := serviceOf(e, "shop", "cart")
	if cart == nil || !strings.Contains(cart.Spec.ClusterIP, ".") || len(cart.Spec.ClusterIPs) != 1 || cart.Spec.ClusterIPs[0] != cart.Spec.ClusterIP {
		t.Fatalf("dual-stack Service not reduced to its IPv4 part: %+v", cart)
	}
	// RequireDualStack with one ClusterIP is what an API server refuses.
	if p := cart.Spec.IPFamilyPolicy; p == nil || *p != corev1.IPFamilyPolicySingleStack {
		t.Errorf("dual-stack Service reduced to IPv4 keeps ipFamilyPolicy %v, want SingleStack", p)
	}
	for _, s := range sliceOf(e, "shop", "cart") {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			t.Errorf("IPv6 slice %s kept", s.Name)
		}
	}
	if n := len(sliceOf(e, "shop", "cart")); n != 1 {
		t.Errorf("cart has %d slices, want the IPv4 one", n)
	}
	for _, n := range e.Nodes {
		if len(n.Spec.PodCIDRs) != 1 || !strings.HasPrefix(n.Spec.PodCIDR, "192.168.") {
			t.Errorf("node %s pod CIDRs %v, want its IPv4 block only", n.Name, n.Spec.PodCIDRs)
		}
	}
	exp := sliceOf(e, "monitoring", "node-exporter")
	if len(exp) != 1 || len(exp[0].Endpoints) != 3 || !strings.HasPrefix(exp[0].Endpoints[0].Addresses[0], "10.0.0.") {
		t.Errorf("host-network endpoints: %+v", exp)
	}
	// zonal (PreferSameZone) and nodelocal (PreferSameNode) have no slice in
	// the dump: the scenario makes them, with the controller's hints.
	hints := map[string]string{}
	for _, svc := range []string{"zonal", "nodelocal"} {
		sl := sliceOf(e, "shop", svc)
		if len(sl) != 1 {
			t.Fatalf("%s: %d generated slices, want 1", svc, len(sl))
		}
		for _, ep := range sl[0].Endpoints {
			h := "none"
			if ep.Hints != nil {
				var parts []string
				for _, z := range ep.Hints.ForZones {
					parts = append(parts, "zone "+z.Name)
				}
				for _, n := range ep.Hints.ForNodes {
					parts = append(parts, "node "+n.Name)
				}
				h = strings.Join(parts, ", ")
			}
			hints[svc+" "+ep.TargetRef.Name] = h
		}
	}
	want := map[string]string{
		"zonal zonal-a": "zone zone-a", "zonal zonal-b": "zone zone-b", "zonal zonal-c": "none", // not ready: no hint
		"nodelocal nodelocal-a": "zone zone-b, node worker-1", "nodelocal nodelocal-b": "zone zone-c, node worker-2",
	}
	if diff := cmp.Diff(want, hints); diff != "" {
		t.Errorf("hints (-want +got):\n%s", diff)
	}
	// The LoadBalancer keeps what kube-proxy reads of it: external IPs,
	// source ranges, the health check node port and the status's ingress.
	var store *corev1.Service
	for _, svc := range e.Services {
		if svc.Namespace == "shop" && svc.Name == "storefront" {
			store = svc
		}
	}
	if store == nil {
		t.Fatal("shop/storefront not imported")
	}
	if got := fmt.Sprint(store.Spec.ExternalIPs, store.Spec.LoadBalancerSourceRanges, store.Spec.HealthCheckNodePort != 0, len(store.Status.LoadBalancer.Ingress)); got != "[203.0.113.80] [198.51.100.0/24] true 2" {
		t.Errorf("storefront: externalIPs, ranges, health check port set, ingress count = %s", got)
	} else if in := store.Status.LoadBalancer.Ingress; in[0].IP != "192.0.2.80" || in[1].IPMode == nil || *in[1].IPMode != corev1.LoadBalancerIPModeProxy {
		t.Errorf("storefront ingress %+v", in)
	}
	var checks []string
	for _, c := range l.Scenario.Checks {
		checks = append(checks, c.Type+":"+c.Service+":"+c.Port)
	}
	wantChecks := []string{"distribution:kube-system/kube-dns:dns", "distribution:kube-system/kube-dns:dns-tcp", "distribution:shop/cart:",
		"affinity:shop/session:", "internal-traffic-local:shop/agent:", "distribution:shop/db:", "distribution:shop/storefront:"}
	slices.Sort(checks)
	slices.Sort(wantChecks)
	if diff := cmp.Diff(wantChecks, checks); diff != "" {
		t.Errorf("default checks (-want +got):\n%s", diff)
	}
}

// TestImportRoundTrip: sim import's scenario loads as a Scenario and
// expands to the same objects as the dump itself.
func TestImportRoundTrip(t *testing.T) {
	for _, f := range importDumps {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			text, dl, err := Import(f, data, "out.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(text), "\nkind: Scenario\n") {
				t.Fatalf("not a scenario:\n%s", text[:200])
			}
			l, err := Load("out.yaml", text)
			if err != nil {
				t.Fatal(err)
			}
			a, err := Expand(dl, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Expand(l, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(a.Nodes, b.Nodes); diff != "" {
				t.Errorf("nodes differ (-dump +imported):\n%s", diff)
			}
			if diff := cmp.Diff(a.Services, b.Services); diff != "" {
				t.Errorf("services differ (-dump +imported):\n%s", diff)
			}
			if diff := cmp.Diff(a.Slices, b.Slices); diff != "" {
				t.Errorf("slices differ (-dump +imported):\n%s", diff)
			}
			if diff := cmp.Diff(dl.Scenario.Checks, l.Scenario.Checks); diff != "" {
				t.Errorf("checks differ (-dump +imported):\n%s", diff)
			}
			// Importing a scenario is refused.
			if _, _, err := Import("out.yaml", text, "again.yaml"); err == nil || !IsInvalid(err) ||
				err.Error() != "out.yaml:1:1: not a cluster dump: expected what kubectl get -o yaml prints (a v1 List or Kubernetes objects); a Scenario needs no import" {
				t.Errorf("import of a scenario: %v", err)
			}
		})
	}
}

// A scenario with two nodes of known addresses, for the cases below.
const importBase = `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: t}
cluster:
  nodes:
    - {name: node-a, ip: 198.18.0.10, podCIDR: 10.244.0.0/24}
    - {name: node-b, ip: 198.18.0.11, podCIDR: 10.244.1.0/24}
objects:
`

// TestNewlyAccepted: each construct a real cluster has that used to be
// rejected loads, with the warning it should carry (or none).
func TestNewlyAccepted(t *testing.T) {
	svc := func(extra string) string {
		return "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, ports: [{port: 80" + extra + "}]}}\n"
	}
	slice := func(addrType, ep, port string) string {
		return "  - {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: s-1, namespace: d, labels: {kubernetes.io/service-name: s}}, addressType: " + addrType +
			", ports: [{port: 8080" + port + "}], endpoints: [" + ep + "]}\n"
	}
	cases := []struct {
		name, objects string
		warnings      []string
	}{
		{"host-network endpoint (the node's address)", svc("") + slice("IPv4", "{addresses: [198.18.0.11], nodeName: node-b}", ""), nil},
		{"kubernetes endpoint on a control-plane address that is no node's", svc("") + slice("IPv4", "{addresses: [203.0.113.7]}", ""), nil},
		{"endpoint without node at a node address", svc("") + slice("IPv4", "{addresses: [198.18.0.10]}", ""), nil},
		{"ExternalName", "  - {apiVersion: v1, kind: Service, metadata: {name: e, namespace: d}, spec: {type: ExternalName, externalName: a.example.com}}\n", nil},
		{"headless without ports", "  - {apiVersion: v1, kind: Service, metadata: {name: h, namespace: d}, spec: {clusterIP: None, selector: {app: h}}}\n", nil},
		{"SCTP", svc(", protocol: SCTP") + slice("IPv4", "{addresses: [10.244.0.5], nodeName: node-a}", ", protocol: SCTP"), nil},
		{"trafficDistribution", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, trafficDistribution: PreferSameNode, ports: [{port: 80}]}}\n", nil},
		{"IPv6 slice", svc("") + slice("IPv6", `{addresses: ["fd00::5"]}`, ""),
			[]string{"x.yaml:10:151: warning: objects[1].addressType: EndpointSlice d/s-1 (IPv6) ignored: kube-proxy here uses IPv4 slices only"}},
		{"FQDN slice", svc("") + slice("FQDN", `{addresses: ["a.example.com"]}`, ""),
			[]string{"x.yaml:10:151: warning: objects[1].addressType: EndpointSlice d/s-1 (FQDN) ignored: kube-proxy here uses IPv4 slices only"}},
		{"dual-stack IPv6 primary", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: \"fd00::5\", clusterIPs: [\"fd00::5\", 10.96.0.5], ipFamilies: [IPv6, IPv4], ports: [{port: 80}]}}\n",
			[]string{"x.yaml:9:113: warning: objects[0].spec.clusterIPs: Service d/s is dual-stack: its IPv4 ClusterIP 10.96.0.5 is used, IPv6 fd00::5 ignored"}},
		{"IPv6-only Service and its slice", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: \"fd00::5\", ports: [{port: 80}]}}\n" + slice("IPv4", "{addresses: [10.244.0.5], nodeName: node-a}", ""),
			[]string{"x.yaml:9:90: warning: objects[0].spec.clusterIP: Service d/s ignored: it has only IPv6 ClusterIPs (fd00::5), and IPv4 is what is modelled"}},
		{"server-printed object of another kind", "  - {apiVersion: apps/v1, kind: Deployment, metadata: {name: x, namespace: d, uid: 1, resourceVersion: \"5\"}}\n",
			[]string{"x.yaml:9:18: warning: objects[0].apiVersion: apps/v1 Deployment ignored: kube-proxy reads only v1 Node, Pod, Service and discovery.k8s.io/v1 EndpointSlice"}},
		{"server-printed object with a field this build does not know", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d, uid: 1}, spec: {clusterIP: 10.96.0.5, futureField: 1, ports: [{port: 80}]}}\n",
			[]string{`x.yaml:9:109: warning: objects[0].spec.futureField: unknown field "futureField": ignored (the object was printed by an API server newer than this build's k8s.io/api)`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Load("x.yaml", []byte(importBase+c.objects))
			if err != nil {
				t.Fatalf("rejected: %v", err)
			}
			if _, err := Expand(l, nil); err != nil {
				t.Fatalf("expand: %v", err)
			}
			var got []string
			for _, w := range l.Warnings {
				got = append(got, w.Warning())
			}
			if diff := cmp.Diff(c.warnings, got); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStillRejected: what is still wrong in a real dump's constructs is
// an error with file:line:column, field and message.
func TestStillRejected(t *testing.T) {
	cases := []struct{ name, objects, want string }{
		{"endpoint on a node, outside its block and not its address",
			"  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}}\n" +
				"  - {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: s-1, namespace: d, labels: {kubernetes.io/service-name: s}}, addressType: IPv4, ports: [{port: 80}], endpoints: [{addresses: [198.18.0.10], nodeName: node-b}]}\n",
			"x.yaml:10:203: objects[1].endpoints[0].addresses[0]: 198.18.0.10 is not inside the cluster's podCIDR 10.244.0.0/16"},
		{"endpoint inside the service range",
			"  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}}\n" +
				"  - {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: s-1, namespace: d, labels: {kubernetes.io/service-name: s}}, addressType: IPv4, ports: [{port: 80}], endpoints: [{addresses: [10.96.0.9]}]}\n",
			"x.yaml:10:203: objects[1].endpoints[0].addresses[0]: 10.96.0.9 is inside cluster.serviceCIDR 10.96.0.0/16: an endpoint is a pod's or a host's address"},
		{"unknown protocol", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, ports: [{port: 80, protocol: ICMP}]}}\n",
			"x.yaml:9:130: objects[0].spec.ports[0].protocol: unknown protocol \"ICMP\" (TCP, UDP or SCTP)"},
		{"ExternalName without a name", "  - {apiVersion: v1, kind: Service, metadata: {name: e, namespace: d}, spec: {type: ExternalName}}\n",
			"x.yaml:9:78: objects[0].spec.externalName: required for an ExternalName Service"},
		{"bad trafficDistribution", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, trafficDistribution: Nearby, ports: [{port: 80}]}}\n",
			"x.yaml:9:122: objects[0].spec.trafficDistribution: unknown value \"Nearby\" (PreferClose, PreferSameZone or PreferSameNode)"},
		{"two IPv4 cluster IPs", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, clusterIPs: [10.96.0.5, 10.96.0.6], ports: [{port: 80}]}}\n",
			"x.yaml:9:113: objects[0].spec.clusterIPs: a Service has at most one IPv4 ClusterIP, got 10.96.0.5, 10.96.0.6"},
		{"a check on an ExternalName Service",
			"  - {apiVersion: v1, kind: Service, metadata: {name: e, namespace: d}, spec: {type: ExternalName, externalName: a.example.com}}\nchecks:\n  - {type: distribution, service: d/e}\n",
			"x.yaml:11:35: checks[0].service: Service d/e is an ExternalName Service (a DNS name): kube-proxy programs nothing for it, so there is nothing to check"},
		{"unknown field in a hand-written object", "  - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: d}, spec: {clusterIP: 10.96.0.5, futureField: 1, ports: [{port: 80}]}}\n",
			"x.yaml:9:101: objects[0].spec.futureField: unknown field \"futureField\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Load("x.yaml", []byte(importBase+c.objects))
			if err == nil {
				_, err = Expand(l, nil)
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("want an ErrorList, got %v", err)
			}
			if got := list.Error(); got != c.want {
				t.Errorf("got\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

// TestDumpShapes: a List, one object, several documents and a List per
// kind all load, with the object paths kubectl's shapes give.
func TestDumpShapes(t *testing.T) {
	node := "{apiVersion: v1, kind: Node, metadata: {name: n1, uid: a, resourceVersion: \"1\"}, spec: {podCIDR: 10.244.0.0/24}, status: {addresses: [{type: InternalIP, address: 10.0.0.1}, {type: Hostname, address: n1}]}}"
	svc := "{apiVersion: v1, kind: Service, metadata: {name: s, namespace: d, uid: b, resourceVersion: \"2\"}, spec: {clusterIP: 10.96.0.5, ports: [{port: 80, protocol: TCP, targetPort: 80}]}}"
	cases := []struct {
		name, text string
		paths      []string
	}{
		{"List", "apiVersion: v1\nkind: List\nitems:\n- " + node + "\n- " + svc + "\n", []string{"items[0]", "items[1]"}},
		{"one object", node + "\n", []string{"documents[0]"}},
		{"documents", "---\n" + node + "\n---\n" + svc + "\n---\n", []string{"documents[0]", "documents[1]"}},
		{"a List per kind", "apiVersion: v1\nkind: NodeList\nitems: [" + node + "]\n", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Load("d.yaml", []byte(c.text))
			if c.paths == nil {
				// kubectl get -o yaml prints kind: List, never NodeList; a
				// typed list is named as such.
				if err == nil || !strings.Contains(err.Error(), "NodeList") {
					t.Fatalf("want a rejection naming NodeList, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, o := range l.Scenario.Objects {
				paths = append(paths, o.Path)
			}
			if diff := cmp.Diff(c.paths, paths); diff != "" {
				t.Errorf("paths (-want +got):\n%s", diff)
			}
			if l.Scenario.Metadata.Name != "d" || l.Scenario.Cluster.NodeNetwork != "10.0.0.0/16" {
				t.Errorf("scenario: %+v", l.Scenario.Metadata)
			}
		})
	}
}

// TestNodesFromEndpoints: without Node objects, the nodes are the ones the
// endpoints name, in name order, each with the /24 (or wider) block that
// holds its endpoints unless that overlaps a block already taken; an
// empty node name makes no node, and none named gives node-1.
func TestNodesFromEndpoints(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	taken := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}
	nodes, blocks := nodesFromEndpoints(map[string][]netip.Addr{
		"b": addrs("10.244.1.5", "10.244.2.7"), // 10.244.0.0/22: holds a's block
		"a": addrs("10.244.0.9"),               // 10.244.0.0/24
		"c": addrs("10.244.3.4"),               // in the block taken before
		"":  addrs("10.244.9.9"),
	}, taken)
	want := []NodeSpec{{Name: "a", PodCIDR: "10.244.0.0/24"}, {Name: "b"}, {Name: "c"}}
	if diff := cmp.Diff(want, nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if got := fmt.Sprint(blocks); got != "[10.244.3.0/24 10.244.0.0/24]" {
		t.Errorf("blocks %s, want the taken one and a's", got)
	}
	nodes, _ = nodesFromEndpoints(map[string][]netip.Addr{"": addrs("10.244.9.9")}, nil)
	if diff := cmp.Diff([]NodeSpec{{Name: "node-1"}}, nodes); diff != "" {
		t.Errorf("no node named (-want +got):\n%s", diff)
	}
}

// TestImportRanges: each range is the smallest prefix over what the dump
// uses (the default when it uses none), widened towards /16 until the
// next step would overlap another range.
func TestImportRanges(t *testing.T) {
	a := &dumpAddrs{
		svcIPs:    []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		podBlocks: []netip.Prefix{netip.MustParsePrefix("10.96.128.0/24")},
	}
	svc, pod, node := importRanges(a)
	if svc.String() != "10.96.0.0/17" || pod.String() != "10.96.128.0/17" || node.String() != DefaultNodeNetwork {
		t.Errorf("ranges %s %s %s, want 10.96.0.0/17 10.96.128.0/17 %s", svc, pod, node, DefaultNodeNetwork)
	}
	a.podBlocks = nil
	if _, pod, _ := importRanges(a); pod.String() != DefaultPodCIDR {
		t.Errorf("no pod address: %s, want the default %s", pod, DefaultPodCIDR)
	}
}
