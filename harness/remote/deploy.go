package remote

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Agent is one running agent pod.
type Agent struct {
	Namespace, Name, Node string
	IP                    netip.Addr
}

// Placement is what Deploy placed: the scenario's addresses and names
// against the cluster's.
type Placement struct {
	RunID string
	// Endpoint maps a scenario endpoint address to its echo pod's address.
	Endpoint map[netip.Addr]netip.Addr
	// Echoes are the echo pods, by their own address.
	Echoes map[netip.Addr]Agent
	// Probers are the prober pods, by cluster node.
	Probers map[string]Agent
	// Services are the Services as the cluster created them (allocated
	// cluster IPs and node ports), by the scenario's namespace and name.
	Services map[types.NamespacedName]*corev1.Service
}

// pollInterval is how often the waits look.
const pollInterval = 500 * time.Millisecond

// Deploy writes the plan: namespaces, agents (waiting, at most timeout,
// until each is Ready), Services, then the EndpointSlices with the echo
// pods' addresses. On error the caller deletes the run (Delete): Deploy
// leaves what it wrote for it to find by the run's label.
func Deploy(ctx context.Context, client kubernetes.Interface, p *Plan, timeout time.Duration) (*Placement, error) {
	deadline := time.Now().Add(timeout)
	for _, ns := range p.Namespaces {
		if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("could not create namespace %s: %w", ns.Name, err)
		}
	}
	// The ServiceAccount admission refuses pods until the namespace's
	// default ServiceAccount exists (the controller manager makes it).
	if err := waitServiceAccounts(ctx, client, p, deadline); err != nil {
		return nil, err
	}
	for _, pod := range p.Echo {
		if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("could not create echo pod %s/%s on node %s: %w", pod.Namespace, pod.Name, pod.Spec.NodeName, err)
		}
	}
	if _, err := client.AppsV1().DaemonSets(p.Prober.Namespace).Create(ctx, p.Prober, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("could not create the prober DaemonSet %s/%s: %w", p.Prober.Namespace, p.Prober.Name, err)
	}
	pl := &Placement{RunID: p.RunID, Endpoint: map[netip.Addr]netip.Addr{}, Echoes: map[netip.Addr]Agent{}, Probers: map[string]Agent{},
		Services: map[types.NamespacedName]*corev1.Service{}}
	if err := waitAgents(ctx, client, p, pl, deadline); err != nil {
		return nil, err
	}
	for _, s := range p.Services {
		got, err := client.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("could not create Service %s/%s: %w", s.Namespace, s.Name, err)
		}
		pl.Services[types.NamespacedName{Namespace: p.scenarioNS(s.Namespace), Name: s.Name}] = got
	}
	for _, sl := range p.Slices {
		x, err := pl.endpoints(sl)
		if err != nil {
			return nil, err
		}
		if _, err := client.DiscoveryV1().EndpointSlices(x.Namespace).Create(ctx, x, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("could not create EndpointSlice %s/%s: %w", x.Namespace, x.Name, err)
		}
	}
	return pl, nil
}

// endpoints is a slice of the run (namespace and nodes already the
// cluster's) with the echo pods' addresses and references for the
// scenario's.
func (pl *Placement) endpoints(sl *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	x := sl.DeepCopy()
	for i, ep := range x.Endpoints {
		for j, a := range ep.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return nil, fmt.Errorf("EndpointSlice %s/%s endpoints[%d]: address %q: %w", sl.Namespace, sl.Name, i, a, err)
			}
			real, ok := pl.Endpoint[ip]
			if !ok {
				return nil, fmt.Errorf("EndpointSlice %s/%s: no echo pod for %s (a timeline that adds endpoints is not run on a cluster)", sl.Namespace, sl.Name, ip)
			}
			x.Endpoints[i].Addresses[j] = real.String()
			if j == 0 {
				a := pl.Echoes[real]
				x.Endpoints[i].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: a.Namespace, Name: a.Name}
			}
		}
	}
	return x, nil
}

