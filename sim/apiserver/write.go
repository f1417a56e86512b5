package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kpsim/kpsim/sim/scenario"
)

// DefaultConcurrency is how many writes Seed, Upsert and the deletions keep
// in flight when no other figure is given. Measured here (2 cores, the
// 1,000 Services and 1,000 slices of scenarios/1000-services.yaml into
// kube-apiserver v1.37.2): Seed 5.2-6.3 s with 8 in flight, 3.2-4.0 s with
// 32.
const DefaultConcurrency = 32

// SeedOptions says what Seed writes beyond the scenario's objects.
type SeedOptions struct {
	// NodeAddrs maps a node name to the InternalIP written to its
	// status.addresses (replacing the scenario's), e.g. the addresses of the
	// run's node namespaces: kube-proxy finds its node IP there.
	NodeAddrs map[string]netip.Addr
	// PodCIDRs, optional, maps a node name to its spec.podCIDR (replacing
	// the scenario's).
	PodCIDRs map[string]netip.Prefix
	// Concurrency is how many Service and EndpointSlice writes are in
	// flight at once (DefaultConcurrency when 0).
	Concurrency int
}

// Seed writes an expanded scenario through the API, in dependency order:
// Namespaces (created when missing), Nodes (status included: addresses
// from o.NodeAddrs), Services, then EndpointSlices, each slice stamped with
// endpoints.kubernetes.io/last-change-trigger-time as the EndpointSlice
// controller would. An object that exists already is updated from the API's
// current copy (so Seed can run again over the same API). Pods are not
// written: a real API validates pod specs the scenario does not hold, and
// proxies never read pods.
//
// It returns the number of writes of watched kinds (Nodes, Services,
// EndpointSlices; namespace creations are not counted), each one informer
// event for every tracker. Errors name the object (kind namespace/name) and
// carry the API's message.
func Seed(ctx context.Context, client kubernetes.Interface, exp *scenario.Expanded, o SeedOptions) (int, error) {
	if err := ensureNamespaces(ctx, client, exp.Services, exp.Slices); err != nil {
		return 0, err
	}
	n := 0
	for _, node := range exp.Nodes {
		w, err := seedNode(ctx, client, node, o)
		n += w
		if err != nil {
			return n, err
		}
	}
	w, err := upsert(ctx, client, exp.Services, exp.Slices, o.Concurrency)
	return n + w, err
}

// seedNode creates or updates one Node, then writes its status through the
// status subresource when the API holds other addresses than wanted (a
// create keeps the status on kube-apiserver 1.37; an update never does).
func seedNode(ctx context.Context, client kubernetes.Interface, want *corev1.Node, o SeedOptions) (int, error) {
	want = want.DeepCopy()
	forCreate(&want.ObjectMeta)
	if a, ok := o.NodeAddrs[want.Name]; ok {
		want.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: a.String()}}
	}
	if p, ok := o.PodCIDRs[want.Name]; ok {
		want.Spec.PodCIDR, want.Spec.PodCIDRs = p.String(), []string{p.String()}
	}
	api := client.CoreV1().Nodes()
	got, err := api.Create(ctx, want, metav1.CreateOptions{})
	n := 1
	if apierrors.IsAlreadyExists(err) {
		got, n, err = updateNode(ctx, client, want)
	}
	if err != nil {
		return 0, fmt.Errorf("could not write Node %s: %w", want.Name, err)
	}
	if equality.Semantic.DeepEqual(got.Status.Addresses, want.Status.Addresses) {
		return n, nil
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Addresses = want.Status.Addresses
		if len(cur.Status.Conditions) == 0 {
			cur.Status.Conditions = want.Status.Conditions
		}
		_, err = api.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return n, fmt.Errorf("could not write the status of Node %s: %w", want.Name, err)
	}
	return n + 1, nil
}

