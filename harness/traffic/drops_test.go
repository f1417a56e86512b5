package traffic

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"os/exec"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/harness/testenv"
)

// cmsg builds one control message as the kernel lays it out.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func TestRxqOverflow(t *testing.T) {
	four := make([]byte, 4)
	binary.NativeEndian.PutUint32(four, 4242)
	other := cmsg(unix.SOL_IP, unix.IP_TTL, []byte{64, 0, 0, 0})
	for _, c := range []struct {
		name string
		oob  []byte
		want uint32
		ok   bool
	}{
		{"alone", cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, four), 4242, true},
		{"after another message", append(other, cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, four)...), 4242, true},
		{"absent", other, 0, false},
		{"empty", nil, 0, false},
		{"truncated", cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, four)[:unix.SizeofCmsghdr+2], 0, false},
	} {
		got, ok := rxqOverflow(c.oob)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: got %d, %v; want %d, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestObserverCountsItsDrops fills an observer's receive buffer by sending
// while nobody reads, then drains it: every probe is either read or counted
// by Drops (the kernel's own drop counter), and some were dropped.
func TestObserverCountsItsDrops(t *testing.T) {
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
	for _, ns := range []string{c, s} {
		ipcmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipcmd(t, "-n", c, "link", "set", "v0", "up")
	ipcmd(t, "-n", s, "link", "set", "v1", "up")
	var obs *Observer
	inNS(t, s, func() (err error) { obs, err = OpenObserver(unix.IPPROTO_TCP); return })
	defer obs.Close()
	var snd *Sender
	inNS(t, c, func() (err error) { snd, err = OpenSender(); return })
	defer snd.Close()
	t.Logf("observer buffer: %s", obs.Buffer())

	// 16 MiB (doubled by the kernel) holds some tens of thousands of
	// queued SYNs: send well past that before reading anything.
	const n = 150_000
	dst := netip.MustParseAddrPort("10.250.0.2:8080")
	bl := NewBuilder()
	for i := 0; i < n; i++ {
		pkt, err := bl.Build(TCP, netip.AddrPortFrom(netip.MustParseAddr("10.250.0.1"), uint16(16384+i%49152)), dst, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := snd.Send(pkt, dst.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	read := 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- obs.Run(ctx, func(pkt []byte) {
			if _, err := ParseArrival(pkt); err == nil {
				mu.Lock()
				read++
				mu.Unlock()
			}
		})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		got := read
		mu.Unlock()
		if uint64(got)+obs.Drops() >= n {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	drops := obs.Drops()
	t.Logf("sent %d, read %d, kernel drops %d, send errors %d", n, read, drops, snd.Errors())
	if drops == 0 {
		t.Errorf("no drops counted although %d probes were sent to a socket nobody read", n)
	}
	if uint64(read)+drops != n {
		t.Errorf("read %d + dropped %d = %d, want %d: a probe was neither read nor counted", read, drops, uint64(read)+drops, n)
	}
}
