package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/traffic"
)

// testNamespace adds a network namespace of the test's own, with a unique
// name, removed when the test ends (`ip netns add`, `ip netns del`).
func testNamespace(t *testing.T, name string) *netns.Namespace {
	t.Helper()
	ipcmd(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	return ns
}

func ipcmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// TestAgentsInNamespaces runs an echo agent and a probe agent, in process,
// in two namespaces of the test's own joined by a veth pair (no dataplane:
// the probes go to the echo's address), and drives them over HTTP: every
// probe sent arrives, counted under its tag, endpoint and client; probes
// to a closed UDP port come back as rejects; the echo ports answer an
// ordinary client.
func TestAgentsInNamespaces(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	start := time.Now()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := "kpsim-t" + hex.EncodeToString(b)
	prNS, ecNS := testNamespace(t, id+"-pr"), testNamespace(t, id+"-ec")
	ipcmd(t, "-n", prNS.Name, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", ecNS.Name)
	ipcmd(t, "-n", prNS.Name, "addr", "add", "10.251.0.1/24", "dev", "v0")
	ipcmd(t, "-n", ecNS.Name, "addr", "add", "10.251.0.2/24", "dev", "v1")
	for _, ns := range []string{prNS.Name, ecNS.Name} {
		ipcmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipcmd(t, "-n", prNS.Name, "link", "set", "v0", "up")
	ipcmd(t, "-n", ecNS.Name, "link", "set", "v1", "up")
	// One port-unreachable per closed-port probe: lift the echo
	// namespace's ICMP rate limits (per-namespace sysctls), as conform
	// does for its nodes.
	for k, v := range map[string]string{"net.ipv4.icmp_ratelimit": "0", "net.ipv4.icmp_msgs_per_sec": "1000000", "net.ipv4.icmp_msgs_burst": "1000000"} {
		if err := ecNS.Sysctl(k, v); err != nil {
			t.Fatal(err)
		}
	}

	ports := []PortSpec{{traffic.TCP, 8080}, {traffic.UDP, 8080}}
	var echo *Echo
	if err := ecNS.Do(func() (err error) { echo, err = OpenEcho(Info{Node: "echo", PodIP: "10.251.0.2"}, ports); return }); err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	var prober *Prober
	if err := prNS.Do(func() (err error) { prober, err = OpenProber(Info{Node: "prober", PodIP: "10.251.0.1"}); return }); err != nil {
		t.Fatal(err)
	}
	defer prober.Close()
	ctx, cancel := context.WithCancel(t.Context())
	runs := make(chan error, 2)
	go func() { runs <- echo.Run(ctx) }()
	go func() { runs <- prober.Run(ctx) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-runs; !errors.Is(err, context.Canceled) {
				t.Errorf("an agent's Run ended with %v", err)
			}
		}
	}()
	ec, pr := serve(t, echo), serve(t, prober)
	t.Logf("echo observer: %s; prober observer: %s", echo.Info().ObserverBuffer, prober.Info().ObserverBuffer)

	sends := []struct {
		req  SendRequest
		open bool
	}{
		{SendRequest{Tag: 1, Proto: "tcp", VIP: "10.251.0.2:8080", N: 300, Start: 1234, Step: 7}, true},
		{SendRequest{Tag: 2, Proto: "udp", VIP: "10.251.0.2:8080", First: 300, N: 300, Start: 40000, Step: 35}, true},
		// Tag 0 and IDs below 65,536: IP ID 0, which the kernel keeps in
		// a DF packet, so the rejects still name the tag.
		{SendRequest{Tag: 0, Proto: "udp", VIP: "10.251.0.2:9999", N: 100, Start: 17, Step: 1}, false},
	}
	sent, sendTime := 0, time.Duration(0)
	for _, s := range sends {
		t0 := time.Now()
		res, err := pr.Send(ctx, s.req)
		sendTime += time.Since(t0)
		if err != nil || res != (SendResult{Sent: s.req.N}) {
			t.Fatalf("send tag %d: %+v, %v", s.req.Tag, res, err)
		}
		sent += res.Sent
	}
	t.Logf("%d probes sent in %s over HTTP (%.0f probes/s, a request per block)", sent, sendTime.Round(time.Microsecond), float64(sent)/sendTime.Seconds())

	// Wait (bounded) until every probe is accounted for.
	waitStart := time.Now()
	var counts [3]Counts
	for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
		seen := 0
		for _, s := range sends {
			c := &counts[s.req.Tag]
			var err error
			if s.open {
				*c, err = ec.Counts(ctx, s.req.Tag)
				seen += c.Total()
			} else {
				*c, err = pr.Counts(ctx, s.req.Tag)
				seen += c.Rejects
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if seen == sent || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("every probe accounted for %s after the last send", time.Since(waitStart).Round(time.Millisecond))
	for _, s := range sends[:2] {
		want := []Arrival{{Endpoint: s.req.VIP, Client: "10.251.0.1", N: s.req.N}}
		if c := counts[s.req.Tag]; fmt.Sprint(c.Arrivals) != fmt.Sprint(want) || c.ObserverDrops != 0 {
			t.Errorf("tag %d: %+v, want arrivals %v and no drop", s.req.Tag, c, want)
		}
	}
	if c := counts[0]; c.Rejects != 100 || c.OtherICMP != 0 || c.Foreign != 0 {
		t.Errorf("tag 0 (closed port): %+v, want 100 rejects", c)
	}
	if c, _ := ec.Counts(ctx, 0); c.Total() != 0 || c.Foreign != 600 {
		t.Errorf("echo, tag 0: %+v, want no arrival and 600 probes of other tags", c)
	}
	// TCP probes are answered by the echo's kernel and reset by the
	// prober's; UDP probes are not answered: no ICMP error for either.
	for _, tag := range []uint32{1, 2} {
		if c, _ := pr.Counts(ctx, tag); c.Rejects+c.OtherICMP != 0 {
			t.Errorf("prober, tag %d: %+v, want no ICMP error", tag, c)
		}
	}

	// The echo ports serve an ordinary client.
	err := prNS.Do(func() error {
		for _, network := range []string{"tcp4", "udp4"} {
			c, err := net.DialTimeout(network, "10.251.0.2:8080", time.Second)
			if err != nil {
				return err
			}
			_ = c.SetDeadline(time.Now().Add(time.Second))
			if _, err := c.Write([]byte("hello")); err != nil {
				c.Close()
				return err
			}
			if network == "tcp4" {
				_ = c.(*net.TCPConn).CloseWrite()
			}
			got := make([]byte, 16)
			n, err := io.ReadAtLeast(c, got, 5)
			c.Close()
			if err != nil || string(got[:n]) != "hello" {
				return fmt.Errorf("%s echo: %q, %v", network, got[:n], err)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	t.Logf("test took %s", time.Since(start).Round(time.Millisecond))
}

// TestRawRefused: a refused raw socket says the agent needs CAP_NET_RAW.
func TestRawRefused(t *testing.T) {
	err := rawRefused(fmt.Errorf("could not open a raw socket: %w", unix.EPERM))
	if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "needs CAP_NET_RAW") {
		t.Errorf("%v", err)
	}
	other := errors.New("other")
	if rawRefused(other) != other {
		t.Error("another error was rewritten")
	}
}
