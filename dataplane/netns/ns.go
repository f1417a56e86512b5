package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces are bind-mounted, as
// `ip netns` does, so that `ip netns exec NAME ...` works on ours.
const NetnsDir = "/run/netns"

// hostNS is the process's network namespace, opened before any goroutine
// could move a thread: Do returns threads to it. Opened at init so that a
// thread left elsewhere by another library can never become our reference.
var hostNS, hostNSErr = netns.Get()

// Do runs fn on an OS thread switched into the namespace ns and switches
// back afterwards. fn runs on a goroutine of its own that is locked to its
// thread; goroutines that fn starts run in the process's namespace. Sockets
// opened inside fn stay in ns after Do returns, so a listener or a dialled
// connection can be used from any goroutine.
//
// If the thread cannot be switched back it is left locked, and the runtime
// discards it when the goroutine ends (containernetworking/plugins'
// pkg/ns rule): a thread in the wrong namespace never runs other goroutines.
func Do(ns netns.NsHandle, fn func() error) error {
	if hostNSErr != nil {
		return fmt.Errorf("could not open the process's network namespace: %w", hostNSErr)
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			// setns failed: the thread is still where it was.
			runtime.UnlockOSThread()
			done <- fmt.Errorf("could not enter network namespace: %w", err)
			return
		}
		var fnErr error
		defer func() {
			if err := netns.Set(hostNS); err != nil {
				// Stay locked: the thread dies with this goroutine.
				done <- errors.Join(fnErr, fmt.Errorf("could not return to the host network namespace: %w", err))
				return
			}
			runtime.UnlockOSThread()
			done <- fnErr
		}()
		fnErr = fn()
	}()
	return <-done
}

// Namespace is a named network namespace: a file under NetnsDir with an open
// handle. Methods are safe for concurrent use.
type Namespace struct {
	// Name is the namespace's name, as `ip netns list` shows it.
	Name string
	// Role is what the namespace is for in its topology ("" when opened by
	// name and not ours).
	Role Role

	mu     sync.Mutex
	handle netns.NsHandle
	nl     *netlink.Handle
}

// Path is the namespace's bind-mount path, /run/netns/NAME.
func (n *Namespace) Path() string { return filepath.Join(NetnsDir, n.Name) }

// Handle is the namespace's open file descriptor, for netns and netlink calls.
func (n *Namespace) Handle() netns.NsHandle { return n.handle }

// Do runs fn inside the namespace (see the package function Do).
func (n *Namespace) Do(fn func() error) error {
	if err := Do(n.handle, fn); err != nil {
		return fmt.Errorf("in network namespace %s: %w", n.Name, err)
	}
	return nil
}

// Netlink returns a netlink handle whose sockets live in the namespace, so
// calls on it act there without switching any thread. It is opened on first
// use and closed by Close.
//
// The socket is opened by netlink.NewHandle inside Do rather than by
// netlink.NewHandleAt: NewHandleAt (netlink v1.3.1, nl.executeInNetns)
// unlocks its thread even when switching back failed, which our rule
// forbids; the handle obtained is the same.
func (n *Namespace) Netlink() (*netlink.Handle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nl != nil {
		return n.nl, nil
	}
	h, err := n.OpenNetlink(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	n.nl = h
	return h, nil
}

// OpenNetlink opens a netlink handle of the given protocols whose sockets
// live in the namespace (as Netlink's, see there); the caller closes it.
func (n *Namespace) OpenNetlink(protocols ...int) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := n.Do(func() error {
		var err error
		h, err = netlink.NewHandle(protocols...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("could not open a netlink socket: %w", err)
	}
	return h, nil
}

// closeNetlink releases the netlink socket, keeping the namespace handle.
func (n *Namespace) closeNetlink() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
}

// Close releases the handle and netlink socket; the namespace itself lives
// on while its bind mount exists (see Delete).
func (n *Namespace) Close() error {
	n.closeNetlink()
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.handle.IsOpen() {
		return nil
	}
	err := n.handle.Close()
	n.handle = netns.None()
	if err != nil {
		return fmt.Errorf("could not close network namespace %s: %w", n.Name, err)
	}
	return nil
}

// Open opens an existing named namespace by name (a file under NetnsDir).
func Open(name string) (*Namespace, error) {
	if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return nil, fmt.Errorf("could not open network namespace %q: not a namespace name", name)
	}
	h, err := netns.GetFromPath(filepath.Join(NetnsDir, name))
	if err != nil {
		return nil, fmt.Errorf("could not open network namespace %s: %w", name, err)
	}
	return &Namespace{Name: name, Role: RoleOf(name), handle: h}, nil
}