// waitServiceAccounts waits until every namespace of the run has its
// default ServiceAccount.
func waitServiceAccounts(ctx context.Context, client kubernetes.Interface, p *Plan, deadline time.Time) error {
	for _, ns := range p.Namespaces {
		for {
			_, err := client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
			if err == nil {
				break
			}
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("namespace %s: the default ServiceAccount: %w", ns.Name, err)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("namespace %s has no default ServiceAccount yet (the controller manager's serviceaccount controller makes it; pods are refused until then)", ns.Name)
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// scenarioNS is the scenario namespace of one of the run's.
func (p *Plan) scenarioNS(runNS string) string {
	for from, to := range p.nsOf {
		if to == runNS {
			return from
		}
	}
	return runNS
}

// waitAgents waits until every echo pod and one prober pod on each prober
// node are Ready, and records them. On timeout the error names each pod
// that is not, its node, and why.
func waitAgents(ctx context.Context, client kubernetes.Interface, p *Plan, pl *Placement, deadline time.Time) error {
	echoAddr := map[string]netip.Addr{}
	for a, name := range p.echoOf {
		echoAddr[name] = a
	}
	for {
		pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: LabelRun + "=" + p.RunID})
		if err != nil {
			return fmt.Errorf("could not list the run's pods: %w", err)
		}
		var waiting []*corev1.Pod
		ready := map[string]bool{}
		for i := range pods.Items {
			pod := &pods.Items[i]
			if !podReady(pod) {
				waiting = append(waiting, pod)
				continue
			}
			ip, err := netip.ParseAddr(pod.Status.PodIP)
			if err != nil {
				return fmt.Errorf("pod %s/%s on node %s: address %q: %w", pod.Namespace, pod.Name, pod.Spec.NodeName, pod.Status.PodIP, err)
			}
			a := Agent{Namespace: pod.Namespace, Name: pod.Name, Node: pod.Spec.NodeName, IP: ip}
			switch pod.Labels[LabelRole] {
			case "echo":
				if model, ok := echoAddr[pod.Namespace+"/"+pod.Name]; ok {
					pl.Endpoint[model], pl.Echoes[ip] = ip, a
					ready[pod.Namespace+"/"+pod.Name] = true
				}
			case "prober":
				pl.Probers[a.Node] = a
			}
		}
		var missing []string
		for _, pod := range p.Echo {
			if !ready[pod.Namespace+"/"+pod.Name] && !slices.ContainsFunc(waiting, func(w *corev1.Pod) bool { return w.Namespace == pod.Namespace && w.Name == pod.Name }) {
				missing = append(missing, fmt.Sprintf("echo pod %s/%s (node %s) does not exist", pod.Namespace, pod.Name, pod.Spec.NodeName))
			}
		}
		for _, n := range p.proberNodes {
			if _, ok := pl.Probers[n]; !ok && !slices.ContainsFunc(waiting, func(w *corev1.Pod) bool {
				return w.Labels[LabelRole] == "prober" && w.Spec.NodeName == n
			}) {
				missing = append(missing, fmt.Sprintf("no prober pod on node %s yet (DaemonSet %s/%s)", n, p.Home, ProberName))
			}
		}
		if len(waiting) == 0 && len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var why []string
			for _, w := range waiting {
				why = append(why, podProblem(ctx, client, w))
			}
			why = append(why, missing...)
			sort.Strings(why)
			return fmt.Errorf("%d agent pods not Ready in time:\n  %s", len(why), strings.Join(why, "\n  "))
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(pollInterval):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podProblem says why a pod is not Ready: its node, phase, scheduling,
// each container's waiting or terminated state, and its latest warning.
func podProblem(ctx context.Context, client kubernetes.Interface, p *corev1.Pod) string {
	node := p.Spec.NodeName
	if node == "" {
		node = "(not scheduled)"
	}
	parts := []string{fmt.Sprintf("pod %s/%s on node %s: phase %s", p.Namespace, p.Name, node, p.Status.Phase)}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && (c.Type == corev1.PodScheduled || c.Type == corev1.PodReady) && (c.Reason != "" || c.Message != "") {
			parts = append(parts, fmt.Sprintf("%s: %s %s", c.Type, c.Reason, c.Message))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("container %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("container %s terminated: %s (exit %d) %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message))
		case cs.State.Running != nil && !cs.Ready:
			parts = append(parts, fmt.Sprintf("container %s running, readiness probe not passing (restarts %d)", cs.Name, cs.RestartCount))
		}
	}
	ev, err := client.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
	if err == nil {
		var last *corev1.Event
		for i := range ev.Items {
			e := &ev.Items[i]
			if e.Type == corev1.EventTypeWarning && (last == nil || e.LastTimestamp.After(last.LastTimestamp.Time)) {
				last = e
			}
		}
		if last != nil {
			parts = append(parts, fmt.Sprintf("last warning: %s: %s", last.Reason, strings.TrimSpace(last.Message)))
		}
	}
	return strings.Join(parts, "; ")
}

// Delete removes a run's namespaces (everything it wrote is in them) and
// waits, at most timeout, until they are gone.
func Delete(ctx context.Context, client kubernetes.Interface, runID string, timeout time.Duration) error {
	_, err := deleteNamespaces(ctx, client, LabelRun+"="+runID, timeout)
	return err
}

// RunNamespace is a namespace a run made, as Cleanup finds it.
type RunNamespace struct {
	Name, RunID, Owner string
	// Alive says its owner is a live process on this host.
	Alive       bool
	Terminating bool
}

// Runs lists the namespaces runs made on the cluster.
func Runs(ctx context.Context, client kubernetes.Interface) ([]RunNamespace, error) {
	list, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: LabelRun})
	if err != nil {
		return nil, fmt.Errorf("could not list namespaces: %w", err)
	}
	var out []RunNamespace
	for _, ns := range list.Items {
		o := ns.Annotations[AnnotationOwner]
		out = append(out, RunNamespace{Name: ns.Name, RunID: ns.Labels[LabelRun], Owner: o, Alive: ownerAlive(o), Terminating: ns.DeletionTimestamp != nil})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Cleanup removes the namespaces runs left on the cluster (sim cleanup
// --kubeconfig), those of live runs on this host only with force, waits
// (at most timeout) until they are gone, and returns what it found.
func Cleanup(ctx context.Context, client kubernetes.Interface, force bool, timeout time.Duration) ([]RunNamespace, error) {
	runs, err := Runs(ctx, client)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, r := range runs {
		if force || !r.Alive {
			ids[r.RunID] = true
		}
	}
	var errs []error
	for id := range ids {
		if _, err := deleteNamespaces(ctx, client, LabelRun+"="+id, timeout); err != nil {
			errs = append(errs, err)
		}
	}
	return runs, errors.Join(errs...)
}

// owner is this process as a namespace's owner: "host/pid".
func owner() string {
	h, _ := os.Hostname()
	return h + "/" + strconv.Itoa(os.Getpid())
}

// ownerAlive reports whether owner ("host/pid") is a live process on this
// host (a run elsewhere cannot be told: it is not alive here).
func ownerAlive(owner string) bool {
	h, pid, ok := strings.Cut(owner, "/")
	me, _ := os.Hostname()
	n, err := strconv.Atoi(pid)
	if !ok || h != me || err != nil || n <= 0 {
		return false
	}
	return syscall.Kill(n, 0) == nil
}

func deleteNamespaces(ctx context.Context, client kubernetes.Interface, selector string, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	list, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("could not list namespaces (%s): %w", selector, err)
	}
	var names []string
	bg := metav1.DeletePropagationBackground
	for _, ns := range list.Items {
		names = append(names, ns.Name)
		if ns.DeletionTimestamp != nil {
			continue
		}
		err := client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		if err != nil && !apierrors.IsNotFound(err) {
			return names, fmt.Errorf("could not delete namespace %s: %w", ns.Name, err)
		}
	}
	for {
		var left []string
		for _, n := range names {
			_, err := client.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return names, fmt.Errorf("could not read namespace %s: %w", n, err)
			default:
				left = append(left, n)
			}
		}
		if len(left) == 0 {
			return names, nil
		}
		if time.Now().After(deadline) {
			return names, fmt.Errorf("namespaces still terminating after %s: %s (their pods' nodes may be unreachable; delete them by hand: kubectl delete namespace %s)",
				timeout, strings.Join(left, ", "), strings.Join(left, " "))
		}
		select {
		case <-ctx.Done():
			return names, errors.Join(context.Cause(ctx), fmt.Errorf("namespaces not yet gone: %s", strings.Join(left, ", ")))
		case <-time.After(pollInterval):
		}
	}
}

