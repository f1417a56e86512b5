package dataplane

// kube-proxy's two health servers, for one node (pkg/proxy/healthcheck,
// v1.37.2): one HTTP listener per Service that has a healthCheckNodePort
// (type LoadBalancer, externalTrafficPolicy Local), answering 200 while the
// node has a local ready endpoint of the Service and 503 otherwise, which
// cloud load balancers use to stop sending to nodes without one; and the
// node's own /healthz and /livez (--healthz-bind-address, port 10256),
// answering whether the last sync is fresh. The answers (status, headers,
// JSON body) are kube-proxy's, byte for byte but for the times.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// HealthzPort is kube-proxy's default healthz port (--healthz-bind-address
// 0.0.0.0:10256).
const HealthzPort = 10256

// HealthConfig configures a node's HealthServer.
type HealthConfig struct {
	// NodeName is the node whose local endpoints are counted.
	NodeName string
	// Addrs are the addresses the health check node ports listen on
	// (kube-proxy: the node addresses --nodeport-addresses selects); empty:
	// every address of the namespace (0.0.0.0).
	Addrs []netip.Addr
	// Healthz is where /healthz and /livez are served; the zero value
	// serves neither.
	Healthz netip.AddrPort
	// HealthTimeout is how long a queued change may wait for a sync before
	// /healthz and /livez answer 503 (kube-proxy: twice --iptables-sync-period).
	HealthTimeout time.Duration
	// Listen opens a TCP listener on an address; it decides the network
	// namespace the server listens in (dataplane/netns: open it inside the
	// node namespace). Required.
	Listen func(addr netip.AddrPort) (net.Listener, error)
	// Faults: FaultHealthCheckStale makes the health check node ports
	// answer from the state before the last sync.
	Faults proxy.Faults
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// HealthServer is one node's health check node ports and /healthz. It is
// safe for concurrent use: the sync loop updates it while its HTTP servers
// answer.
type HealthServer struct {
	cfg HealthConfig

	mu       sync.RWMutex
	services map[types.NamespacedName]*hcService
	// counts are the local ready endpoints per Service after the last
	// sync; prev the ones before it (the healthcheck-stale fault answers
	// from those).
	counts, prev map[types.NamespacedName]int
	lastUpdated  time.Time
	oldestQueued time.Time // zero: no change waiting for a sync
	eligible     bool
	healthz      *http.Server
	closed       bool
}

// hcService is the listener of one Service's health check node port.
type hcService struct {
	port    uint16
	servers []*http.Server
}

// NewHealthServer starts the node's /healthz and /livez (when cfg.Healthz
// is set); the health check node ports follow the state given to Sync.
func NewHealthServer(cfg HealthConfig) (*HealthServer, error) {
	if cfg.Listen == nil {
		return nil, errors.New("a health server needs a Listen function (the namespace it listens in)")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &HealthServer{cfg: cfg, services: map[types.NamespacedName]*hcService{}, counts: map[types.NamespacedName]int{}}
	if cfg.Healthz.IsValid() {
		l, err := cfg.Listen(cfg.Healthz)
		if err != nil {
			return nil, fmt.Errorf("could not start the proxy health server on %s: %w", cfg.Healthz, err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { h.serveHealthz(w, true) })
		mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { h.serveHealthz(w, false) })
		h.healthz = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = h.healthz.Serve(l) }()
	}
	return h, nil
}

// Queued records that a change is waiting for a sync (kube-proxy's
// QueuedUpdate): /healthz turns 503 if no sync follows within
// HealthTimeout.
func (h *HealthServer) Queued() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestQueued.IsZero() {
		h.oldestQueued = h.cfg.Now()
	}
}

// Updated records a successful sync (or the start of the sync loop).
func (h *HealthServer) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oldestQueued = time.Time{}
	h.lastUpdated = h.cfg.Now()
}

