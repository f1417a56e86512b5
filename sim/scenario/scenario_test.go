package scenario

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestInvalidCorpus loads every malformed scenario and compares the complete
// error report with its golden file. Every error must carry a position and,
// except for document-level problems, a field path.
func TestInvalidCorpus(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) < 30 {
		t.Fatalf("the corpus must hold at least 30 malformed scenarios, found %d", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			l, err := LoadFile(f)
			if err == nil {
				_, err = Expand(l, nil)
			}
			if err == nil {
				t.Fatal("accepted a malformed scenario")
			}
			var list ErrorList
			if !errors.As(err, &list) || !IsInvalid(err) {
				t.Fatalf("error is not an ErrorList: %v", err)
			}
			for _, e := range list {
				if e.File != f || e.Pos.Line < 1 || e.Pos.Column < 1 {
					t.Errorf("error without file:line:column: %+v", e)
				}
				documentLevel := strings.HasPrefix(e.Message, "YAML syntax") || strings.Contains(e.Message, "one YAML document")
				if e.Field == "" && !documentLevel {
					t.Errorf("error without a field path: %v", e)
				}
			}
			got := list.Error() + "\n"
			golden := strings.TrimSuffix(f, ".yaml") + ".err"
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
				t.Errorf("error report differs from %s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

// TestProjectScenarios keeps every shipped scenario valid.
func TestProjectScenarios(t *testing.T) {
	files, _ := filepath.Glob("../../scenarios/*.yaml")
	more, _ := filepath.Glob("../../scenarios/*/*.yaml")
	files = append(files, more...)
	files = append(files, "testdata/valid-base.yaml")
	if len(files) < 8 {
		t.Fatalf("expected the project's scenarios, found %v", files)
	}
	for _, f := range files {
		l, err := LoadFile(f)
		if err == nil {
			_, err = Expand(l, nil)
		}
		if err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func expand(t *testing.T, file string, seed *uint64) *Expanded {
	t.Helper()
	l, err := LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := Expand(l, seed)
	if err != nil {
		t.Fatal(err)
	}
	return exp
}

func objectsJSON(t *testing.T, e *Expanded) string {
	t.Helper()
	b, err := json.Marshal([]any{e.Nodes, e.Services, e.Slices, e.Pods, e.Generated})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestExpandDeterministic(t *testing.T) {
	a := objectsJSON(t, expand(t, "../../scenarios/1000-services.yaml", nil))
	b := objectsJSON(t, expand(t, "../../scenarios/1000-services.yaml", nil))
	if a != b {
		t.Fatal("the same seed gave different objects")
	}
	other := uint64(7)
	c := objectsJSON(t, expand(t, "../../scenarios/1000-services.yaml", &other))
	if a == c {
		t.Fatal("a different seed gave the same objects")
	}
}

// TestGeneratorCounts checks that the generator realises its parameters
// exactly: fractions are rounded counts, not draws.
func TestGeneratorCounts(t *testing.T) {
	e := expand(t, "../../scenarios/1000-services.yaml", nil)
	g := e.Scenario.Generate
	gc := e.Generated
	want := GeneratedCounts{
		Services:                   g.Services,
		ServicePorts:               g.Services * g.Ports.PerService,
		SessionAffinity:            60,
		InternalTrafficPolicyLocal: 60,
		ExternalTrafficPolicyLocal: 30,
		NamedPorts:                 500,
		UDPPorts:                   100,
	}
	if gc.Services != want.Services || gc.ServicePorts != want.ServicePorts || gc.SessionAffinity != want.SessionAffinity ||
		gc.InternalTrafficPolicyLocal != want.InternalTrafficPolicyLocal || gc.ExternalTrafficPolicyLocal != want.ExternalTrafficPolicyLocal ||
		gc.NamedPorts != want.NamedPorts || gc.UDPPorts != want.UDPPorts {
		t.Errorf("counts %+v, want %+v", *gc, want)
	}
	if gc.MinEndpoints < g.EndpointsPerService.Min || gc.MaxEndpoints > g.EndpointsPerService.Max {
		t.Errorf("endpoints per service %d..%d outside %d..%d", gc.MinEndpoints, gc.MaxEndpoints, g.EndpointsPerService.Min, g.EndpointsPerService.Max)
	}
	if want := int(0.02*float64(gc.Endpoints) + 0.5); gc.NotReadyEndpoints != want {
		t.Errorf("not ready endpoints %d, want %d", gc.NotReadyEndpoints, want)
	}
	if want := int(0.01*float64(gc.Endpoints) + 0.5); gc.TerminatingEndpoints != want {
		t.Errorf("terminating endpoints %d, want %d", gc.TerminatingEndpoints, want)
	}
	// A Zipf skew: most Services small, a few large.
	small, large := 0, 0
	n := 0
	for _, s := range e.Slices {
		n += len(s.Endpoints)
	}
	if n != gc.Endpoints {
		t.Errorf("slices hold %d endpoints, counts say %d", n, gc.Endpoints)
	}
	per := map[string]int{}
	for _, s := range e.Slices {
		per[s.Namespace+"/"+s.Labels["kubernetes.io/service-name"]] += len(s.Endpoints)
	}
	for _, k := range per {
		if k <= 5 {
			small++
		}
		if k >= 30 {
			large++
		}
	}
	if small < 400 || large < 20 || large > small {
		t.Errorf("endpoint counts not skewed: %d services with <= 5, %d with >= 30", small, large)
	}
}

func TestSliceSplitting(t *testing.T) {
	data := []byte(`apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: split}
cluster:
  nodeCount: 3
  nodeCIDRMaskSize: 22
generate:
  services: 2
  endpointsPerService: {kind: fixed, value: 250}
`)
	l, err := Load("split.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Expand(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, s := range e.Slices {
		sizes = append(sizes, len(s.Endpoints))
		if !strings.HasPrefix(s.Name, s.Labels["kubernetes.io/service-name"]+"-") || len(s.Name) != len(s.Labels["kubernetes.io/service-name"])+6 {
			t.Errorf("slice name %q is not <service>-<5 chars>", s.Name)
		}
	}
	if diff := cmp.Diff([]int{100, 100, 50, 100, 100, 50}, sizes); diff != "" {
		t.Errorf("slice sizes (-want +got):\n%s", diff)
	}
	// Spread placement: 250 endpoints over 3 nodes differ by at most one.
	perNode := map[string]int{}
	for _, s := range e.Slices[:3] {
		for _, ep := range s.Endpoints {
			perNode[*ep.NodeName]++
		}
	}
	for n, c := range perNode {
		if c < 83 || c > 84 {
			t.Errorf("node %s got %d endpoints of 250 under spread placement", n, c)
		}
	}
}

// TestDerivedSlices: a Service with a selector and Pods but no EndpointSlice
// gets the slices the controller would write.
func TestDerivedSlices(t *testing.T) {
	data := []byte(`apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: pods}
cluster:
  nodes: [{name: n1}, {name: n2}]
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec:
    selector: {app: web}
    ports: [{name: http, port: 80, targetPort: web}]
- apiVersion: v1
  kind: Pod
  metadata: {name: web-1, labels: {app: web}}
  spec:
    nodeName: n1
    containers: [{name: c, image: x, ports: [{name: web, containerPort: 8080}]}]
  status:
    podIP: 10.244.0.5
    conditions: [{type: Ready, status: "True"}]
- apiVersion: v1
  kind: Pod
  metadata: {name: web-2, labels: {app: web}, deletionTimestamp: "2026-01-01T00:00:00Z"}
  spec:
    nodeName: n2
    containers: [{name: c, image: x}]
  status:
    podIP: 10.244.1.5
    conditions: [{type: Ready, status: "True"}]
`)
	l, err := Load("pods.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Expand(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Slices) != 1 || len(e.Slices[0].Endpoints) != 2 {
		t.Fatalf("want one slice with two endpoints, got %+v", e.Slices)
	}
	s := e.Slices[0]
	if *s.Ports[0].Port != 8080 || *s.Ports[0].Name != "http" {
		t.Errorf("named targetPort not resolved: %+v", s.Ports[0])
	}
	ep := s.Endpoints[1]
	if *ep.Conditions.Ready || !*ep.Conditions.Serving || !*ep.Conditions.Terminating {
		t.Errorf("a deleted ready pod must be serving and terminating, not ready: %+v", ep.Conditions)
	}
}

func TestPositionsOfNestedFields(t *testing.T) {
	l, err := LoadFile("testdata/valid-base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p := l.PosOf("objects[0].spec.ports[0].targetPort"); p.Line != 20 || p.Column != 23 {
		t.Errorf("position of targetPort = %+v, want 20:23", p)
	}
	if p := l.PosOf("objects[0].spec.ports[0].missing"); p.Line != 20 && p.Line != 18 {
		t.Errorf("a missing field must be located at its parent, got %+v", p)
	}
}

// TestReadmeExample keeps the complete example of scenarios/README.md valid.
func TestReadmeExample(t *testing.T) {
	data, err := os.ReadFile("../../scenarios/README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(data), "```yaml\n")
	found := 0
	for _, b := range blocks[1:] {
		body, _, _ := strings.Cut(b, "```")
		if !strings.HasPrefix(body, "apiVersion: kpsim.dev/v1alpha1") {
			continue
		}
		found++
		l, err := Load("README.md example", []byte(body))
		if err == nil {
			_, err = Expand(l, nil)
		}
		if err != nil {
			t.Errorf("README example is invalid: %v", err)
		}
	}
	if found == 0 {
		t.Fatal("no complete example in scenarios/README.md")
	}
}

// TestNodePortAllocation: NodePort and LoadBalancer ports get node ports as
// the API server gives them: requested ones kept and never handed out again,
// TCP and UDP of one port number sharing one, none for a LoadBalancer with
// allocateLoadBalancerNodePorts false, unique across the cluster, the same
// for the same input.
func TestNodePortAllocation(t *testing.T) {
	data := []byte(`apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: nodeports}
cluster:
  nodes: [{name: n1}]
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: dns, namespace: kube-system}
  spec:
    type: NodePort
    ports:
    - {name: dns-tcp, port: 53, protocol: TCP}
    - {name: dns-udp, port: 53, protocol: UDP}
    - {name: metrics, port: 9153, protocol: TCP}
- apiVersion: v1
  kind: Service
  metadata: {name: pinned, namespace: demo}
  spec:
    type: NodePort
    ports:
    - {name: http, port: 80, nodePort: 30000}
    - {name: https, port: 443, nodePort: 30002}
- apiVersion: v1
  kind: Service
  metadata: {name: lb, namespace: demo}
  spec:
    type: LoadBalancer
    ports:
    - {name: tcp, port: 80, protocol: TCP}
    - {name: udp, port: 80, protocol: UDP, nodePort: 30010}
- apiVersion: v1
  kind: Service
  metadata: {name: lb-no-nodeports, namespace: demo}
  spec:
    type: LoadBalancer
    allocateLoadBalancerNodePorts: false
    ports: [{name: http, port: 80}]
- apiVersion: v1
  kind: Service
  metadata: {name: internal, namespace: demo}
  spec:
    ports: [{name: http, port: 80}]
generate:
  services: 4
  endpointsPerService: {kind: fixed, value: 1}
  externalTrafficPolicyLocal: 0.5
  ports: {perService: 2}
`)
	got := func() map[string]int32 {
		t.Helper()
		l, err := Load("nodeports.yaml", data)
		if err != nil {
			t.Fatal(err)
		}
		e, err := Expand(l, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int32{}
		for _, s := range e.Services {
			for _, p := range s.Spec.Ports {
				out[s.Namespace+"/"+s.Name+":"+p.Name] = p.NodePort
			}
		}
		return out
	}
	ports := got()
	want := map[string]int32{
		"kube-system/dns:dns-tcp": 30001, "kube-system/dns:dns-udp": 30001, "kube-system/dns:metrics": 30003,
		"demo/pinned:http": 30000, "demo/pinned:https": 30002,
		"demo/lb:tcp": 30010, "demo/lb:udp": 30010,
		"demo/lb-no-nodeports:http": 0,
		"demo/internal:http":        0,
	}
	for k, np := range want {
		if ports[k] != np {
			t.Errorf("%s: node port %d, want %d", k, ports[k], np)
		}
	}
	// The generator's NodePort Services (half of 4, two ports each) take the
	// next free ports; the others have none.
	var generated []int32
	for k, np := range ports {
		if _, fixed := want[k]; !fixed && np != 0 {
			generated = append(generated, np)
		}
	}
	slices.Sort(generated)
	if diff := cmp.Diff([]int32{30004, 30005, 30006, 30007}, generated); diff != "" {
		t.Errorf("generated node ports (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ports, got()); diff != "" {
		t.Errorf("a second expansion gave other node ports (-first +second):\n%s", diff)
	}
}

// TestNodePortsExhaustedByObjects: more ports asking for a node port than the
// range holds is a validation error at the Service that overflows it.
func TestNodePortsExhaustedByObjects(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: kpsim.dev/v1alpha1\nkind: Scenario\nmetadata: {name: full}\ncluster:\n  nodes: [{name: n1}]\nobjects:\n")
	for i := range 2769 {
		fmt.Fprintf(&b, "- {apiVersion: v1, kind: Service, metadata: {name: s%d, namespace: demo}, spec: {type: NodePort, ports: [{port: 80}]}}\n", i)
	}
	_, err := Load("full.yaml", []byte(b.String()))
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 1 {
		t.Fatalf("want one validation error, got %v", err)
	}
	want := "full.yaml:2775:107: objects[2768].spec.ports: the NodePort and LoadBalancer Services up to this one need 2769 node ports; the node port range 30000-32767 holds 2768"
	if list[0].Error() != want {
		t.Errorf("got  %s\nwant %s", list[0], want)
	}
}

// TestCheckTargets: what a check may name, beside the rejections of the
// invalid corpus (55-60). A check without port: on a single-port Service
// is valid whatever the port is called; naming a generated single port is
// valid only when every seed names it the same way.
func TestCheckTargets(t *testing.T) {
	const generated = `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: t}
cluster: {nodeCount: 2}
generate:
  services: 10
  endpointsPerService: {kind: fixed, value: 2}
  ports: {named: %s}
checks:
  - {type: distribution, service: default/svc-3%s}
`
	const object = `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: t}
cluster: {nodes: [{name: node-a}]}
objects:
  - apiVersion: v1
    kind: Service
    metadata: {name: web, namespace: demo}
    spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
checks:
  - {type: distribution, service: %s}
`
	for _, tc := range []struct {
		name, yaml string
		err        string // "" when valid
		port       string // the check's port after validation
	}{
		{"generated, seed-named, no port", fmt.Sprintf(generated, "0.5", ""), "", ""},
		{"generated, all named, p80", fmt.Sprintf(generated, "1", ", port: p80"), "", "p80"},
		{"generated, none named, no port", fmt.Sprintf(generated, "0", ""), "", ""},
		{"generated, none named, p80", fmt.Sprintf(generated, "0", ", port: p80"), `Service default/svc-3 has no port named "p80" (it has one unnamed port)`, ""},
		{"generated, rounds to none named, p80", fmt.Sprintf(generated, "0.01", ", port: p80"), `has no port named "p80"`, ""},
		{"object, named port, no port", fmt.Sprintf(object, "demo/web"), "", ""},
		{"object, port in service", fmt.Sprintf(object, "demo/web:http"), "", "http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Load("t.yaml", []byte(tc.yaml))
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			case err == nil:
				if c := l.Scenario.Checks[0]; c.Port != tc.port || strings.Contains(c.Service, ":") {
					t.Errorf("check service %q port %q, want port %q", c.Service, c.Port, tc.port)
				}
			}
		})
	}
}
