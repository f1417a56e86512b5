package dataplane

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// recordingBackend records each Sync call; it fails while fail is set.
type recordingBackend struct {
	mu    sync.Mutex
	calls []call
	fail  bool
}

type call struct {
	full    bool
	changed []string
}

func (b *recordingBackend) Sync(st *cluster.State, changed []cluster.ServicePortName, full bool) (SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := call{full: full}
	for _, n := range changed {
		c.changed = append(c.changed, n.String())
	}
	b.calls = append(b.calls, c)
	if b.fail {
		return SyncResult{}, errors.New("iptables-restore: line 3 failed")
	}
	return SyncResult{Full: full, NoLocalEndpoints: map[string]int{"internal": 2}}, nil
}
func (b *recordingBackend) Dump() (string, error)        { return "", nil }
func (b *recordingBackend) Counters() ([]Counter, error) { return nil, nil }
func (b *recordingBackend) Cleanup() error               { return nil }

var _ Backend = &recordingBackend{}

func slice(name string, ready bool) *discoveryv1.EndpointSlice {
	port, proto := int32(80), corev1.ProtocolTCP
	pn := "http"
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Add(-2 * time.Second).UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pn, Port: &port, Protocol: &proto}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
}

func TestSyncOnceFullThenPartial(t *testing.T) {
	tr := cluster.NewTracker()
	b := &recordingBackend{}
	s := NewSyncer(SyncConfig{MinSyncPeriod: time.Second, SyncPeriod: time.Hour}, b, tr, nil)
	tr.OnEndpointSlice("ns", "a-x", slice("a", true), "a")
	if err := s.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	tr.OnEndpointSlice("ns", "b-x", slice("b", true), "b")
	if err := s.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	if len(b.calls) != 2 || !b.calls[0].full || b.calls[1].full || strings.Join(b.calls[1].changed, ",") != "ns/b:http" {
		t.Fatalf("calls %+v: want a full sync, then a partial one naming ns/b:http", b.calls)
	}
	// A failure forces the next sync to be full and keeps the pending names.
	b.fail = true
	tr.OnEndpointSlice("ns", "a-x", slice("a", false), "a")
	if err := s.SyncOnce(); err == nil {
		t.Fatal("the failure was not reported")
	}
	b.fail = false
	if err := s.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	last := b.calls[len(b.calls)-1]
	if !last.full || strings.Join(last.changed, ",") != "ns/a:http" {
		t.Errorf("after a failure: %+v, want a full sync still naming ns/a:http", last)
	}
	var text strings.Builder
	if err := s.Metrics().WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kubeproxy_sync_proxy_rules_duration_seconds_count 3",
		"kubeproxy_sync_full_proxy_rules_duration_seconds_count 2",
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total 1",
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal"} 2`,
		"kubeproxy_network_programming_duration_seconds_count 3",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, text.String())
		}
	}
}

// TestRunCoalesces: changes arriving within MinSyncPeriod of a sync wait and
// are applied together. The bounds are loose (no timing is asserted, only
// that a burst does not produce a sync per change).
func TestRunCoalesces(t *testing.T) {
	tr := cluster.NewTracker()
	b := &recordingBackend{}
	s := NewSyncer(SyncConfig{MinSyncPeriod: 300 * time.Millisecond, SyncPeriod: time.Hour}, b, tr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	first := s.Synced()
	go func() { done <- s.Run(ctx) }()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no initial sync")
	}
	next := s.Synced()
	for i := 0; i < 20; i++ {
		tr.OnEndpointSlice("ns", "a-x", slice("a", i%2 == 0), "a")
	}
	select {
	case <-next:
	case <-time.After(10 * time.Second):
		t.Fatal("changes were never synced")
	}
	cancel()
	<-done
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.calls) > 4 {
		t.Errorf("20 changes in a burst caused %d syncs", len(b.calls))
	}
}

// recordingCleaner says a sync requires a cleanup when its changes name an
// endpoint change of port "dns", and records the cleanups.
type recordingCleaner struct{ cleaned int }

func (c *recordingCleaner) Required(ch cluster.Changes, _ *cluster.State) bool {
	for _, n := range ch.Endpoints {
		if n.Name == "dns" {
			return true
		}
	}
	return false
}

func (c *recordingCleaner) Clean(*cluster.State) (int, error) { c.cleaned++; return 2, nil }

// TestSyncConntrack: the cleanup runs after a successful sync whose drain
// requires it, not after other syncs, and not after a later sync when the
// sync that drained the change failed (kube-proxy's ConntrackCleanupRequired
// belongs to one endpoints-map update).
func TestSyncConntrack(t *testing.T) {
	tr := cluster.NewTracker()
	b := &recordingBackend{}
	c := &recordingCleaner{}
	s := NewSyncer(SyncConfig{SyncPeriod: time.Hour}, b, tr, nil)
	s.SetConntrack(c)
	tr.OnEndpointSlice("ns", "web-x", slice("web", true), "web")
	if err := s.SyncOnce(); err != nil || c.cleaned != 0 {
		t.Fatalf("web: err %v, %d cleanups, want none", err, c.cleaned)
	}
	tr.OnEndpointSlice("ns", "dns-x", slice("dns", true), "dns")
	if err := s.SyncOnce(); err != nil || c.cleaned != 1 {
		t.Fatalf("dns: err %v, %d cleanups, want 1", err, c.cleaned)
	}
	b.fail = true
	tr.OnEndpointSlice("ns", "dns-x", slice("dns", false), "dns")
	if err := s.SyncOnce(); err == nil || c.cleaned != 1 {
		t.Fatalf("failed sync: err %v, %d cleanups, want 1", err, c.cleaned)
	}
	b.fail = false
	if err := s.SyncOnce(); err != nil || c.cleaned != 1 {
		t.Fatalf("the sync after the failure: err %v, %d cleanups, want 1", err, c.cleaned)
	}
	var text strings.Builder
	if err := s.Metrics().WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kubeproxy_conntrack_reconciler_sync_duration_seconds_count 1", "kubeproxy_conntrack_reconciler_deleted_entries_total 2"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