// updateNode brings an existing Node's labels and pod CIDR to want's,
// starting from the API's copy; it returns the Node and 1 if it wrote.
func updateNode(ctx context.Context, client kubernetes.Interface, want *corev1.Node) (*corev1.Node, int, error) {
	api := client.CoreV1().Nodes()
	var got *corev1.Node
	n := 0
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got, n = cur, 0
		m := cur.DeepCopy()
		m.Labels, m.Spec.PodCIDR, m.Spec.PodCIDRs = want.Labels, want.Spec.PodCIDR, want.Spec.PodCIDRs
		if len(want.Spec.PodCIDRs) == 0 && want.Spec.PodCIDR == cur.Spec.PodCIDR {
			m.Spec.PodCIDRs = cur.Spec.PodCIDRs
		}
		if equality.Semantic.DeepEqual(m.Labels, cur.Labels) && equality.Semantic.DeepEqual(m.Spec, cur.Spec) {
			return nil
		}
		if got, err = api.Update(ctx, m, metav1.UpdateOptions{}); err != nil {
			return err
		}
		n = 1
		return nil
	})
	return got, n, err
}

// Upsert creates or updates (by name) Services and EndpointSlices, the
// Services first, DefaultConcurrency writes in flight, for harnesses that
// generate objects themselves. Namespaces missing are created. An update
// starts from the API's current object (Get) and is retried on a conflict
// (retry.RetryOnConflict): fields the caller leaves empty that the API
// allocates or defaults (clusterIPs, ipFamilies, node ports, ...) keep the
// API's value, and a Service equal to the API's is not written. Every slice
// write is stamped with endpoints.kubernetes.io/last-change-trigger-time.
// externalTrafficPolicy on a Service that is not externally reachable is
// cleared (the API rejects it there, and no proxy reads it). The caller's
// objects are not modified. It returns the number of writes (Services,
// EndpointSlices: one informer event each).
func Upsert(ctx context.Context, client kubernetes.Interface, svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) (int, error) {
	if err := ensureNamespaces(ctx, client, svcs, slices); err != nil {
		return 0, err
	}
	return upsert(ctx, client, svcs, slices, DefaultConcurrency)
}

func upsert(ctx context.Context, client kubernetes.Interface, svcs []*corev1.Service, sl []*discoveryv1.EndpointSlice, conc int) (int, error) {
	var n atomic.Int64
	var ipHolder kubernetesIP
	err := forEach(ctx, len(svcs), conc, func(i int) error {
		w, err := upsertService(ctx, client, svcs[i])
		if err != nil {
			return ipHolder.explain(ctx, client, svcs[i], err)
		}
		n.Add(int64(w))
		return nil
	})
	if err != nil {
		return int(n.Load()), err
	}
	err = forEach(ctx, len(sl), conc, func(i int) error {
		if err := upsertSlice(ctx, client, sl[i]); err != nil {
			return err
		}
		n.Add(1)
		return nil
	})
	return int(n.Load()), err
}

// upsertService creates or updates one Service, then writes its status
// (the load balancer's ingress) through the status subresource when the
// API holds another: a controller writes it there, and a create or update
// of the Service itself never keeps it on a real API server. It returns the
// number of writes.
func upsertService(ctx context.Context, client kubernetes.Interface, want *corev1.Service) (int, error) {
	n, err := upsertServiceSpec(ctx, client, want)
	if err != nil {
		return n, err
	}
	w, err := writeServiceStatus(ctx, client, want)
	return n + w, err
}

// writeServiceStatus brings the API's status.loadBalancer of the Service to
// want's (Get, UpdateStatus, retried on a conflict); an equal one is not
// written. It returns 1 when it wrote.
func writeServiceStatus(ctx context.Context, client kubernetes.Interface, want *corev1.Service) (int, error) {
	api := client.CoreV1().Services(want.Namespace)
	n := 0
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if equality.Semantic.DeepEqual(cur.Status.LoadBalancer, want.Status.LoadBalancer) {
			return nil
		}
		rv := cur.ResourceVersion
		cur.Status.LoadBalancer = *want.Status.LoadBalancer.DeepCopy()
		got, err := api.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		// An update the API's defaults make a no-op (an ingress without
		// ipMode gets VIP) keeps the resource version and sends no event.
		if got.ResourceVersion != rv || rv == "" { // the fake clientset keeps no versions
			n = 1
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("could not write the status of Service %s/%s: %w", want.Namespace, want.Name, err)
	}
	return n, nil
}

