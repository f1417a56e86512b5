package ipvs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"
)

func svc(addr string, port uint16, sched string) *libipvs.Service {
	return &libipvs.Service{Address: netip.MustParseAddr(addr).AsSlice(), Protocol: protoTCP, Port: port, SchedName: sched, AddressFamily: unix.AF_INET}
}

func dst(ap string, w int) *libipvs.Destination {
	a := netip.MustParseAddrPort(ap)
	return &libipvs.Destination{Address: a.Addr().AsSlice(), Port: a.Port(), Weight: w}
}

// TestFakeErrors: the fake answers as the kernel does.
func TestFakeErrors(t *testing.T) {
	f := NewFake()
	s := svc("10.96.0.1", 80, "rr")
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"new", f.NewService(s), nil},
		{"new again", f.NewService(s), unix.EEXIST},
		{"unknown scheduler", f.NewService(svc("10.96.0.2", 80, "lblc")), unix.ENOENT},
		{"update missing", f.UpdateService(svc("10.96.0.3", 80, "rr")), unix.ESRCH},
		{"delete missing", f.DelService(svc("10.96.0.3", 80, "rr")), unix.ESRCH},
		{"dest", f.NewDestination(s, dst("10.0.0.1:8080", 1)), nil},
		{"dest again", f.NewDestination(s, dst("10.0.0.1:8080", 1)), unix.EEXIST},
		{"dest negative weight", f.NewDestination(s, dst("10.0.0.2:8080", -1)), unix.ERANGE},
		{"dest of missing service", f.NewDestination(svc("10.96.0.3", 80, "rr"), dst("10.0.0.1:8080", 1)), unix.ESRCH},
		{"update missing dest", f.UpdateDestination(s, dst("10.0.0.9:8080", 1)), unix.ENOENT},
		{"delete missing dest", f.DelDestination(s, dst("10.0.0.9:8080", 1)), unix.ENOENT},
	} {
		if (tc.want == nil) != (tc.err == nil) || tc.want != nil && !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if !IsExist(f.NewService(s)) || !IsNotFound(f.DelService(svc("10.96.0.9", 1, "rr"))) {
		t.Error("IsExist / IsNotFound do not recognise the kernel's errors")
	}
	svcs, err := f.GetServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 1 || svcs[0].Flags&FlagHashed == 0 {
		t.Errorf("services %+v (the kernel sets the hashed flag)", svcs)
	}
}

// must fails the test on a setup error: a setup step that did nothing
// would make the assertions after it meaningless.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
}

// TestFakeListOrder: a new real server goes to the head of the list, as in
// the kernel, and rr walks the list in that order.
func TestFakeListOrder(t *testing.T) {
	f := NewFake()
	s := svc("10.96.0.1", 80, "rr")
	must(t, f.NewService(s))
	for _, a := range []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"} {
		must(t, f.NewDestination(s, dst(a, 1)))
	}
	ds, err := f.GetDestinations(s)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, destKey(d).String())
	}
	if strings.Join(got, " ") != "10.0.0.3:80 10.0.0.2:80 10.0.0.1:80" {
		t.Errorf("list order %v", got)
	}
	k := KeyOf(s)
	seq := schedule(t, f, k, 4)
	if strings.Join(seq, " ") != "10.0.0.3:80 10.0.0.2:80 10.0.0.1:80 10.0.0.3:80" {
		t.Errorf("rr order %v", seq)
	}
	// Deleting the last one chosen keeps the rotation going.
	must(t, f.DelDestination(s, dst("10.0.0.3:80", 0)))
	seq = schedule(t, f, k, 2)
	if strings.Join(seq, " ") != "10.0.0.2:80 10.0.0.1:80" {
		t.Errorf("rr after delete %v", seq)
	}
	must(t, f.UpdateService(svc("10.96.0.1", 80, "sh")))
	if _, err := f.Schedule(k, 0); !errors.Is(err, ErrNotModelled) {
		t.Errorf("sh: %v", err)
	}
	must(t, f.UpdateService(svc("10.96.0.1", 80, "rr")))
	must(t, f.UpdateDestination(s, dst("10.0.0.1:80", 0)))
	must(t, f.UpdateDestination(s, dst("10.0.0.2:80", 0)))
	if _, err := f.Schedule(k, 0); !errors.Is(err, ErrNoDestination) {
		t.Errorf("all weight 0: %v", err)
	}
}

// TestFakeSystemRefuses: the fake tools refuse what the real ones refuse.
func TestFakeSystemRefuses(t *testing.T) {
	f := NewFakeSystem(nil)
	if _, err := f.Run("*filter\n-A INPUT -j KUBE-NOPE\nCOMMIT\n", "iptables-nft-restore", "--noflush"); err == nil {
		t.Error("a jump to a missing chain was accepted")
	}
	if _, err := f.Run("*filter\n-A INPUT -m set --match-set NOPE dst -j ACCEPT\nCOMMIT\n", "iptables-nft-restore", "--noflush"); err == nil {
		t.Error("a missing set was accepted")
	}
	if _, err := f.Run("add NOPE 1.2.3.4\n", "ipset", "restore", "-exist"); err == nil {
		t.Error("an entry for a missing set was accepted")
	}
	if _, err := f.Run("create S hash:ip\n", "ipset", "restore"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Run("*filter\n-A INPUT -m set --match-set S dst -j ACCEPT\nCOMMIT\n", "iptables-nft-restore", "--noflush"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Run("destroy S\n", "ipset", "restore"); err == nil {
		t.Error("a set in use was destroyed")
	}
	// A failed restore leaves the tables as they were.
	before, err := f.Run("", "iptables-nft-save")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Run("*filter\n:KUBE-X - [0:0]\n-A KUBE-X -j KUBE-Y\nCOMMIT\n", "iptables-nft-restore", "--noflush"); err == nil {
		t.Error("accepted")
	}
	if after, err := f.Run("", "iptables-nft-save"); err != nil || after != before {
		t.Errorf("a failed restore changed the tables (%v):\n%s", err, after)
	}
}