// Sync makes the health check node ports follow st after a successful
// sync, as kube-proxy's SyncServices and SyncEndpoints: a listener per
// Service with a healthCheckNodePort (opened when it appears or its port
// changes, closed when it goes), each answering from the number of this
// node's ready endpoints of the Service (distinct addresses over its
// ports). A port that cannot be opened is reported and skipped, as
// kube-proxy logs and skips it; the others are served.
func (h *HealthServer) Sync(st *cluster.State) error {
	ports := map[types.NamespacedName]uint16{}
	local := map[types.NamespacedName]map[netip.Addr]bool{}
	for spn, sp := range st.Services {
		if sp.HealthCheckNodePort != 0 {
			ports[spn.NamespacedName] = uint16(sp.HealthCheckNodePort)
		}
	}
	for spn, eps := range st.Endpoints {
		for _, ep := range eps {
			if !ep.Ready || ep.NodeName != h.cfg.NodeName {
				continue
			}
			if local[spn.NamespacedName] == nil {
				local[spn.NamespacedName] = map[netip.Addr]bool{}
			}
			local[spn.NamespacedName][ep.IP] = true
		}
	}
	eligible := false
	if n := st.Nodes[h.cfg.NodeName]; n != nil {
		eligible = !n.Leaving
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errors.New("the health server is closed")
	}
	h.eligible = eligible
	var errs []error
	for nsn, svc := range h.services {
		if p, ok := ports[nsn]; !ok || p != svc.port {
			svc.close()
			delete(h.services, nsn)
		}
	}
	for nsn, p := range ports {
		if h.services[nsn] != nil {
			continue
		}
		svc, err := h.listen(nsn, p)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s could not start the health check of %s on port %d: %w", h.cfg.NodeName, nsn, p, err))
			continue
		}
		h.services[nsn] = svc
	}
	h.prev = h.counts
	h.counts = make(map[types.NamespacedName]int, len(local))
	for nsn, ips := range local {
		h.counts[nsn] = len(ips)
	}
	return errors.Join(errs...)
}

// listen opens a Service's listeners, one per address; callers hold mu.
func (h *HealthServer) listen(nsn types.NamespacedName, port uint16) (*hcService, error) {
	addrs := h.cfg.Addrs
	if len(addrs) == 0 {
		addrs = []netip.Addr{netip.IPv4Unspecified()}
	}
	svc := &hcService{port: port}
	for _, a := range addrs {
		l, err := h.cfg.Listen(netip.AddrPortFrom(a, port))
		if err != nil {
			svc.close()
			return nil, err
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { h.serveService(w, nsn) }), ReadHeaderTimeout: 10 * time.Second}
		svc.servers = append(svc.servers, srv)
		go func() { _ = srv.Serve(l) }()
	}
	return svc, nil
}

func (s *hcService) close() {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
}

// LocalEndpoints is what the health check node port of a Service answers
// with: its count of local ready endpoints, whether the port is served,
// and the HTTP status.
func (h *HealthServer) LocalEndpoints(nsn types.NamespacedName) (count int, served bool, status int) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.answerLocked(nsn)
}

func (h *HealthServer) answerLocked(nsn types.NamespacedName) (int, bool, int) {
	if h.services[nsn] == nil {
		return 0, false, 0
	}
	counts := h.counts
	if h.cfg.Faults.Has(proxy.FaultHealthCheckStale) {
		counts = h.prev
	}
	n := counts[nsn]
	if n != 0 && h.healthLocked().Healthy {
		return n, true, http.StatusOK
	}
	return n, true, http.StatusServiceUnavailable
}

// serveService answers a health check node port as kube-proxy's hcHandler.
func (h *HealthServer) serveService(w http.ResponseWriter, nsn types.NamespacedName) {
	h.mu.RLock()
	n, ok, status := h.answerLocked(nsn)
	healthy := h.healthLocked().Healthy
	h.mu.RUnlock()
	if !ok {
		return // a request for a closed health check: kube-proxy writes nothing
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(n))
	w.WriteHeader(status)
	fmt.Fprint(w, ServiceHealthBody(nsn, n, healthy))
}

// ServiceHealthBody is the body of a health check node port's answer, as
// kube-proxy writes it (a dedented template: tab-indented JSON without a
// final newline).
func ServiceHealthBody(nsn types.NamespacedName, localEndpoints int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		nsn.Namespace, nsn.Name, localEndpoints, healthy)
}

