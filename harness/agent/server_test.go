package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/harness/traffic"
)

// serve starts h on a loopback test server and returns a client for it.
func serve(t *testing.T, h http.Handler) Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return Client{Do: DirectDoer(srv.URL, srv.Client())}
}

// TestProtocolRoundTrip drives two echo agents and a probe agent on a
// FakeNet over HTTP: a TCP Service with both echoes as endpoints, a UDP
// Service without endpoints (rejected), a probe to an address nobody has.
func TestProtocolRoundTrip(t *testing.T) {
	ctx := context.Background()
	n := NewFakeNet()
	ports := []PortSpec{{traffic.TCP, 8080}, {traffic.UDP, 8080}}
	a, b := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.5")
	echoA := serve(t, n.Echo(Info{Node: "node-a", PodIP: a.String(), Version: "test"}, a, ports))
	echoB := serve(t, n.Echo(Info{Node: "node-b", PodIP: b.String()}, b, ports))
	prober := serve(t, n.Prober(Info{Node: "node-a", PodIP: "10.244.1.9"}, netip.MustParseAddr("10.244.1.9")))
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	n.Service(traffic.TCP, vip, netip.AddrPortFrom(a, 8080), netip.AddrPortFrom(b, 8080))
	n.Service(traffic.UDP, netip.MustParseAddrPort("10.96.0.10:53"))

	info, err := echoA.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Info{Mode: ModeEcho, Node: "node-a", PodIP: "10.244.1.5", Version: "test", Ports: []string{"tcp:8080", "udp:8080"}}, info); diff != "" {
		t.Errorf("echo info (-want +got)\n%s", diff)
	}
	if info, err := prober.Info(ctx); err != nil || info.Mode != ModeProbe || info.Node != "node-a" {
		t.Errorf("prober info %+v, %v", info, err)
	}

	res, err := prober.Send(ctx, SendRequest{Tag: 7, Proto: "tcp", VIP: vip.String(), N: 3000, Start: 11, Step: 5})
	if err != nil || res != (SendResult{Sent: 3000}) {
		t.Fatalf("send: %+v, %v", res, err)
	}
	// The fake spreads by ID modulo 2: IDs 7<<24 | j, half to each.
	for i, c := range []Client{echoA, echoB} {
		got, err := c.Counts(ctx, 7)
		if err != nil {
			t.Fatal(err)
		}
		ep := []netip.Addr{a, b}[i]
		want := Counts{Tag: 7, Arrivals: []Arrival{{Endpoint: netip.AddrPortFrom(ep, 8080).String(), Client: "10.244.1.9", N: 1500}}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("echo %s, tag 7 (-want +got)\n%s", ep, diff)
		}
	}
	if c, err := prober.Counts(ctx, 7); err != nil || c.Rejects+c.OtherICMP != 0 {
		t.Errorf("prober, tag 7: %+v, %v", c, err)
	}

	// Tag 8: rejected by a Service without endpoints, from another source.
	res, err = prober.Send(ctx, SendRequest{Tag: 8, Proto: "udp", VIP: "10.96.0.10:53", Src: "10.244.1.10", N: 100, Start: 0, Step: 1})
	if err != nil || res.Sent != 100 {
		t.Fatalf("send: %+v, %v", res, err)
	}
	// Tag 9: an address nobody has.
	if _, err := prober.Send(ctx, SendRequest{Tag: 9, Proto: "tcp", VIP: "10.244.9.9:80", N: 10, Start: 0, Step: 1}); err != nil {
		t.Fatal(err)
	}
	// Rejects to 10.244.1.10 reach nobody (no agent there); those to the
	// prober's own address are counted.
	if c, _ := prober.Counts(ctx, 8); c.Rejects != 0 {
		t.Errorf("rejects to another address were counted: %+v", c)
	}
	if _, err := prober.Send(ctx, SendRequest{Tag: 8, Proto: "udp", VIP: "10.96.0.10:53", First: 100, N: 100, Start: 0, Step: 1}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Counts{Tag: 8, Arrivals: []Arrival{}, Rejects: 100, Foreign: 10}, mustCounts(t, prober, 8)); diff != "" {
		t.Errorf("prober, tag 8 (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff(Counts{Tag: 9, Arrivals: []Arrival{}, OtherICMP: 10, Foreign: 100}, mustCounts(t, prober, 9)); diff != "" {
		t.Errorf("prober, tag 9 (-want +got)\n%s", diff)
	}
	if c := mustCounts(t, echoA, 8); c.Foreign != 1500 || len(c.Arrivals) != 0 {
		t.Errorf("echo a, tag 8: %+v", c)
	}

	if err := echoA.Forget(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if c := mustCounts(t, echoA, 7); len(c.Arrivals) != 0 || c.Foreign != 0 {
		t.Errorf("echo a, tag 7 after forget below 8: %+v", c)
	}
}

func mustCounts(t *testing.T, c Client, tag uint32) Counts {
	t.Helper()
	got, err := c.Counts(t.Context(), tag)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// errENOBUFS is a full device queue, as traffic.Sender reports it.
var errENOBUFS = fmt.Errorf("could not send probe: %w", unix.ENOBUFS)

// recorder is a PacketSink keeping every packet.
type recorder struct {
	mu   sync.Mutex
	pkts []traffic.Arrival
	fail func(i int) error
}

func (r *recorder) Send(pkt []byte, _ netip.Addr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		if err := r.fail(len(r.pkts)); err != nil {
			return err
		}
	}
	a, err := traffic.ParseArrival(pkt)
	if err != nil {
		return err
	}
	r.pkts = append(r.pkts, a)
	return nil
}

// TestSendWalk: probe j has the source port traffic.BlockPort(Start, Step,
// j) and the ID Tag<<24 | (First+j)&0xffffff, with one writer (in order)
// and with two (interleaved).
func TestSendWalk(t *testing.T) {
	for _, n := range []int{1999, 2000, 5001} {
		rec := &recorder{}
		p := NewProber(Info{}, []PacketSink{rec, rec}, fakeRoute(netip.MustParseAddr("10.244.0.7")), &fakeSource{})
		req := SendRequest{Tag: 200, Proto: "udp", VIP: "10.96.0.10:53", First: 0xffff00, N: n, Start: 49000, Step: 49151}
		res, err := p.Send(t.Context(), req)
		if err != nil || res != (SendResult{Sent: n}) {
			t.Fatalf("n %d: %+v, %v", n, res, err)
		}
		if len(rec.pkts) != n {
			t.Fatalf("n %d: %d packets written", n, len(rec.pkts))
		}
		byID := map[uint32]traffic.Arrival{}
		for i, a := range rec.pkts {
			byID[a.ID] = a
			if n < 2000 && a.ID != 200<<24|(0xffff00+uint32(i))&0xffffff {
				t.Fatalf("n %d: packet %d has ID %#x: one writer sends in order", n, i, a.ID)
			}
		}
		for j := range n {
			a, ok := byID[200<<24|(0xffff00+uint32(j))&0xffffff]
			if !ok {
				t.Fatalf("n %d: probe %d missing", n, j)
			}
			if a.Src != netip.AddrPortFrom(netip.MustParseAddr("10.244.0.7"), traffic.BlockPort(49000, 49151, j)) || a.Dst.String() != "10.96.0.10:53" || a.Proto != traffic.UDP {
				t.Fatalf("n %d: probe %d is %+v", n, j, a)
			}
		}
	}
}

// TestSendStops: a full queue skips probes (SendErrors) up to the bound; a
// hard error or an ended context stops the block and says so.
func TestSendStops(t *testing.T) {
	route := fakeRoute(netip.MustParseAddr("10.244.0.7"))
	req := SendRequest{Tag: 1, Proto: "tcp", VIP: "10.96.0.10:80", N: 100, Start: 0, Step: 1}
	full := &recorder{fail: func(i int) error {
		if i%10 == 0 {
			return errENOBUFS
		}
		return nil
	}}
	res, err := NewProber(Info{}, []PacketSink{full}, route, &fakeSource{}).Send(t.Context(), req)
	if err != nil || res.Sent+res.SendErrors != 100 || res.SendErrors == 0 || res.Error != "" {
		t.Errorf("full queue: %+v, %v", res, err)
	}
	broken := &recorder{fail: func(i int) error {
		if i == 40 {
			return errors.New("sendto: operation not permitted")
		}
		return nil
	}}
	res, _ = NewProber(Info{}, []PacketSink{broken}, route, &fakeSource{}).Send(t.Context(), req)
	if res.Sent != 40 || !strings.Contains(res.Error, "operation not permitted") {
		t.Errorf("hard error: %+v", res)
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	res, _ = NewProber(Info{}, []PacketSink{&recorder{}}, route, &fakeSource{}).Send(cancelled, req)
	if res.Sent != 0 || !strings.Contains(res.Error, "sending stopped after 0 of 100") {
		t.Errorf("ended context: %+v", res)
	}
	res, _ = NewProber(Info{}, []PacketSink{&recorder{}}, fakeRoute{}, &fakeSource{}).Send(t.Context(), req)
	if !strings.Contains(res.Error, "could not pick a source address for 10.96.0.10:80") {
		t.Errorf("no route: %+v", res)
	}
}

// TestSendOneAtATime: a send waits for the running one; one whose context
// ends first says another was running.
func TestSendOneAtATime(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	slow := &recorder{fail: func(i int) error {
		if i == 0 {
			started <- struct{}{}
			<-release
		}
		return nil
	}}
	p := NewProber(Info{}, []PacketSink{slow}, fakeRoute(netip.MustParseAddr("10.244.0.7")), &fakeSource{})
	req := SendRequest{Tag: 1, Proto: "tcp", VIP: "10.96.0.10:80", N: 10, Start: 0, Step: 1}
	first := make(chan SendResult, 1)
	go func() { r, _ := p.Send(context.Background(), req); first <- r }()
	<-started
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.Send(short, req); !errors.Is(err, errBusy) {
		t.Errorf("a second send during the first: %v, want errBusy", err)
	}
	close(release)
	if r := <-first; r.Sent != 10 {
		t.Errorf("first send: %+v", r)
	}
	if r, err := p.Send(t.Context(), req); err != nil || r.Sent != 10 {
		t.Errorf("a send after the first: %+v, %v", r, err)
	}
}

// TestBadInput: refused requests are 400s whose message names the field.
func TestBadInput(t *testing.T) {
	n := NewFakeNet()
	prober := serve(t, n.Prober(Info{}, netip.MustParseAddr("10.244.0.7")))
	echo := serve(t, n.Echo(Info{}, netip.MustParseAddr("10.244.1.5"), []PortSpec{{traffic.TCP, 80}}))
	good := SendRequest{Tag: 1, Proto: "tcp", VIP: "10.96.0.10:80", N: 10, Start: 0, Step: 1}
	for _, c := range []struct {
		edit func(*SendRequest)
		msg  string
	}{
		{func(r *SendRequest) { r.N = 0 }, "n: 0 is out of range 1..32768"},
		{func(r *SendRequest) { r.N = 40000 }, "n: 40000 is out of range 1..32768"},
		{func(r *SendRequest) { r.VIP = "10.96.0.10" }, `vip: "10.96.0.10" is not ip:port`},
		{func(r *SendRequest) { r.Proto = "sctp" }, `proto: "sctp" is not tcp or udp`},
		{func(r *SendRequest) { r.Step = 6 }, "step: 6 is not in 1..49151 and coprime"},
	} {
		r := good
		c.edit(&r)
		_, err := prober.Send(t.Context(), r)
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusBadRequest || !strings.Contains(he.Message, c.msg) || !IsBadRequest(err) {
			t.Errorf("%+v: %v, want a 400 saying %q", r, err, c.msg)
		}
	}
	raw := prober.Do
	for _, c := range []struct {
		method, path string
		query        url.Values
		body         string
		status       int
		msg          string
	}{
		{"POST", PathSend, nil, `{"tag":1,"proto":"tcp","vip":"10.96.0.10:80","n":10,"step":1,"count":3}`, 400, `unknown field "count"`},
		{"POST", PathSend, nil, `not json`, 400, "not a send request"},
		{"POST", PathSend, nil, `{"tag":1} {"tag":2}`, 400, "more than one JSON value"},
		{"POST", PathSend, nil, `{"n":"` + strings.Repeat("9", maxBody) + `"}`, 400, "larger than 65536 bytes"},
		{"GET", PathCounts, nil, "", 400, "tag: missing"},
		{"GET", PathCounts, url.Values{"tag": {"256"}}, "", 400, `tag: "256" is not a number in 0..255`},
		{"POST", PathForget, url.Values{"below": {"-1"}}, "", 400, `below: "-1" is not a number in 0..256`},
		{"GET", PathSend, nil, "", 405, "Method Not Allowed"},
	} {
		var body []byte
		if c.body != "" {
			body = []byte(c.body)
		}
		_, err := raw(t.Context(), c.method, c.path, c.query, body)
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != c.status || !strings.Contains(he.Message, c.msg) {
			t.Errorf("%s %s %v: %v, want %d saying %q", c.method, c.path, c.query, err, c.status, c.msg)
		}
	}
	_, err := echo.Send(t.Context(), good)
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusNotFound || !strings.Contains(he.Message, "echo mode") {
		t.Errorf("send to an echo agent: %v", err)
	}
	if b, err := echo.Do(t.Context(), "GET", PathHealthz, nil, nil); err != nil || string(b) != "ok\n" {
		t.Errorf("healthz: %q, %v", b, err)
	}
}

// TestEchoCountsOnlyProbesAtItsPorts: the echo's observer sees every
// packet reaching the pod; only probes at served ports count.
func TestEchoCountsOnlyProbesAtItsPorts(t *testing.T) {
	e := NewEcho(Info{}, []PortSpec{{traffic.TCP, 8080}}, &fakeSource{})
	bd := traffic.NewBuilder()
	src := netip.MustParseAddrPort("10.244.0.5:40001")
	for _, c := range []struct {
		proto traffic.Proto
		dst   string
	}{{traffic.TCP, "10.244.1.5:8080"}, {traffic.TCP, "10.244.1.5:9376"}, {traffic.UDP, "10.244.1.5:8080"}} {
		pkt, _ := bd.Build(c.proto, src, netip.MustParseAddrPort(c.dst), 3<<24)
		e.onPacket(pkt)
	}
	if c := e.Counts(3); c.Total() != 1 || c.Arrivals[0].Endpoint != "10.244.1.5:8080" || c.Foreign != 0 {
		t.Errorf("counts %+v, want one arrival at tcp:8080", c)
	}
}