// Mirror makes the run's EndpointSlices of one scenario Service what the
// model's are (model: the scenario namespace's slices of that Service, as
// the model holds them after a timeline step): each translated to the
// run's namespace, nodes and echo pods, updated or created by name, and
// the run's slices of the Service the model no longer has deleted. It
// returns the number of writes.
func (pl *Placement) Mirror(ctx context.Context, client kubernetes.Interface, p *Plan, service types.NamespacedName, model []*discoveryv1.EndpointSlice) (int, error) {
	ns := p.Namespace(service.Namespace)
	if ns == "" {
		return 0, fmt.Errorf("service %s: its namespace is not in the run", service)
	}
	api := client.DiscoveryV1().EndpointSlices(ns)
	cur, err := api.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service.Name})
	if err != nil {
		return 0, fmt.Errorf("could not list the EndpointSlices of %s/%s: %w", ns, service.Name, err)
	}
	have := map[string]*discoveryv1.EndpointSlice{}
	for i := range cur.Items {
		have[cur.Items[i].Name] = &cur.Items[i]
	}
	writes := 0
	for _, m := range model {
		x := m.DeepCopy()
		forRun(&x.ObjectMeta, ns, p.RunID)
		x.Labels[discoveryv1.LabelManagedBy] = ManagedBy
		for i, ep := range x.Endpoints {
			if ep.NodeName != nil {
				node := p.Node(*ep.NodeName)
				if node == "" {
					return writes, fmt.Errorf("EndpointSlice %s/%s endpoints[%d]: node %q is not in the run", m.Namespace, m.Name, i, *ep.NodeName)
				}
				x.Endpoints[i].NodeName = &node
			}
		}
		if x, err = pl.endpoints(x); err != nil {
			return writes, err
		}
		if old := have[x.Name]; old != nil {
			old = old.DeepCopy()
			old.Endpoints, old.Ports, old.Labels, old.Annotations = x.Endpoints, x.Ports, x.Labels, x.Annotations
			if _, err := api.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
				return writes, fmt.Errorf("could not update EndpointSlice %s/%s: %w", ns, x.Name, err)
			}
			delete(have, x.Name)
		} else if _, err := api.Create(ctx, x, metav1.CreateOptions{}); err != nil {
			return writes, fmt.Errorf("could not create EndpointSlice %s/%s: %w", ns, x.Name, err)
		}
		writes++
	}
	for name := range have {
		if err := api.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return writes, fmt.Errorf("could not delete EndpointSlice %s/%s: %w", ns, name, err)
		}
		writes++
	}
	return writes, nil
}