// ProxyHealth is kube-proxy's /healthz and /livez answer (healthcheck.ProxyHealth).
type ProxyHealth struct {
	LastUpdated  time.Time                `json:"lastUpdated"`
	CurrentTime  time.Time                `json:"currentTime"`
	NodeEligible *bool                    `json:"nodeEligible,omitempty"`
	Healthy      bool                     `json:"healthy"`
	Status       map[string]ProxierHealth `json:"status,omitempty"`
}

// ProxierHealth is one IP family's part of ProxyHealth.
type ProxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Health is the node's proxy health now: healthy unless a change has
// waited longer than HealthTimeout for a sync.
func (h *HealthServer) Health() ProxyHealth {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.healthLocked()
}

func (h *HealthServer) healthLocked() ProxyHealth {
	now := h.cfg.Now()
	out := ProxyHealth{Healthy: true, CurrentTime: now, Status: map[string]ProxierHealth{}}
	if h.lastUpdated.IsZero() {
		return out
	}
	out.LastUpdated = h.lastUpdated
	ph := ProxierHealth{LastUpdated: h.lastUpdated, Healthy: true}
	if !h.oldestQueued.IsZero() && now.Sub(h.oldestQueued) >= h.cfg.HealthTimeout {
		out.Healthy, ph.Healthy = false, false
	}
	out.Status["IPv4"] = ph
	return out
}

// serveHealthz answers /healthz (node eligibility counted) or /livez.
func (h *HealthServer) serveHealthz(w http.ResponseWriter, healthz bool) {
	h.mu.RLock()
	health := h.healthLocked()
	eligible := h.eligible
	h.mu.RUnlock()
	healthy := health.Healthy
	if healthz {
		healthy = healthy && eligible
		health.NodeEligible = &eligible
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
		health.LastUpdated = h.cfg.Now()
	}
	out, _ := json.Marshal(health)
	fmt.Fprint(w, string(out))
}

// Ports lists the health check node ports served, by Service.
func (h *HealthServer) Ports() map[types.NamespacedName]uint16 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make(map[types.NamespacedName]uint16, len(h.services))
	for nsn, s := range h.services {
		out[nsn] = s.port
	}
	return out
}

// Close stops every listener.
func (h *HealthServer) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	for nsn, s := range h.services {
		s.close()
		delete(h.services, nsn)
	}
	if h.healthz != nil {
		return h.healthz.Close()
	}
	return nil
}

// HealthAnswer is what a health check node port answered: the HTTP status
// and the body's localEndpoints (kube-proxy's JSON), or the error that
// stopped the request.
type HealthAnswer struct {
	Status         int
	LocalEndpoints int
	Err            error
}

// Summary is the answer in one line, for comparisons and reports: "200
// localEndpoints 2", "refused" (nothing listens) or "no answer" (any other
// error; Err says which).
func (a HealthAnswer) Summary() string {
	if errors.Is(a.Err, syscall.ECONNREFUSED) {
		return "refused"
	}
	if a.Err != nil {
		return "no answer"
	}
	return fmt.Sprintf("%d localEndpoints %d", a.Status, a.LocalEndpoints)
}

// AskHealth sends GET path to addr from inside the namespace whose Do runs
// a function there (netns.Namespace.Do: the socket is opened in it), as a
// load balancer's health checker does, with a 2 s bound, and reads
// kube-proxy's answer.
func AskHealth(ctx context.Context, do func(func() error) error, addr netip.AddrPort, path string) HealthAnswer {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var conn net.Conn
	if err := do(func() (err error) {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp4", addr.String())
		return err
	}); err != nil {
		return HealthAnswer{Err: err}
	}
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+path, nil)
	if err != nil {
		_ = conn.Close()
		return HealthAnswer{Err: err}
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return HealthAnswer{Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return HealthAnswer{Status: resp.StatusCode, Err: err}
	}
	var b struct {
		LocalEndpoints int `json:"localEndpoints"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return HealthAnswer{Status: resp.StatusCode, Err: fmt.Errorf("status %d, body %q: %w", resp.StatusCode, body, err)}
	}
	return HealthAnswer{Status: resp.StatusCode, LocalEndpoints: b.LocalEndpoints}
}
