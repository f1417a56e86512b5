package remote

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/kpsim/kpsim/sim/scenario"
)

func expand(t *testing.T, file string) *scenario.Expanded {
	t.Helper()
	l, err := scenario.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := scenario.Expand(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return exp
}

func TestPlanFlapping(t *testing.T) {
	exp := expand(t, "../../scenarios/conformance/flapping.yaml")
	p, err := NewPlan(exp, Options{RunID: "abc123", Nodes: map[string]string{"node-a": "worker-1", "node-b": "worker-2"}})
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, n := range p.Namespaces {
		ns = append(ns, n.Name)
		if n.Labels[LabelRun] != "abc123" || n.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
			t.Errorf("namespace %s labels %v", n.Name, n.Labels)
		}
	}
	if got := strings.Join(ns, ","); got != "kpsim-abc123,kpsim-abc123-demo" {
		t.Errorf("namespaces %s", got)
	}
	want := map[string]string{"flappy-0": "worker-1", "flappy-1": "worker-2", "flappy-2": "worker-2"}
	if len(p.Echo) != len(want) {
		t.Fatalf("%d echo pods, want %d", len(p.Echo), len(want))
	}
	for _, pod := range p.Echo {
		if want[pod.Name] != pod.Spec.NodeName || pod.Namespace != "kpsim-abc123-demo" {
			t.Errorf("echo pod %s/%s on %q, want kpsim-abc123-demo on %q", pod.Namespace, pod.Name, pod.Spec.NodeName, want[pod.Name])
		}
		c := pod.Spec.Containers[0]
		if strings.Join(c.Args, " ") != "--ports tcp:8080" || c.Image != DefaultEchoImage {
			t.Errorf("echo pod %s: args %v image %s", pod.Name, c.Args, c.Image)
		}
		if *pod.Spec.AutomountServiceAccountToken || strings.Join(capNames(c.SecurityContext.Capabilities.Add), ",") != "NET_RAW,NET_BIND_SERVICE,NET_ADMIN" {
			t.Errorf("echo pod %s: token or capabilities wrong", pod.Name)
		}
	}
	if got := strings.Join(p.ProberNodes(), ","); got != "worker-1" {
		t.Errorf("prober nodes %s, want worker-1 (the scenario's client node-a)", got)
	}
	if len(p.Services) != 1 {
		t.Fatalf("%d services", len(p.Services))
	}
	s := p.Services[0]
	if s.Namespace != "kpsim-abc123-demo" || s.Spec.ClusterIP != "" || s.Spec.Selector != nil || s.Labels[LabelRun] != "abc123" {
		t.Errorf("service %s/%s clusterIP %q selector %v labels %v", s.Namespace, s.Name, s.Spec.ClusterIP, s.Spec.Selector, s.Labels)
	}
	for _, sl := range p.Slices {
		if sl.Labels["endpointslice.kubernetes.io/managed-by"] != ManagedBy || sl.Namespace != "kpsim-abc123-demo" {
			t.Errorf("slice %s/%s labels %v", sl.Namespace, sl.Name, sl.Labels)
		}
		for _, ep := range sl.Endpoints {
			if n := *ep.NodeName; n != "worker-1" && n != "worker-2" {
				t.Errorf("slice endpoint on node %s", n)
			}
		}
	}
}

func capNames(c []corev1.Capability) []string {
	var out []string
	for _, x := range c {
		out = append(out, string(x))
	}
	return out
}

func TestPlanBadInput(t *testing.T) {
	exp := expand(t, "../../scenarios/conformance/flapping.yaml")
	if _, err := NewPlan(exp, Options{RunID: "abc123", Nodes: map[string]string{"node-z": "w"}}); err == nil || !strings.Contains(err.Error(), `no node "node-z"`) {
		t.Errorf("unknown node in the map: %v", err)
	}
	bad := expand(t, "../../scenarios/conformance/flapping.yaml")
	bad.Slices[0].Endpoints[1].NodeName = nil
	if _, err := NewPlan(bad, Options{RunID: "abc123"}); err == nil || !strings.Contains(err.Error(), "endpoints[1]: no nodeName") {
		t.Errorf("endpoint without a node: %v", err)
	}
	agent := expand(t, "../../scenarios/conformance/flapping.yaml")
	port := int32(AgentPort)
	agent.Slices[0].Ports[0].Port = &port
	if _, err := NewPlan(agent, Options{RunID: "abc123"}); err == nil || !strings.Contains(err.Error(), "the agents' own") {
		t.Errorf("the agent port as an endpoint port: %v", err)
	}
}

