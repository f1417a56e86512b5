package upstream

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	kptr "k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/scenario"
)

// updateImport rewrites the cluster dumps of scenarios/testdata/import/
// from a real kube-apiserver (make import-fixtures):
//
//	flock /tmp/kpsim-heavy.lock go test -run TestImportDumps ./harness/upstream/ -update-import
var updateImport = flag.Bool("update-import", false, "rewrite scenarios/testdata/import/*.yaml from a real kube-apiserver (root)")

// importCluster is one cluster the dump generator writes through the API
// and reads back as kubectl prints it.
type importCluster struct {
	file         string
	controlPlane netip.Prefix // the API server's address: default/kubernetes points at it
	serviceCIDR  netip.Prefix
	serviceCIDR6 netip.Prefix // dual-stack when valid
	// managedFields keeps metadata.managedFields, as kubectl get
	// --show-managed-fields prints them (kubectl drops them by default).
	managedFields bool
	write         func(ctx context.Context, t *testing.T, cs kubernetes.Interface)
}

// TestImportDumps starts a real kube-apiserver (one per cluster), writes a
// kind-like and a kubeadm-like cluster through it as kubelets and the
// EndpointSlice controller would (there is neither in a run: the objects'
// content is ours, every server-set field is the API server's), reads the
// objects back as `kubectl get nodes,pods,svc,endpointslices -A -o yaml`
// prints them, and requires that sim's loader accepts the dump unchanged.
// With -update-import it writes the dumps to scenarios/testdata/import/.
func TestImportDumps(t *testing.T) {
	testenv.RequireRoot(t)
	clusters := []importCluster{
		{file: "kind.yaml", controlPlane: netip.MustParsePrefix("172.18.0.3/16"), serviceCIDR: netip.MustParsePrefix("10.96.0.0/16"), write: writeKind},
		{file: "kubeadm.yaml", controlPlane: netip.MustParsePrefix("10.0.0.10/24"), serviceCIDR: netip.MustParsePrefix("10.96.0.0/12"),
			serviceCIDR6: netip.MustParsePrefix("fd00:10:96::/112"), managedFields: true, write: writeKubeadm},
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clusters {
		t.Run(c.file, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			data := dumpCluster(ctx, t, c)
			l, err := scenario.Load(c.file, data)
			if err != nil {
				t.Fatalf("the dump does not load: %v", err)
			}
			if _, err := scenario.Expand(l, nil); err != nil {
				t.Fatalf("the dump does not expand: %v", err)
			}
			if *updateImport {
				out := filepath.Join(root, "scenarios", "testdata", "import", c.file)
				if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(out, data, 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("wrote %s (%d bytes)", out, len(data))
			}
		})
	}
}

// dumpCluster runs one API server, lets c write its objects and returns
// the List kubectl would print.
func dumpCluster(ctx context.Context, t *testing.T, c importCluster) []byte {
	t.Helper()
	// One node namespace is the least a topology holds; the dumps' nodes
	// are API objects only.
	_, cp := StartForTest(t, ctx, TestControlPlane{SecondaryServiceCIDR: c.serviceCIDR6, Topology: netns.Config{
		ServiceCIDR: c.serviceCIDR, ControlPlane: c.controlPlane,
		Nodes: []netns.NodeConfig{{Name: "gen", Addr: netip.MustParsePrefix("198.19.0.1/16"),
			PodCIDR: netip.MustParsePrefix("10.255.0.0/24"), Gateway: netip.MustParseAddr("10.255.0.1")}}}})
	cs := cp.Client()
	c.write(ctx, t, cs)
	var items []any
	for _, p := range []string{"/api/v1/nodes", "/api/v1/pods", "/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"} {
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath(p).DoRaw(ctx)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		var list struct {
			APIVersion string           `json:"apiVersion"`
			Kind       string           `json:"kind"`
			Items      []map[string]any `json:"items"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			t.Fatal(err)
		}
		// kubectl sets each item's apiVersion and kind, which a typed
		// list's items lack on the wire.
		for _, it := range list.Items {
			it["apiVersion"] = list.APIVersion
			it["kind"] = strings.TrimSuffix(list.Kind, "List")
			if md, ok := it["metadata"].(map[string]any); ok && !c.managedFields {
				delete(md, "managedFields")
			}
			items = append(items, it)
		}
	}
	j, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items, "metadata": map[string]any{"resourceVersion": ""}})
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		t.Fatal(err)
	}
	return y
}

// dumpNode is a node as the kubelet registers it.
type dumpNode struct {
	name, zone   string
	ip, ip6      string
	cidr, cidr6  string
	controlPlane bool
}

func createNodes(ctx context.Context, t *testing.T, cs kubernetes.Interface, nodes []dumpNode) {
	t.Helper()
	for _, n := range nodes {
		labels := map[string]string{"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
		if n.zone != "" {
			labels["topology.kubernetes.io/zone"] = n.zone
			labels["topology.kubernetes.io/region"] = "region-1"
		}
		obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: labels,
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
			Spec: corev1.NodeSpec{PodCIDR: n.cidr, PodCIDRs: []string{n.cidr}}}
		if n.cidr6 != "" {
			obj.Spec.PodCIDRs = append(obj.Spec.PodCIDRs, n.cidr6)
		}
		if n.controlPlane {
			labels["node-role.kubernetes.io/control-plane"] = ""
			obj.Spec.Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
		}
		created, err := cs.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create node %s: %v", n.name, err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.ip}}
		if n.ip6 != "" {
			created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.ip6})
		}
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.name})
		now := metav1.Now()
		created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}}
		created.Status.Capacity = corev1.ResourceList{"cpu": mustQuantity("2"), "memory": mustQuantity("8Gi"), "pods": mustQuantity("110")}
		created.Status.Allocatable = created.Status.Capacity
		created.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64",
			ContainerRuntimeVersion: "containerd://2.1.0", OSImage: "Debian GNU/Linux 13 (trixie)"}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("node %s status: %v", n.name, err)
		}
	}
}

// dumpPod is a pod as the scheduler and the kubelet leave it.
type dumpPod struct {
	ns, name, node string
	labels         map[string]string
	ip, ip6        string
	hostNetwork    bool
	ready          bool
	ports          []corev1.ContainerPort
	image          string
}

func createPods(ctx context.Context, t *testing.T, cs kubernetes.Interface, pods []dumpPod) map[string]*corev1.Pod {
	t.Helper()
	out := map[string]*corev1.Pod{}
	for _, p := range pods {
		ensureServiceAccount(ctx, t, cs, p.ns)
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: p.labels},
			Spec: corev1.PodSpec{NodeName: p.node, HostNetwork: p.hostNetwork, AutomountServiceAccountToken: kptr.To(false),
				Containers: []corev1.Container{{Name: strings.Split(p.name, "-")[0], Image: p.image, Ports: p.ports,
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": mustQuantity("100m"), "memory": mustQuantity("70Mi")}}}}}}
		if p.hostNetwork {
			obj.Spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
			obj.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}
		created, err := cs.CoreV1().Pods(p.ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s/%s: %v", p.ns, p.name, err)
		}
		now := metav1.Now()
		status := corev1.ConditionFalse
		if p.ready {
			status = corev1.ConditionTrue
		}
		created.Status.Phase = corev1.PodRunning
		created.Status.HostIP = nodeIPOf(ctx, t, cs, p.node)
		created.Status.HostIPs = []corev1.HostIP{{IP: created.Status.HostIP}}
		created.Status.PodIP = p.ip
		created.Status.PodIPs = []corev1.PodIP{{IP: p.ip}}
		if p.ip6 != "" {
			created.Status.PodIPs = append(created.Status.PodIPs, corev1.PodIP{IP: p.ip6})
		}
		created.Status.StartTime = &now
		created.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		created.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: created.Spec.Containers[0].Name, Image: p.image, ImageID: p.image,
			Ready: p.ready, Started: kptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
		updated, err := cs.CoreV1().Pods(p.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("pod %s/%s status: %v", p.ns, p.name, err)
		}
		out[p.ns+"/"+p.name] = updated
	}
	return out
}

func nodeIPOf(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) string {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func ensureServiceAccount(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
		return
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account %s/default: %v", ns, err)
	}
}

func createService(ctx context.Context, t *testing.T, cs kubernetes.Interface, s *corev1.Service) *corev1.Service {
	t.Helper()
	ensureServiceAccount(ctx, t, cs, s.Namespace)
	created, err := cs.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s/%s: %v", s.Namespace, s.Name, err)
	}
	return created
}

// createSlice writes the slice the EndpointSlice controller would for svc
// over the given pods (or, with hostNetwork pods, their node addresses):
// generateName, the managed-by and service-name labels, the owner
// reference, one endpoint per pod with its conditions, node, zone and
// target reference. family picks the pods' IPv4 or IPv6 address.
func createSlice(ctx context.Context, t *testing.T, cs kubernetes.Interface, svc *corev1.Service, pods []*corev1.Pod, family discoveryv1.AddressType, zones map[string]string) {
	t.Helper()
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: svc.Name + "-", Namespace: svc.Namespace,
			Labels:      map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": time.Now().UTC().Format(time.RFC3339)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
				Controller: kptr.To(true), BlockOwnerDeletion: kptr.To(true)}}},
		AddressType: family,
	}
	for k, v := range svc.Labels {
		sl.Labels[k] = v
	}
	for _, p := range svc.Spec.Ports {
		port := p.TargetPort.IntVal
		if p.TargetPort.Type == intstr.String {
			for _, c := range pods[0].Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name == p.TargetPort.StrVal {
						port = cp.ContainerPort
					}
				}
			}
		}
		sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: kptr.To(p.Name), Protocol: kptr.To(p.Protocol), Port: kptr.To(port)})
	}
	for _, p := range pods {
		addr := ""
		for _, ip := range p.Status.PodIPs {
			a := netip.MustParseAddr(ip.IP)
			if (family == discoveryv1.AddressTypeIPv4) == a.Is4() {
				addr = ip.IP
			}
		}
		if addr == "" {
			continue
		}
		ready := false
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		e := discoveryv1.Endpoint{Addresses: []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: kptr.To(ready), Serving: kptr.To(ready), Terminating: kptr.To(false)},
			NodeName:   kptr.To(p.Spec.NodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
		if z := zones[p.Spec.NodeName]; z != "" {
			e.Zone = kptr.To(z)
		}
		sl.Endpoints = append(sl.Endpoints, e)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create slice for %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}

func pick(pods map[string]*corev1.Pod, keys ...string) []*corev1.Pod {
	out := make([]*corev1.Pod, len(keys))
	for i, k := range keys {
		out[i] = pods[k]
	}
	return out
}

func tcp(name string, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(port)}
}

// writeKind writes a kind cluster as `kind create cluster` with two
// workers leaves it: kindnet and kube-proxy on every node (host network),
// the control plane's static pods, CoreDNS on the control plane, and a
// three-replica workload on the workers.
func writeKind(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	createNodes(ctx, t, cs, []dumpNode{
		{name: "kind-control-plane", ip: "172.18.0.3", cidr: "10.244.0.0/24", controlPlane: true},
		{name: "kind-worker", ip: "172.18.0.2", cidr: "10.244.1.0/24"},
		{name: "kind-worker2", ip: "172.18.0.4", cidr: "10.244.2.0/24"},
	})
	dnsPorts := []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
		{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP}}
	pods := []dumpPod{
		{ns: "kube-system", name: "coredns-674b8bbfcf-8xk2p", node: "kind-control-plane", labels: map[string]string{"k8s-app": "kube-dns", "pod-template-hash": "674b8bbfcf"},
			ip: "10.244.0.3", ready: true, ports: dnsPorts, image: "registry.k8s.io/coredns/coredns:v1.12.1"},
		{ns: "kube-system", name: "coredns-674b8bbfcf-w9q4m", node: "kind-control-plane", labels: map[string]string{"k8s-app": "kube-dns", "pod-template-hash": "674b8bbfcf"},
			ip: "10.244.0.2", ready: true, ports: dnsPorts, image: "registry.k8s.io/coredns/coredns:v1.12.1"},
		{ns: "kube-system", name: "etcd-kind-control-plane", node: "kind-control-plane", labels: map[string]string{"component": "etcd", "tier": "control-plane"},
			ip: "172.18.0.3", hostNetwork: true, ready: true, image: "registry.k8s.io/etcd:3.6.4-0"},
		{ns: "kube-system", name: "kube-apiserver-kind-control-plane", node: "kind-control-plane", labels: map[string]string{"component": "kube-apiserver", "tier": "control-plane"},
			ip: "172.18.0.3", hostNetwork: true, ready: true, image: "registry.k8s.io/kube-apiserver:v1.37.2"},
		{ns: "local-path-storage", name: "local-path-provisioner-7dc846544d-tq5vn", node: "kind-control-plane", labels: map[string]string{"app": "local-path-provisioner"},
			ip: "10.244.0.4", ready: true, image: "docker.io/kindest/local-path-provisioner:v20250214-acbabc1a"},
	}
	for i, n := range []struct{ node, ip, suffix string }{{"kind-control-plane", "172.18.0.3", "5t8zq"}, {"kind-worker", "172.18.0.2", "m2x9c"}, {"kind-worker2", "172.18.0.4", "b7wkd"}} {
		pods = append(pods,
			dumpPod{ns: "kube-system", name: "kindnet-" + n.suffix, node: n.node, labels: map[string]string{"app": "kindnet", "k8s-app": "kindnet", "tier": "node"},
				ip: n.ip, hostNetwork: true, ready: true, image: "docker.io/kindest/kindnetd:v20250512-df8de77b"},
			dumpPod{ns: "kube-system", name: fmt.Sprintf("kube-proxy-%c%s", 'a'+i, n.suffix[1:]), node: n.node, labels: map[string]string{"k8s-app": "kube-proxy"},
				ip: n.ip, hostNetwork: true, ready: true, image: "registry.k8s.io/kube-proxy:v1.37.2"})
	}
	webPorts := []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}
	for i, n := range []struct{ node, ip string }{{"kind-worker", "10.244.1.2"}, {"kind-worker2", "10.244.2.2"}, {"kind-worker2", "10.244.2.3"}} {
		pods = append(pods, dumpPod{ns: "default", name: fmt.Sprintf("web-5d9c7b6f4-%c2k7x", 'a'+i), node: n.node, labels: map[string]string{"app": "web", "pod-template-hash": "5d9c7b6f4"},
			ip: n.ip, ready: true, ports: webPorts, image: "registry.k8s.io/e2e-test-images/agnhost:2.53"})
	}
	created := createPods(ctx, t, cs, pods)
	dns := createService(ctx, t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system",
		Labels:      map[string]string{"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
		Annotations: map[string]string{"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Selector: map[string]string{"k8s-app": "kube-dns"}, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)}, tcp("metrics", 9153)}}})
	createSlice(ctx, t, cs, dns, pick(created, "kube-system/coredns-674b8bbfcf-8xk2p", "kube-system/coredns-674b8bbfcf-w9q4m"), discoveryv1.AddressTypeIPv4, nil)
	web := createService(ctx, t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Labels: map[string]string{"app": "web"},
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app":"web"},"name":"web","namespace":"default"},"spec":{"ports":[{"name":"http","port":80,"targetPort":"http"}],"selector":{"app":"web"}}}` + "\n"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")}}}})
	createSlice(ctx, t, cs, web, pick(created, "default/web-5d9c7b6f4-a2k7x", "default/web-5d9c7b6f4-b2k7x", "default/web-5d9c7b6f4-c2k7x"), discoveryv1.AddressTypeIPv4, nil)
}

// writeKubeadm writes a three-node kubeadm cluster across three zones,
// dual-stack (IPv4 primary), with Services of every kind kube-proxy treats
// differently: internalTrafficPolicy Local, ClientIP affinity, a NodePort
// with externalTrafficPolicy Local, ExternalName, headless, dual-stack, an
// SCTP port, a host-network endpoint set (node-exporter), and two
// trafficDistribution Services whose slices the dump leaves out (the
// scenario makes them from the Pods).
func writeKubeadm(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	nodes := []dumpNode{
		{name: "cp-1", zone: "zone-a", ip: "10.0.0.10", ip6: "fd00:10::10", cidr: "192.168.0.0/24", cidr6: "fd00:10:244::/64", controlPlane: true},
		{name: "worker-1", zone: "zone-b", ip: "10.0.0.11", ip6: "fd00:10::11", cidr: "192.168.1.0/24", cidr6: "fd00:10:244:1::/64"},
		{name: "worker-2", zone: "zone-c", ip: "10.0.0.12", ip6: "fd00:10::12", cidr: "192.168.2.0/24", cidr6: "fd00:10:244:2::/64"},
	}
	createNodes(ctx, t, cs, nodes)
	zones := map[string]string{}
	for _, n := range nodes {
		zones[n.name] = n.zone
	}
	dnsPorts := []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP}}
	var pods []dumpPod
	pods = append(pods,
		dumpPod{ns: "kube-system", name: "coredns-7c65d6cfc9-4lq8n", node: "worker-1", labels: map[string]string{"k8s-app": "kube-dns"}, ip: "192.168.1.2", ip6: "fd00:10:244:1::2", ready: true, ports: dnsPorts, image: "registry.k8s.io/coredns/coredns:v1.12.1"},
		dumpPod{ns: "kube-system", name: "coredns-7c65d6cfc9-zt6vh", node: "worker-2", labels: map[string]string{"k8s-app": "kube-dns"}, ip: "192.168.2.2", ip6: "fd00:10:244:2::2", ready: true, ports: dnsPorts, image: "registry.k8s.io/coredns/coredns:v1.12.1"})
	app := func(name, node, ip, ip6 string, ready bool, labels map[string]string, ports ...corev1.ContainerPort) dumpPod {
		return dumpPod{ns: "shop", name: name, node: node, labels: labels, ip: ip, ip6: ip6, ready: ready, ports: ports, image: "registry.k8s.io/e2e-test-images/agnhost:2.53"}
	}
	http := corev1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}
	pods = append(pods,
		app("cart-6f7d8-a1", "worker-1", "192.168.1.10", "fd00:10:244:1::10", true, map[string]string{"app": "cart"}, http),
		app("cart-6f7d8-b2", "worker-2", "192.168.2.10", "fd00:10:244:2::10", true, map[string]string{"app": "cart"}, http),
		app("cart-6f7d8-c3", "worker-2", "192.168.2.11", "fd00:10:244:2::11", false, map[string]string{"app": "cart"}, http),
		app("session-0", "worker-1", "192.168.1.20", "fd00:10:244:1::20", true, map[string]string{"app": "session"}, http),
		app("session-1", "worker-2", "192.168.2.20", "fd00:10:244:2::20", true, map[string]string{"app": "session"}, http),
		app("agent-x1", "worker-1", "192.168.1.30", "fd00:10:244:1::30", true, map[string]string{"app": "agent"}, http),
		app("db-0", "worker-1", "192.168.1.40", "fd00:10:244:1::40", true, map[string]string{"app": "db"}, http),
		app("db-1", "worker-2", "192.168.2.40", "fd00:10:244:2::40", true, map[string]string{"app": "db"}, http),
		app("sig-0", "worker-1", "192.168.1.50", "fd00:10:244:1::50", true, map[string]string{"app": "sig"}, corev1.ContainerPort{Name: "sctp", ContainerPort: 9999, Protocol: corev1.ProtocolSCTP}),
		app("zonal-a", "cp-1", "192.168.0.60", "fd00:10:244::60", true, map[string]string{"app": "zonal"}, http),
		app("zonal-b", "worker-1", "192.168.1.60", "fd00:10:244:1::60", true, map[string]string{"app": "zonal"}, http),
		app("zonal-c", "worker-2", "192.168.2.60", "fd00:10:244:2::60", false, map[string]string{"app": "zonal"}, http),
		app("nodelocal-a", "worker-1", "192.168.1.70", "fd00:10:244:1::70", true, map[string]string{"app": "nodelocal"}, http),
		app("nodelocal-b", "worker-2", "192.168.2.70", "fd00:10:244:2::70", true, map[string]string{"app": "nodelocal"}, http),
	)
	for _, n := range nodes {
		pods = append(pods, dumpPod{ns: "monitoring", name: "node-exporter-" + n.name, node: n.name, labels: map[string]string{"app": "node-exporter"},
			ip: n.ip, ip6: n.ip6, hostNetwork: true, ready: true, ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100, HostPort: 9100, Protocol: corev1.ProtocolTCP}},
			image: "quay.io/prometheus/node-exporter:v1.9.1"})
	}
	created := createPods(ctx, t, cs, pods)
	v4 := discoveryv1.AddressTypeIPv4
	dns := createService(ctx, t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Selector: map[string]string{"k8s-app": "kube-dns"}, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)}, {Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)}}}})
	createSlice(ctx, t, cs, dns, pick(created, "kube-system/coredns-7c65d6cfc9-4lq8n", "kube-system/coredns-7c65d6cfc9-zt6vh"), v4, zones)
	svc := func(name string, mut func(*corev1.ServiceSpec)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{"app": name}},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")}}}}
		mut(&s.Spec)
		return createService(ctx, t, cs, s)
	}
	cart := svc("cart", func(s *corev1.ServiceSpec) {
		s.IPFamilyPolicy = kptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	cartPods := pick(created, "shop/cart-6f7d8-a1", "shop/cart-6f7d8-b2", "shop/cart-6f7d8-c3")
	createSlice(ctx, t, cs, cart, cartPods, v4, zones)
	createSlice(ctx, t, cs, cart, cartPods, discoveryv1.AddressTypeIPv6, zones)
	session := svc("session", func(s *corev1.ServiceSpec) {
		s.SessionAffinity = corev1.ServiceAffinityClientIP
		s.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: kptr.To(int32(600))}}
	})
	createSlice(ctx, t, cs, session, pick(created, "shop/session-0", "shop/session-1"), v4, zones)
	agent := svc("agent", func(s *corev1.ServiceSpec) {
		s.InternalTrafficPolicy = kptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	})
	createSlice(ctx, t, cs, agent, pick(created, "shop/agent-x1"), v4, zones)
	db := svc("db", func(s *corev1.ServiceSpec) {
		s.Type = corev1.ServiceTypeNodePort
		s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	createSlice(ctx, t, cs, db, pick(created, "shop/db-0", "shop/db-1"), v4, zones)
	// A LoadBalancer with externalTrafficPolicy Local (the API server
	// allocates its health check node port), an external IP, source ranges
	// and the ingress a cloud controller writes through the status
	// subresource.
	store := svc("storefront", func(s *corev1.ServiceSpec) {
		s.Type = corev1.ServiceTypeLoadBalancer
		s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.ExternalIPs = []string{"203.0.113.80"}
		s.LoadBalancerSourceRanges = []string{"198.51.100.0/24"}
	})
	store.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.80", IPMode: kptr.To(corev1.LoadBalancerIPModeVIP)}, {IP: "192.0.2.81", IPMode: kptr.To(corev1.LoadBalancerIPModeProxy)}}
	if _, err := cs.CoreV1().Services("shop").UpdateStatus(ctx, store, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update the status of shop/storefront: %v", err)
	}
	createSlice(ctx, t, cs, store, pick(created, "shop/cart-6f7d8-a1", "shop/cart-6f7d8-b2"), v4, zones)
	headless := svc("db-headless", func(s *corev1.ServiceSpec) {
		s.ClusterIP = corev1.ClusterIPNone
		s.Selector = map[string]string{"app": "db"}
	})
	createSlice(ctx, t, cs, headless, pick(created, "shop/db-0", "shop/db-1"), v4, zones)
	svc("payments", func(s *corev1.ServiceSpec) {
		s.Type = corev1.ServiceTypeExternalName
		s.ExternalName = "payments.example.com"
		s.Selector = nil
		s.Ports = nil
	})
	sig := svc("sig", func(s *corev1.ServiceSpec) {
		s.Ports = []corev1.ServicePort{{Name: "sctp", Port: 9999, Protocol: corev1.ProtocolSCTP, TargetPort: intstr.FromInt32(9999)}}
	})
	createSlice(ctx, t, cs, sig, pick(created, "shop/sig-0"), v4, zones)
	svc("zonal", func(s *corev1.ServiceSpec) {
		s.TrafficDistribution = kptr.To(corev1.ServiceTrafficDistributionPreferSameZone)
	})
	svc("nodelocal", func(s *corev1.ServiceSpec) {
		s.TrafficDistribution = kptr.To(corev1.ServiceTrafficDistributionPreferSameNode)
	})
	exp := createService(ctx, t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "node-exporter", Namespace: "monitoring", Labels: map[string]string{"app": "node-exporter"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "node-exporter"}, Ports: []corev1.ServicePort{tcp("metrics", 9100)}}})
	createSlice(ctx, t, cs, exp, pick(created, "monitoring/node-exporter-cp-1", "monitoring/node-exporter-worker-1", "monitoring/node-exporter-worker-2"), v4, zones)
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
