package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Cluster runs shared informers over the Services, EndpointSlices and Nodes
// of one API, client-go's fake clientset (Load, New) or a real kube-apiserver
// (Connect), feeds trackers from them and writes the timeline through the
// same client (Apply).
type Cluster struct {
	// Client is the API: write events through it so that every tracker sees
	// them as informer updates.
	Client  kubernetes.Interface
	factory informers.SharedInformerFactory
	svc     cache.SharedIndexInformer
	slice   cache.SharedIndexInformer
	node    cache.SharedIndexInformer
	regs    []cache.ResourceEventHandlerRegistration
	cancel  context.CancelFunc
	started bool
	// allocated holds the endpoint addresses scale steps handed out, so
	// that a later scale never reuses one the informer cache has not
	// received yet (a real API's watch lags the write).
	mu        sync.Mutex
	allocated map[netip.Addr]bool
}

// Writer is where the harness writes the API: a timeline step, the objects
// of a scenario. *Cluster implements it over any clientset (the simulator's
// fake one, a real kube-apiserver's).
type Writer interface {
	// Apply writes one timeline step and returns the number of API writes
	// it made (each is one informer event for every tracker).
	Apply(ctx context.Context, s Step) (int, error)
}

var _ Writer = (*Cluster)(nil)

// Connect returns a Cluster over any clientset, a real kube-apiserver's
// included, with no objects loaded: informers over Services,
// EndpointSlices and Nodes as Load's; Start, AddTracker, AddTrackerSynced
// and Apply work the same. Objects come from the API (Seed, Upsert, or
// whoever else writes it). Our own dataplane runs against a real API
// server this way: Connect(client), Start, AddTrackerSynced, then
// dataplane.NewSyncer over that tracker, exactly as harness/conform does
// over the fake clientset.
func Connect(client kubernetes.Interface) (*Cluster, error) {
	return newCluster(client)
}

// Load expands a scenario straight into a fake clientset (objects are
// streamed, never held twice) and prepares the informers. The expansion
// and the clientset's copying of each object run side by side (two
// goroutines, the objects in order through a channel).
func Load(l *scenario.Loaded, seed *uint64) (*Cluster, *scenario.Expanded, error) {
	client := fake.NewSimpleClientset()
	tr := client.Tracker()
	add := func(o runtime.Object) error {
		if err := tr.Add(o); err != nil {
			return fmt.Errorf("could not load %T into the fake clientset: %w", o, err)
		}
		return nil
	}
	objs := make(chan runtime.Object, 1024)
	added := make(chan error, 1)
	var failed atomic.Pointer[error]
	go func() {
		var err error
		for o := range objs {
			if err == nil {
				if err = add(o); err != nil {
					failed.Store(&err)
				}
			}
		}
		added <- err
	}()
	exp, err := scenario.ExpandTo(l, seed, func(o runtime.Object) error {
		if e := failed.Load(); e != nil {
			return *e // stops the expansion, as add's error did
		}
		objs <- o
		return nil
	})
	close(objs)
	if addErr := <-added; addErr != nil {
		return nil, nil, addErr
	}
	if err != nil {
		return nil, nil, err
	}
	for _, n := range exp.Nodes {
		if err := add(n); err != nil {
			return nil, nil, err
		}
	}
	c, err := newCluster(client)
	if err != nil {
		return nil, nil, err
	}
	return c, exp, nil
}

// New loads already expanded objects (Expand's lists) into a fake clientset.
func New(exp *scenario.Expanded) (*Cluster, error) {
	client := fake.NewSimpleClientset()
	tr := client.Tracker()
	var objs []runtime.Object
	for _, n := range exp.Nodes {
		objs = append(objs, n)
	}
	for _, s := range exp.Services {
		objs = append(objs, s)
	}
	for _, s := range exp.Slices {
		objs = append(objs, s)
	}
	for _, p := range exp.Pods {
		objs = append(objs, p)
	}
	for _, o := range objs {
		if err := tr.Add(o); err != nil {
			return nil, fmt.Errorf("could not load %T into the fake clientset: %w", o, err)
		}
	}
	return newCluster(client)
}