// kubelet plays the nodes on a fake clientset: it makes the run's pods
// Running and Ready with addresses (and the DaemonSet's pod on each node),
// except those stuck names.
func kubelet(t *testing.T, ctx context.Context, c *fake.Clientset, p *Plan, stuck map[string]string) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	go func() {
		for ctx.Err() == nil {
			mu.Lock()
			serviceAccounts(ctx, c)
			pods, _ := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			have := map[string]bool{}
			for i := range pods.Items {
				pod := &pods.Items[i]
				have[pod.Spec.NodeName+"/"+pod.Labels[LabelRole]] = true
				if pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodPending && pod.Status.ContainerStatuses != nil {
					continue
				}
				if why, ok := stuck[pod.Name]; ok {
					pod.Status.Phase = corev1.PodPending
					pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "echo", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: why, Message: "no such image"}}}}
				} else {
					n++
					pod.Status.Phase = corev1.PodRunning
					pod.Status.PodIP = fmt.Sprintf("10.9.0.%d", n)
					pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
				}
				_, _ = c.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
			}
			for _, node := range p.ProberNodes() {
				if !have[node+"/prober"] {
					pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kpsim-prober-" + node, Namespace: p.Home, Labels: p.Prober.Spec.Template.Labels},
						Spec: *p.Prober.Spec.Template.Spec.DeepCopy()}
					pod.Spec.NodeName = node
					_, _ = c.CoreV1().Pods(p.Home).Create(ctx, pod, metav1.CreateOptions{})
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
}

func TestDeploy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exp := expand(t, "../../scenarios/conformance/flapping.yaml")
	p, err := NewPlan(exp, Options{RunID: "abc123"})
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientset()
	kubelet(t, ctx, c, p, nil)
	pl, err := Deploy(ctx, c, p, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Endpoint) != 3 || len(pl.Echoes) != 3 || len(pl.Probers) != 1 {
		t.Fatalf("placement: %d endpoints, %d echoes, %d probers", len(pl.Endpoint), len(pl.Echoes), len(pl.Probers))
	}
	if a := pl.Probers["node-a"]; a.Name != "kpsim-prober-node-a" || !a.IP.IsValid() {
		t.Errorf("prober on node-a: %+v", a)
	}
	if _, ok := pl.Services[types.NamespacedName{Namespace: "demo", Name: "flappy"}]; !ok {
		t.Errorf("services by scenario name: %v", pl.Services)
	}
	sl, err := c.DiscoveryV1().EndpointSlices("kpsim-abc123-demo").Get(ctx, "flappy-m3n4b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range sl.Endpoints {
		ip := netip.MustParseAddr(ep.Addresses[0])
		a, ok := pl.Echoes[ip]
		if !ok || ep.TargetRef == nil || ep.TargetRef.Name != a.Name || a.Node != *ep.NodeName {
			t.Errorf("slice endpoint %s (node %s, ref %v) is not an echo pod's: %+v", ip, *ep.NodeName, ep.TargetRef, a)
		}
	}
	// A timeline step: flappy-2 not ready in the model, mirrored.
	model := exp.Slices[0].DeepCopy()
	no := false
	model.Endpoints[2].Conditions.Ready = &no
	svc := types.NamespacedName{Namespace: "demo", Name: "flappy"}
	if n, err := pl.Mirror(ctx, c, p, svc, []*discoveryv1.EndpointSlice{model}); err != nil || n != 1 {
		t.Fatalf("mirror: %d writes, %v", n, err)
	}
	sl, err = c.DiscoveryV1().EndpointSlices("kpsim-abc123-demo").Get(ctx, "flappy-m3n4b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range sl.Endpoints {
		notReady := ep.Conditions.Ready != nil && !*ep.Conditions.Ready
		if notReady != (ep.TargetRef.Name == "flappy-2") || *ep.NodeName == "" || pl.Echoes[netip.MustParseAddr(ep.Addresses[0])].Name != ep.TargetRef.Name {
			t.Errorf("mirrored endpoint %s (%s on %s): ready %v", ep.Addresses[0], ep.TargetRef.Name, *ep.NodeName, ep.Conditions.Ready)
		}
	}
	if n, err := pl.Mirror(ctx, c, p, svc, nil); err != nil || n != 1 {
		t.Fatalf("mirror of no slices: %d writes, %v", n, err)
	}
	if l, _ := c.DiscoveryV1().EndpointSlices("kpsim-abc123-demo").List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
		t.Errorf("%d slices left after mirroring none", len(l.Items))
	}
	if err := Delete(ctx, c, "abc123", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if ns, _ := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); len(ns.Items) != 0 {
		t.Errorf("%d namespaces left", len(ns.Items))
	}
	allowedByRBAC(t, c)
}