func upsertServiceSpec(ctx context.Context, client kubernetes.Interface, want *corev1.Service) (int, error) {
	want = forAPI(want)
	api := client.CoreV1().Services(want.Namespace)
	_, err := api.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		return 1, nil
	}
	// kube-apiserver allocates a Service's cluster IP and node ports before
	// it looks for the name, so creating one that exists with its own
	// clusterIP fails as Invalid ("provided IP is already allocated"), not
	// AlreadyExists: either way, update it if it is there.
	if !apierrors.IsAlreadyExists(err) {
		if !apierrors.IsInvalid(err) {
			return 0, fmt.Errorf("could not create Service %s/%s: %w", want.Namespace, want.Name, err)
		}
		if _, gerr := api.Get(ctx, want.Name, metav1.GetOptions{}); gerr != nil {
			return 0, fmt.Errorf("could not create Service %s/%s: %w", want.Namespace, want.Name, err)
		}
	}
	n := 0
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		m := mergeService(cur, want)
		if equality.Semantic.DeepEqual(m.ObjectMeta, cur.ObjectMeta) && equality.Semantic.DeepEqual(m.Spec, cur.Spec) {
			return nil
		}
		if _, err := api.Update(ctx, m, metav1.UpdateOptions{}); err != nil {
			return err
		}
		n = 1
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("could not update Service %s/%s: %w", want.Namespace, want.Name, err)
	}
	return n, nil
}

// forAPI returns a copy of s without what a real API rejects or drops on a
// create: externalTrafficPolicy on a Service that is not externally
// reachable (apiservice.ExternallyAccessible), which no proxy reads, and its
// status (written by controllers through the status subresource:
// writeServiceStatus does that after the create).
func forAPI(s *corev1.Service) *corev1.Service {
	s = s.DeepCopy()
	forCreate(&s.ObjectMeta)
	external := s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer ||
		(s.Spec.Type == corev1.ServiceTypeClusterIP || s.Spec.Type == "") && len(s.Spec.ExternalIPs) > 0
	if !external {
		s.Spec.ExternalTrafficPolicy = ""
	}
	s.Status = corev1.ServiceStatus{}
	return s
}

// forCreate clears what the API server sets on an object and refuses on a
// create: the fields of metadata another API server wrote (an object read
// from a real cluster's `kubectl get -o yaml` carries them). Owner
// references go too: their UIDs name objects of that other cluster, and a
// garbage collector would delete what they point from.
func forCreate(m *metav1.ObjectMeta) {
	m.ResourceVersion, m.UID, m.Generation = "", "", 0
	m.CreationTimestamp, m.DeletionTimestamp, m.DeletionGracePeriodSeconds = metav1.Time{}, nil, nil
	m.ManagedFields, m.OwnerReferences = nil, nil
}

// mergeService is the update of cur (the API's copy) to want: want's labels,
// annotations and spec, with the fields want leaves empty that the API
// allocated or defaulted taken from cur.
func mergeService(cur, want *corev1.Service) *corev1.Service {
	m := cur.DeepCopy()
	m.Labels, m.Annotations = want.Labels, want.Annotations
	spec := want.Spec.DeepCopy()
	old := &cur.Spec
	if spec.ClusterIP == "" {
		spec.ClusterIP = old.ClusterIP
	}
	if len(spec.ClusterIPs) == 0 && spec.ClusterIP == old.ClusterIP {
		spec.ClusterIPs = old.ClusterIPs
	}
	if len(spec.IPFamilies) == 0 {
		spec.IPFamilies = old.IPFamilies
	}
	if spec.IPFamilyPolicy == nil {
		spec.IPFamilyPolicy = old.IPFamilyPolicy
	}
	if spec.Type == "" {
		spec.Type = old.Type
	}
	if spec.SessionAffinity == "" {
		spec.SessionAffinity = old.SessionAffinity
	}
	if spec.SessionAffinityConfig == nil && spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		spec.SessionAffinityConfig = old.SessionAffinityConfig
	}
	if spec.InternalTrafficPolicy == nil {
		spec.InternalTrafficPolicy = old.InternalTrafficPolicy
	}
	// An unset policy keeps the API's (its default, Cluster), unless the
	// Service is no longer externally accessible (the API refuses a
	// policy there).
	external := spec.Type == corev1.ServiceTypeNodePort || spec.Type == corev1.ServiceTypeLoadBalancer ||
		(spec.Type == corev1.ServiceTypeClusterIP || spec.Type == "") && len(spec.ExternalIPs) > 0
	if spec.ExternalTrafficPolicy == "" && spec.Type == old.Type && external {
		spec.ExternalTrafficPolicy = old.ExternalTrafficPolicy
	}
	if spec.HealthCheckNodePort == 0 {
		spec.HealthCheckNodePort = old.HealthCheckNodePort
	}
	if spec.AllocateLoadBalancerNodePorts == nil {
		spec.AllocateLoadBalancerNodePorts = old.AllocateLoadBalancerNodePorts
	}
	for i := range spec.Ports {
		p := &spec.Ports[i]
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		for _, q := range old.Ports {
			if q.Port != p.Port || q.Protocol != p.Protocol {
				continue
			}
			if p.NodePort == 0 {
				p.NodePort = q.NodePort
			}
			if p.TargetPort.Type == 0 && p.TargetPort.IntVal == 0 {
				p.TargetPort = q.TargetPort
			}
		}
	}
	m.Spec = *spec
	return m
}

