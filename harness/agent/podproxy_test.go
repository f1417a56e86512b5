package agent

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/kpsim/kpsim/harness/traffic"
)

// fakeAPIServer stands in for the kube-apiserver's pods/proxy: requests to
// /api/v1/namespaces/NS/pods/NAME:PORT/proxy/REST go to the agent
// registered as NS/NAME:PORT with the path /REST; an unknown pod is the API
// server's 404 Status.
type fakeAPIServer struct {
	mu     sync.Mutex
	agents map[string]http.Handler
	seen   []string // method and request URI of each request
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.seen = append(f.seen, r.Method+" "+r.URL.RequestURI())
	f.mu.Unlock()
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/")
	parts := strings.SplitN(rest, "/", 5) // NS, pods, NAME:PORT, proxy, REST
	if !ok || len(parts) < 4 || parts[1] != "pods" || parts[3] != "proxy" {
		http.Error(w, "not a pods/proxy path", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	h := f.agents[parts[0]+"/"+parts[2]]
	f.mu.Unlock()
	if h == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"`+strings.Split(parts[2], ":")[0]+`\" not found","reason":"NotFound","code":404}`)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/"
	if len(parts) == 5 {
		r2.URL.Path += parts[4]
	}
	r2.RequestURI = ""
	h.ServeHTTP(w, r2)
}

// restClient is a core/v1 REST client for the fake API server at host.
func restClient(t *testing.T, host string) rest.Interface {
	t.Helper()
	c, err := rest.RESTClientFor(&rest.Config{Host: host, APIPath: "/api", ContentConfig: rest.ContentConfig{
		GroupVersion:         &schema.GroupVersion{Version: "v1"},
		NegotiatedSerializer: serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPodProxyDoer drives a probe agent and an echo agent of a FakeNet
// through the fake API server's pods/proxy: the paths and queries it
// builds, the bodies it carries both ways, and errors that name the pod.
func TestPodProxyDoer(t *testing.T) {
	n := NewFakeNet()
	echoAddr := netip.MustParseAddr("10.244.1.5")
	fake := &fakeAPIServer{agents: map[string]http.Handler{
		"kpsim/prober-a:9376": n.Prober(Info{Node: "node-a"}, netip.MustParseAddr("10.244.0.7")),
		"kpsim/echo-0:9376":   n.Echo(Info{Node: "node-b"}, echoAddr, []PortSpec{{traffic.TCP, 8080}}),
	}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	rc := restClient(t, srv.URL)
	prober := Client{Do: PodProxyDoer(rc, "kpsim", "prober-a", Port)}
	echo := Client{Do: PodProxyDoer(rc, "kpsim", "echo-0", Port)}
	ctx := context.Background()

	if info, err := prober.Info(ctx); err != nil || info.Mode != ModeProbe || info.Node != "node-a" {
		t.Fatalf("prober info: %+v, %v", info, err)
	}
	res, err := prober.Send(ctx, SendRequest{Tag: 3, Proto: "tcp", VIP: "10.244.1.5:8080", N: 500, Start: 1, Step: 1})
	if err != nil || res.Sent != 500 {
		t.Fatalf("send: %+v, %v", res, err)
	}
	c, err := echo.Counts(ctx, 3)
	if err != nil || c.Total() != 500 {
		t.Fatalf("counts: %+v, %v", c, err)
	}
	if err := echo.Forget(ctx, 4); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /api/v1/namespaces/kpsim/pods/prober-a:9376/proxy/v1/info",
		"POST /api/v1/namespaces/kpsim/pods/prober-a:9376/proxy/v1/send",
		"GET /api/v1/namespaces/kpsim/pods/echo-0:9376/proxy/v1/counts?tag=3",
		"POST /api/v1/namespaces/kpsim/pods/echo-0:9376/proxy/v1/forget?below=4",
	}
	if strings.Join(fake.seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(fake.seen, "\n"), strings.Join(want, "\n"))
	}

	// The agent's refusal comes back as its own message, naming the pod.
	_, err = prober.Send(ctx, SendRequest{Tag: 3, Proto: "tcp", VIP: "10.244.1.5:8080", N: 0, Start: 1, Step: 1})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 400 || !strings.HasPrefix(he.Message, "n: 0 is out of range") ||
		!strings.Contains(err.Error(), "agent pod kpsim/prober-a port 9376") {
		t.Errorf("bad request through the proxy: %v", err)
	}
	// The API server's own errors: no such pod.
	_, err = Client{Do: PodProxyDoer(rc, "kpsim", "gone", Port)}.Info(ctx)
	if !errors.As(err, &he) || he.Status != 404 || he.Message != `pods "gone" not found` || !strings.Contains(err.Error(), "kpsim/gone") {
		t.Errorf("unknown pod: %v", err)
	}
	// No API server at all.
	srv.Close()
	_, err = echo.Info(ctx)
	if err == nil || !strings.Contains(err.Error(), "agent pod kpsim/echo-0 port 9376") {
		t.Errorf("API server down: %v", err)
	}
}

// TestDirectDoer: the query is encoded, a JSON body is sent as JSON, and an
// error answer that is not the agent's JSON keeps its text.
func TestDirectDoer(t *testing.T) {
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		body, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/fail" {
			http.Error(w, "upstream connect error", http.StatusBadGateway)
			return
		}
		_, _ = io.WriteString(w, "answer")
	}))
	defer srv.Close()
	do := DirectDoer(srv.URL+"/", nil)
	b, err := do(t.Context(), "POST", "/v1/x", url.Values{"a": {"1 2"}}, []byte(`{"k":1}`))
	if err != nil || string(b) != "answer" {
		t.Fatalf("%q, %v", b, err)
	}
	if got.URL.RequestURI() != "/v1/x?a=1+2" || got.Header.Get("Content-Type") != "application/json" || string(body) != `{"k":1}` {
		t.Errorf("request %s %q content type %q", got.URL.RequestURI(), body, got.Header.Get("Content-Type"))
	}
	_, err = do(t.Context(), "GET", "/fail", nil, nil)
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusBadGateway || he.Message != "upstream connect error" || IsBadRequest(err) {
		t.Errorf("error answer: %v", err)
	}
	if got.Header.Get("Content-Type") != "" {
		t.Errorf("a request without a body has content type %q", got.Header.Get("Content-Type"))
	}
}
