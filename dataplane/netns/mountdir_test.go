package netns

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/testenv"
)

// TestHiddenNamespaces reads a mount table recorded on a machine where a
// run's namespaces were mounted in the plain /run/netns and ip netns add
// later bound /run/netns on itself: the run's mounts hang off the root
// mount, hidden; a namespace added since sits in the covering mount.
func TestHiddenNamespaces(t *testing.T) {
	mounts := []mountEntry{
		{ID: 27, Parent: 1, Point: "/", FSType: "ext4"},
		{ID: 42, Parent: 27, Point: "/run/netns/kpsim-6fc8f1-_fabric", FSType: "nsfs"},
		{ID: 43, Parent: 27, Point: "/run/netns/kpsim-6fc8f1-node-a", FSType: "nsfs"},
		{ID: 49, Parent: 27, Point: "/run/netns", FSType: "ext4"},
		{ID: 50, Parent: 49, Point: "/run/netns/other", FSType: "nsfs"},
		{ID: 51, Parent: 27, Point: "/run/user/0", FSType: "tmpfs"},
	}
	hidden, cover := hiddenNamespaces(mounts)
	slices.Sort(hidden)
	if cover != 49 || !slices.Equal(hidden, []string{"kpsim-6fc8f1-_fabric", "kpsim-6fc8f1-node-a"}) {
		t.Errorf("hidden %v under %d", hidden, cover)
	}
	// The covering mount holds another namespace: left alone, and the
	// error names it.
	if err := uncoverNetnsDir(mounts, cover); err == nil || !strings.Contains(err.Error(), "(other)") {
		t.Errorf("uncover with a namespace in use: %v", err)
	}
	// No covering mount: nothing is hidden.
	if h, c := hiddenNamespaces(mounts[:3]); h != nil || c != 0 {
		t.Errorf("without a mount of /run/netns: %v, %d", h, c)
	}
	if got := unescapeMount(`/run/netns/a\040b`); got != "/run/netns/a b" {
		t.Errorf("unescape: %q", got)
	}
}

// TestNamespaceSurvivesIPNetnsAdd: a namespace of ours, then ip netns add
// by someone else (the iproute2 tool binds /run/netns on itself when it is
// not a mount point), then our Delete must still remove ours.
func TestNamespaceSurvivesIPNetnsAdd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	ours, theirs := "kpsim-t"+hex.EncodeToString(b)+"-ours", "kpsim-t"+hex.EncodeToString(b)+"-ip"
	ns, err := create(ours, RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	if out, err := exec.Command("ip", "netns", "add", theirs).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", theirs).Run() })
	if err := ns.Delete(); err != nil {
		t.Fatalf("delete after ip netns add: %v", err)
	}
	if _, err := os.Stat(filepath.Join(NetnsDir, ours)); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", ours, err)
	}
}

// TestCreateSparesChildren: processes started in a namespace with SIGKILL as
// their parent-death signal (as harness/upstream starts kube-apiserver and
// kube-proxy) must outlive namespaces created afterwards. create used to end
// its goroutine on a locked thread, which the runtime discards; when that
// thread had forked one of the children through Do, the child was killed.
func TestCreateSparesChildren(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "sleep")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	prefix := "kpsim-t" + hex.EncodeToString(b) + "-"
	home, err := create(prefix+"home", RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = home.Delete() })
	var children []*exec.Cmd
	t.Cleanup(func() {
		for _, c := range children {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	for i := range 20 {
		c := exec.Command("sleep", "60")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := home.Start(c); err != nil {
			t.Fatal(err)
		}
		children = append(children, c)
		ns, err := create(fmt.Sprintf("%sn%d", prefix, i), RoleNode)
		if err != nil {
			t.Fatal(err)
		}
		if err := ns.Delete(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // a signal is delivered asynchronously
	for i, c := range children {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(c.Process.Pid, &ws, syscall.WNOHANG, nil)
		if err != nil {
			t.Fatal(err)
		}
		if pid != 0 {
			t.Errorf("child %d (pid %d) ended (%v) when a namespace was created after it", i, pid, ws.Signal())
		}
	}
}