// upsertSlice creates an EndpointSlice, or updates the API's current one to
// want's labels, annotations, address type, ports and endpoints; each write
// is stamped.
func upsertSlice(ctx context.Context, client kubernetes.Interface, want *discoveryv1.EndpointSlice) error {
	api := client.DiscoveryV1().EndpointSlices(want.Namespace)
	x := want.DeepCopy()
	forCreate(&x.ObjectMeta)
	stampTrigger(x)
	_, err := api.Create(ctx, x, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("could not create EndpointSlice %s/%s: %w", want.Namespace, want.Name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		m := cur.DeepCopy()
		m.Labels, m.Annotations = want.Labels, want.Annotations
		m.AddressType, m.Ports, m.Endpoints = want.AddressType, want.Ports, want.Endpoints
		m = m.DeepCopy()
		stampTrigger(m)
		_, err = api.Update(ctx, m, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("could not update EndpointSlice %s/%s: %w", want.Namespace, want.Name, err)
	}
	return nil
}

// DeleteObjects deletes Services and EndpointSlices by name (the Services
// first). An object already gone is skipped. It returns the number of
// deletions made (one informer event each).
func DeleteObjects(ctx context.Context, client kubernetes.Interface, svcs []types.NamespacedName, slices []types.NamespacedName) (int, error) {
	return deleteObjects(ctx, client, svcs, slices, DefaultConcurrency)
}

func deleteObjects(ctx context.Context, client kubernetes.Interface, svcs, sl []types.NamespacedName, conc int) (int, error) {
	var n atomic.Int64
	del := func(kind string, names []types.NamespacedName, f func(types.NamespacedName) error) error {
		return forEach(ctx, len(names), conc, func(i int) error {
			err := f(names[i])
			switch {
			case apierrors.IsNotFound(err):
				return nil
			case err != nil:
				return fmt.Errorf("could not delete %s %s: %w", kind, names[i], err)
			}
			n.Add(1)
			return nil
		})
	}
	err := del("Service", svcs, func(k types.NamespacedName) error {
		return client.CoreV1().Services(k.Namespace).Delete(ctx, k.Name, metav1.DeleteOptions{})
	})
	if err == nil {
		err = del("EndpointSlice", sl, func(k types.NamespacedName) error {
			return client.DiscoveryV1().EndpointSlices(k.Namespace).Delete(ctx, k.Name, metav1.DeleteOptions{})
		})
	}
	return int(n.Load()), err
}

// DeleteOptions says what Delete removes beyond Services and EndpointSlices.
type DeleteOptions struct {
	// Namespaces deletes the scenario's namespaces too. Without a namespace
	// controller (kube-controller-manager), a deleted namespace stays
	// Terminating for good and cannot take new objects: leave this off when
	// the API server is reused.
	Namespaces bool
	// Concurrency is how many deletions are in flight (DefaultConcurrency
	// when 0).
	Concurrency int
}

// Delete removes what Seed wrote, for harnesses that reuse one API server
// across scenarios: the scenario's Services, its EndpointSlices and every
// other slice labelled with one of its Services (scale steps create some),
// and with o.Namespaces its namespaces. Nodes stay (the next Seed updates
// them). It returns the number of deletions of watched kinds.
func Delete(ctx context.Context, client kubernetes.Interface, exp *scenario.Expanded, o DeleteOptions) (int, error) {
	var svcs, sl []types.NamespacedName
	ours := map[types.NamespacedName]bool{}
	for _, s := range exp.Services {
		k := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
		svcs = append(svcs, k)
		ours[k] = true
	}
	seen := map[types.NamespacedName]bool{}
	// One List per namespace, not one per Service: the slices labelled
	// with one of the scenario's Services.
	for _, ns := range namespaces(exp.Services, nil) {
		l, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, fmt.Errorf("could not list the EndpointSlices of namespace %s: %w", ns, err)
		}
		for _, x := range l.Items {
			if ours[types.NamespacedName{Namespace: ns, Name: x.Labels[discoveryv1.LabelServiceName]}] {
				k := types.NamespacedName{Namespace: ns, Name: x.Name}
				seen[k] = true
				sl = append(sl, k)
			}
		}
	}
	for _, x := range exp.Slices {
		if k := (types.NamespacedName{Namespace: x.Namespace, Name: x.Name}); !seen[k] {
			sl = append(sl, k)
		}
	}
	n, err := deleteObjects(ctx, client, svcs, sl, o.Concurrency)
	if err != nil || !o.Namespaces {
		return n, err
	}
	for _, ns := range namespaces(exp.Services, exp.Slices) {
		if err := client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return n, fmt.Errorf("could not delete Namespace %s: %w", ns, err)
		}
	}
	return n, nil
}