// create makes a named namespace without moving any thread the caller may
// use: a goroutine locks a thread, unshares it into a new namespace,
// bind-mounts it at NetnsDir/name, and puts the thread back into the host
// namespace before unlocking it. Discarding the thread instead (ending the
// goroutine locked) would kill children: the runtime hands a locked
// goroutine a thread that may have forked a process through Do earlier,
// and a parent-death signal follows the thread that forked (kube-proxy and
// kube-apiserver, SIGKILL, when a second run built its namespaces beside a
// running one). Only a thread that cannot return is discarded. The name
// must not exist yet.
func create(name string, role Role) (*Namespace, error) {
	if err := ensureNetnsDir(); err != nil {
		return nil, err
	}
	path := filepath.Join(NetnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("could not create network namespace %s: %w", name, err)
	}
	f.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			// The thread is still where it was.
			runtime.UnlockOSThread()
			done <- fmt.Errorf("could not unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		err := unix.Mount(src, path, "none", unix.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("could not bind-mount %s: %w", path, err)
		}
		if hostNSErr != nil {
			done <- errors.Join(err, fmt.Errorf("could not open the process's network namespace: %w", hostNSErr))
			return // stays locked: the thread dies with this goroutine
		}
		if serr := netns.Set(hostNS); serr != nil {
			done <- errors.Join(err, fmt.Errorf("could not return to the host network namespace: %w", serr))
			return // stays locked: the thread dies with this goroutine
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	if err := <-done; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("could not create network namespace %s: %w", name, err)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		removeNamed(name)
		return nil, fmt.Errorf("could not open network namespace %s: %w", name, err)
	}
	return &Namespace{Name: name, Role: role, handle: h}, nil
}

// removeNamed unmounts and removes NetnsDir/name, as `ip netns delete` does.
// The kernel destroys the namespace, and with it its links (and their veth
// peers in other namespaces), once nothing else holds it. A file that is not
// a mount point (a run killed between creating and mounting it) is removed
// too.
func removeNamed(name string) error {
	path := filepath.Join(NetnsDir, name)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("could not unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("could not remove %s: %w", path, err)
	}
	return nil
}

// Delete closes the namespace's handles and removes its name. Equivalent to
// `ip netns delete NAME`.
func (n *Namespace) Delete() error {
	return errors.Join(n.Close(), removeNamed(n.Name))
}

// Sysctl writes value to a sysctl of the namespace: key in dotted form
// ("net.ipv4.ip_forward") or as a path under /proc/sys
// ("net/ipv4/conf/all/rp_filter"). /proc/sys/net resolves to the network
// namespace of the thread that opens it, so the write runs inside Do.
func (n *Namespace) Sysctl(key, value string) error {
	path := sysctlPath(key)
	err := n.Do(func() error {
		return os.WriteFile(path, []byte(value), 0o644)
	})
	if err != nil {
		return fmt.Errorf("could not set %s to %s: %w", key, value, err)
	}
	return nil
}

// ReadSysctl reads a sysctl of the namespace (key as for Sysctl).
func (n *Namespace) ReadSysctl(key string) (string, error) {
	path := sysctlPath(key)
	var out []byte
	err := n.Do(func() error {
		var err error
		out, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("could not read %s: %w", key, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func sysctlPath(key string) string {
	if !strings.Contains(key, "/") {
		key = strings.ReplaceAll(key, ".", "/")
	}
	return filepath.Join("/proc/sys", key)
}

// Start starts cmd inside the namespace: the child is forked from a thread
// switched into it (Do), and a child inherits its parent thread's network
// namespace. Wait for it as usual. No `ip netns exec` wrapper is involved,
// so /sys is the caller's; tools that read /sys/class/net need
// `ip netns exec` instead (see Command).
func (n *Namespace) Start(cmd *exec.Cmd) error {
	return n.Do(cmd.Start)
}

// Run starts cmd inside the namespace and waits for it.
func (n *Namespace) Run(cmd *exec.Cmd) error {
	if err := n.Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// Exec runs name with args inside the namespace and returns its standard
// output. A failure's error carries the command line and its standard error.
// Equivalent to `ip netns exec NS name args...`.
func (n *Namespace) Exec(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := n.Run(cmd); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[:2000] + "..."
		}
		return stdout.Bytes(), fmt.Errorf("%s %s in %s failed: %w: %s", name, strings.Join(args, " "), n.Name, err, msg)
	}
	return stdout.Bytes(), nil
}

// Exec runs name with args inside the named namespace ns (see
// Namespace.Exec), for callers that hold only the name.
func Exec(ns, name string, args ...string) ([]byte, error) {
	n, err := Open(ns)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	return n.Exec(name, args...)
}

// Command returns `ip netns exec NS name args...` for debugging or for tools
// that need /sys of the namespace; `ip` must be installed.
func Command(ns, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Current is the calling thread's network namespace under a name of the
// caller's choosing (for logs): a node proxy run on a node itself (sim
// proxy --host-network-namespace) programs it. Nothing here created it and
// Delete must not be called on it.
func Current(name string) (*Namespace, error) {
	h, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("could not open the current network namespace: %w", err)
	}
	return &Namespace{Name: name, Role: RoleNode, handle: h}, nil
}