// allowedByRBAC checks every request the run made (the fake kubelet's
// status writes and prober pods aside: they are the cluster's) against
// the shipped ClusterRole.
func allowedByRBAC(t *testing.T, c *fake.Clientset) {
	t.Helper()
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict([]byte(RBAC), &role); err != nil {
		t.Fatalf("rbac.yaml: %v", err)
	}
	allowed := func(group, resource, verb string) bool {
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	n := 0
	for _, a := range c.Actions() {
		res := a.GetResource()
		name := res.Resource
		if a.GetSubresource() != "" {
			name += "/" + a.GetSubresource()
		}
		if name == "pods/status" || a.GetVerb() == "create" && name == "serviceaccounts" ||
			a.GetVerb() == "create" && name == "pods" && a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).Labels[LabelRole] == "prober" {
			continue // the fake kubelet's and controller manager's
		}
		n++
		if !allowed(res.Group, name, a.GetVerb()) {
			t.Errorf("rbac.yaml does not allow %s %s (group %q)", a.GetVerb(), name, res.Group)
		}
	}
	if n < 10 {
		t.Errorf("only %d requests checked", n)
	}
}

func TestDeployNamesAStuckPod(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exp := expand(t, "../../scenarios/conformance/flapping.yaml")
	p, err := NewPlan(exp, Options{RunID: "abc123"})
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientset()
	kubelet(t, ctx, c, p, map[string]string{"flappy-1": "ErrImagePull"})
	_, err = Deploy(ctx, c, p, 1500*time.Millisecond)
	if err == nil {
		t.Fatal("Deploy passed with a pod that never starts")
	}
	for _, want := range []string{"pod kpsim-abc123-demo/flappy-1 on node node-b", "waiting: ErrImagePull no such image"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "flappy-0") {
		t.Errorf("error names a ready pod:\n%v", err)
	}
	// This process made them: a live run, left alone without force.
	runs, err := Cleanup(ctx, c, false, 5*time.Second)
	if err != nil || len(runs) != 2 || !runs[0].Alive || runs[0].RunID != "abc123" {
		t.Errorf("cleanup: %+v, %v", runs, err)
	}
	if ns, _ := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); len(ns.Items) != 2 {
		t.Errorf("cleanup without force removed a live run's namespaces: %d left", len(ns.Items))
	}
	if runs, err = Cleanup(ctx, c, true, 5*time.Second); err != nil || len(runs) != 2 {
		t.Errorf("cleanup --force: %+v, %v", runs, err)
	}
	if ns, _ := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); len(ns.Items) != 0 {
		t.Errorf("cleanup --force left %d namespaces", len(ns.Items))
	}
	if ownerAlive("elsewhere/1") || !ownerAlive(owner()) || ownerAlive("garbage") {
		t.Errorf("ownerAlive")
	}
	allowedByRBAC(t, c)
}

// serviceAccounts plays the controller manager: a default ServiceAccount
// in every namespace.
func serviceAccounts(ctx context.Context, c *fake.Clientset) {
	ns, _ := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	for _, n := range ns.Items {
		_, _ = c.CoreV1().ServiceAccounts(n.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: n.Name}}, metav1.CreateOptions{})
	}
}

// TestDeployWaitsForServiceAccounts: without a default ServiceAccount no
// pod is created, and the error says which namespace lacks it.
func TestDeployWaitsForServiceAccounts(t *testing.T) {
	ctx := context.Background()
	p, err := NewPlan(expand(t, "../../scenarios/conformance/flapping.yaml"), Options{RunID: "abc123"})
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientset()
	_, err = Deploy(ctx, c, p, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "namespace kpsim-abc123 has no default ServiceAccount") {
		t.Errorf("Deploy without ServiceAccounts: %v", err)
	}
	if pods, _ := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Errorf("%d pods created before the ServiceAccounts", len(pods.Items))
	}
}
