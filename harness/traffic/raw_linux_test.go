package traffic

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/harness/testenv"
)

// inNS runs fn on a locked thread inside the named namespace (a test-local
// version of dataplane/netns.Do, to keep this package's tests standalone).
func inNS(t *testing.T, name string, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		h, err := netns.GetFromName(name)
		if err != nil {
			done <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func ipcmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// TestProbesThroughVeth sends SYN and UDP probes from a client namespace to
// two addresses of a backend namespace and counts them there: every probe is
// seen once, at the right address. Only namespaces this test creates are
// touched.
func TestProbesThroughVeth(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := "kpsim-t" + hex.EncodeToString(b)
	c, s := id+"-c", id+"-b"
	ipcmd(t, "netns", "add", c)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", c).Run() })
	ipcmd(t, "netns", "add", s)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", s).Run() })
	ipcmd(t, "-n", c, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", s)
	ipcmd(t, "-n", c, "addr", "add", "10.250.0.1/24", "dev", "v0")
	ipcmd(t, "-n", s, "addr", "add", "10.250.0.2/24", "dev", "v1")
	ipcmd(t, "-n", s, "addr", "add", "10.250.0.3/32", "dev", "v1")
	for _, ns := range []string{c, s} {
		ipcmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipcmd(t, "-n", c, "link", "set", "v0", "up")
	ipcmd(t, "-n", s, "link", "set", "v1", "up")
	ipcmd(t, "-n", c, "route", "add", "10.250.0.3/32", "dev", "v0")

	var obs *Observer
	inNS(t, s, func() (err error) { obs, err = OpenObserver(unix.IPPROTO_TCP, unix.IPPROTO_UDP); return })
	defer obs.Close()
	var snd *Sender
	inNS(t, c, func() (err error) { snd, err = OpenSender(); return })
	defer snd.Close()

	var mu sync.Mutex
	counts := map[netip.AddrPort]int{}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() {
		runDone <- obs.Run(ctx, func(pkt []byte) {
			if a, err := ParseArrival(pkt); err == nil {
				mu.Lock()
				counts[a.Dst]++
				mu.Unlock()
			}
		})
	}()
	const n = 20000
	dsts := []netip.AddrPort{netip.MustParseAddrPort("10.250.0.2:8080"), netip.MustParseAddrPort("10.250.0.3:8080"), netip.MustParseAddrPort("10.250.0.3:53")}
	bl := NewBuilder()
	start := time.Now()
	for i := 0; i < n; i++ {
		d := dsts[i%3]
		p := TCP
		if d.Port() == 53 {
			p = UDP
		}
		pkt, err := bl.Build(p, netip.AddrPortFrom(netip.MustParseAddr("10.250.0.1"), uint16(10000+i%50000)), d, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := snd.Send(pkt, d.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	// Wait (bounded) for the last arrivals.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		total := counts[dsts[0]] + counts[dsts[1]] + counts[dsts[2]]
		mu.Unlock()
		if total == n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-runDone
	t.Logf("sent %d probes in %s (%.0f/s through one veth, no netfilter)", n, elapsed, n/elapsed.Seconds())
	for i, d := range dsts {
		want := n / 3
		if i < n%3 {
			want++
		}
		if counts[d] != want {
			t.Errorf("%s received %d probes, want %d", d, counts[d], want)
		}
	}
}
