package dataplane

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// loopbackListen listens on 127.0.0.1 at a free port for each requested
// address and remembers where, so a test can reach "node:30011" without a
// namespace.
type loopbackListen struct {
	mu    sync.Mutex
	where map[netip.AddrPort]string
}

func (l *loopbackListen) listen(a netip.AddrPort) (net.Listener, error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.where[a] = ln.Addr().String()
	return ln, nil
}

func (l *loopbackListen) get(t *testing.T, a netip.AddrPort, path string) (int, http.Header, string) {
	t.Helper()
	l.mu.Lock()
	addr, ok := l.where[a]
	l.mu.Unlock()
	if !ok {
		t.Fatalf("nothing listens on %s", a)
	}
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

func healthState(ready ...bool) *cluster.State {
	n := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns2", Name: "svc2"}, Port: "p80", Protocol: corev1.ProtocolTCP}
	st := &cluster.State{Services: map[cluster.ServicePortName]*cluster.ServicePort{n: {Name: n, HealthCheckNodePort: 30011}},
		Endpoints: map[cluster.ServicePortName][]*cluster.Endpoint{}, Nodes: map[string]*cluster.Node{"node-a": {Name: "node-a"}}}
	for i, r := range ready {
		st.Endpoints[n] = append(st.Endpoints[n], &cluster.Endpoint{IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)}), Port: 80, Ready: r, Serving: r, NodeName: "node-a"})
	}
	// The same address on a second port counts once, as kube-proxy counts
	// addresses.
	if len(ready) > 0 && ready[0] {
		m := n
		m.Port = "p81"
		st.Services[m] = &cluster.ServicePort{Name: m, HealthCheckNodePort: 30011}
		st.Endpoints[m] = []*cluster.Endpoint{{IP: netip.AddrFrom4([4]byte{10, 0, 0, 10}), Port: 81, Ready: true, Serving: true, NodeName: "node-a"}}
	}
	return st
}

// TestHealthServer: kube-proxy's answers, status, headers and body, on a
// health check node port (200 with the distinct local ready addresses, 503
// without one) and on /healthz and /livez (fresh, then stale once a queued
// change waits past the timeout), and the healthcheck-stale fault answering
// from the state before the last sync.
func TestHealthServer(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	node := netip.MustParseAddr("198.18.0.1")
	hc := netip.AddrPortFrom(node, 30011)
	hz := netip.AddrPortFrom(node, HealthzPort)
	for _, stale := range []bool{false, true} {
		l := &loopbackListen{where: map[netip.AddrPort]string{}}
		cfg := HealthConfig{NodeName: "node-a", Addrs: []netip.Addr{node}, Healthz: hz, HealthTimeout: time.Minute, Listen: l.listen, Now: clock}
		if stale {
			cfg.Faults = proxy.Faults{proxy.FaultHealthCheckStale: true}
		}
		h, err := NewHealthServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.Updated()
		if err := h.Sync(healthState(true, true, false)); err != nil {
			t.Fatal(err)
		}
		code, hdr, body := l.get(t, hc, "/")
		want := "{\n\t\"service\": {\n\t\t\"namespace\": \"ns2\",\n\t\t\"name\": \"svc2\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
		wantCode := http.StatusOK
		if stale {
			// Before the first sync the fault answers from nothing.
			want = "{\n\t\"service\": {\n\t\t\"namespace\": \"ns2\",\n\t\t\"name\": \"svc2\"\n\t},\n\t\"localEndpoints\": 0,\n\t\"serviceProxyHealthy\": true\n}"
			wantCode = http.StatusServiceUnavailable
		}
		if code != wantCode || body != want || hdr.Get("Content-Type") != "application/json" || hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("stale %v: health check answered %d %v\n%s", stale, code, hdr, body)
		}
		// The node loses its ready endpoints.
		if err := h.Sync(healthState(false)); err != nil {
			t.Fatal(err)
		}
		code, hdr, _ = l.get(t, hc, "/")
		if want := map[bool]int{false: http.StatusServiceUnavailable, true: http.StatusOK}[stale]; code != want {
			t.Errorf("stale %v: after losing the local endpoints the health check answered %d, want %d", stale, code, want)
		}
		if w := hdr.Get("X-Load-Balancing-Endpoint-Weight"); w != map[bool]string{false: "0", true: "2"}[stale] {
			t.Errorf("stale %v: endpoint weight %q", stale, w)
		}
		code, _, body = l.get(t, hz, "/healthz")
		var ph ProxyHealth
		if err := json.Unmarshal([]byte(body), &ph); err != nil {
			t.Fatal(err)
		}
		if code != http.StatusOK || !ph.Healthy || ph.NodeEligible == nil || !*ph.NodeEligible || !ph.Status["IPv4"].Healthy {
			t.Errorf("healthz: %d %s", code, body)
		}
		h.Queued()
		now = now.Add(2 * time.Minute)
		if code, _, body := l.get(t, hz, "/livez"); code != http.StatusServiceUnavailable {
			t.Errorf("livez with a change queued past the timeout: %d %s", code, body)
		}
		if code, _, body := l.get(t, hc, "/"); code != http.StatusServiceUnavailable || !json.Valid([]byte(body)) {
			t.Errorf("health check while the proxy is unhealthy: %d %s", code, body)
		}
		h.Updated()
		st := healthState(true)
		st.Nodes["node-a"].Leaving = true
		if err := h.Sync(st); err != nil {
			t.Fatal(err)
		}
		if code, _, _ := l.get(t, hz, "/healthz"); code != http.StatusServiceUnavailable {
			t.Errorf("healthz on a node being deleted: %d", code)
		}
		if code, _, _ := l.get(t, hz, "/livez"); code != http.StatusOK {
			t.Errorf("livez on a node being deleted: %d", code)
		}
		// The Service goes: its port closes.
		if err := h.Sync(&cluster.State{Nodes: st.Nodes}); err != nil {
			t.Fatal(err)
		}
		if len(h.Ports()) != 0 {
			t.Errorf("ports after the Service went: %v", h.Ports())
		}
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	}
}