// namespaces returns the namespaces of the objects, sorted.
func namespaces(svcs []*corev1.Service, sl []*discoveryv1.EndpointSlice) []string {
	set := map[string]bool{}
	for _, s := range svcs {
		set[s.Namespace] = true
	}
	for _, s := range sl {
		set[s.Namespace] = true
	}
	out := make([]string, 0, len(set))
	for ns := range set {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

// ensureNamespaces creates the objects' namespaces that the API lacks (a
// real API refuses objects in a missing namespace). A namespace being
// deleted is an error: nothing would finish its deletion.
func ensureNamespaces(ctx context.Context, client kubernetes.Interface, svcs []*corev1.Service, sl []*discoveryv1.EndpointSlice) error {
	api := client.CoreV1().Namespaces()
	for _, ns := range namespaces(svcs, sl) {
		cur, err := api.Get(ctx, ns, metav1.GetOptions{})
		if err == nil {
			if cur.Status.Phase == corev1.NamespaceTerminating {
				return fmt.Errorf("namespace %s is being deleted; without a namespace controller it stays so: use another name", ns)
			}
			continue
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("could not read Namespace %s: %w", ns, err)
		}
		_, err = api.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("could not create Namespace %s: %w", ns, err)
		}
	}
	return nil
}

// kubernetesIP explains a Service create the API refused over its cluster
// IP when that IP is default/kubernetes's (the first address of the
// service range, taken by the API server itself).
type kubernetesIP struct {
	once sync.Once
	ip   string
}

func (k *kubernetesIP) explain(ctx context.Context, client kubernetes.Interface, s *corev1.Service, err error) error {
	if !apierrors.IsInvalid(err) || s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
		return err
	}
	k.once.Do(func() {
		if d, gerr := client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{}); gerr == nil {
			k.ip = d.Spec.ClusterIP
		}
	})
	if k.ip != s.Spec.ClusterIP || (s.Namespace == metav1.NamespaceDefault && s.Name == "kubernetes") {
		return err
	}
	return fmt.Errorf("%w (clusterIP %s is held by the API server's own Service default/kubernetes, the first address of the service range: give %s/%s another)",
		err, s.Spec.ClusterIP, s.Namespace, s.Name)
}

// forEach runs f(0..n-1) with at most conc (DefaultConcurrency when 0)
// calls in flight; the first error stops new calls and is returned.
func forEach(ctx context.Context, n, conc int, f func(int) error) error {
	if conc <= 0 {
		conc = DefaultConcurrency
	}
	var (
		next  atomic.Int64
		first error
		mu    sync.Mutex
		wg    sync.WaitGroup
	)
	failed := func() bool { mu.Lock(); defer mu.Unlock(); return first != nil }
	for w := 0; w < min(conc, n); w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || failed() || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}

// stampTrigger sets the annotation the EndpointSlice controller writes: when
// the change that caused this write happened. Proxies measure the network
// programming latency from it (kube-proxy records
// network_programming_duration_seconds only for slices that carry it).
func stampTrigger(s *discoveryv1.EndpointSlice) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
}