func newCluster(client kubernetes.Interface) (*Cluster, error) {
	f := informers.NewSharedInformerFactory(client, 0)
	c := &Cluster{
		Client:    client,
		factory:   f,
		svc:       f.Core().V1().Services().Informer(),
		slice:     f.Discovery().V1().EndpointSlices().Informer(),
		node:      f.Core().V1().Nodes().Informer(),
		allocated: map[netip.Addr]bool{},
	}
	err := c.slice.AddIndexers(cache.Indexers{byServiceIndex: func(o any) ([]string, error) {
		s := o.(*discoveryv1.EndpointSlice)
		return []string{s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]}, nil
	}})
	if err != nil {
		return nil, fmt.Errorf("could not index EndpointSlices: %w", err)
	}
	return c, nil
}

const byServiceIndex = "service"

// AddTracker registers a new tracker's handlers on the shared informers. It
// may be called before or after Start; a tracker added late is replayed the
// current objects.
func (c *Cluster) AddTracker() (*cluster.Tracker, error) {
	t := cluster.NewTracker()
	hs, hsl, hn := handlers(t)
	for _, p := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{{c.node, hn}, {c.svc, hs}, {c.slice, hsl}} {
		reg, err := p.inf.AddEventHandler(p.h)
		if err != nil {
			return nil, fmt.Errorf("could not register tracker: %w", err)
		}
		c.regs = append(c.regs, reg)
	}
	return t, nil
}

// AddTrackerSynced adds a tracker to running informers and waits, bounded
// by timeout, until it has received every current object, then drains it
// once so that its first Drain by a consumer starts from the full state.
func (c *Cluster) AddTrackerSynced(ctx context.Context, timeout time.Duration) (*cluster.Tracker, error) {
	n := len(c.regs)
	t, err := c.AddTracker()
	if err != nil {
		return nil, err
	}
	var synced []cache.InformerSynced
	for _, r := range c.regs[n:] {
		synced = append(synced, r.HasSynced)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), synced...) {
		return nil, fmt.Errorf("a new tracker did not receive the objects within %s", timeout)
	}
	return t, nil
}

// Start runs the informers and waits, bounded by timeout, until they have
// listed every object and every tracker has received it.
func (c *Cluster) Start(ctx context.Context, timeout time.Duration) error {
	ctx, c.cancel = context.WithCancel(ctx)
	c.factory.Start(ctx.Done())
	c.started = true
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	synced := []cache.InformerSynced{c.svc.HasSynced, c.slice.HasSynced, c.node.HasSynced}
	for _, r := range c.regs {
		synced = append(synced, r.HasSynced)
	}
	if !cache.WaitForCacheSync(wctx.Done(), synced...) {
		return fmt.Errorf("informers did not sync within %s", timeout)
	}
	return nil
}

// Stop ends the informers.
func (c *Cluster) Stop() {
	if c.cancel != nil {
		c.cancel()
	}
	if c.started {
		c.factory.Shutdown()
	}
}

// Service returns a Service from the informer cache.
func (c *Cluster) Service(ns, name string) (*corev1.Service, bool) {
	o, ok, err := c.svc.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	return o.(*corev1.Service), true
}

// SlicesOf returns the EndpointSlices of a Service from the informer cache.
func (c *Cluster) SlicesOf(ns, name string) []*discoveryv1.EndpointSlice {
	objs, _ := c.slice.GetIndexer().ByIndex(byServiceIndex, ns+"/"+name)
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*discoveryv1.EndpointSlice))
	}
	return out
}

// handlers returns informer event handlers feeding a tracker.
func handlers(t *cluster.Tracker) (svc, slice, node cache.ResourceEventHandler) {
	svc = cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			s := o.(*corev1.Service)
			t.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s)
		},
		UpdateFunc: func(_, o any) {
			s := o.(*corev1.Service)
			t.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s)
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if s, ok := o.(*corev1.Service); ok {
				t.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, nil)
			}
		},
	}
	sl := func(o any, deleted bool) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		s, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		if deleted {
			t.OnEndpointSlice(s.Namespace, s.Name, nil, s.Labels[discoveryv1.LabelServiceName])
		} else {
			t.OnEndpointSlice(s.Namespace, s.Name, s, s.Labels[discoveryv1.LabelServiceName])
		}
	}
	slice = cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { sl(o, false) },
		UpdateFunc: func(_, o any) { sl(o, false) },
		DeleteFunc: func(o any) { sl(o, true) },
	}
	node = cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { n := o.(*corev1.Node); t.OnNode(n.Name, n) },
		UpdateFunc: func(_, o any) { n := o.(*corev1.Node); t.OnNode(n.Name, n) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if n, ok := o.(*corev1.Node); ok {
				t.OnNode(n.Name, nil)
			}
		},
	}
	return svc, slice, node
}
