package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// stopGrace is how long Close waits after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// process is one upstream program running inside a namespace.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	logf *os.File
	done chan struct{} // closed when Wait returned
	err  error         // Wait's result, set before done closes
}

// startProcess starts argv inside ns, its output to dir/<name>.log, in a
// process group of its own (so stop reaches its children) and with SIGKILL
// as parent-death signal. The parent-death signal follows the thread that
// forked: netns.Namespace.Start forks from a thread that Do returns to the
// runtime afterwards, which keeps it (only a thread that failed to switch
// back is discarded, and then the child is killed: safe, not silent).
func startProcess(ns *netns.Namespace, dir, name string, argv []string, env []string) (*process, error) {
	log := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("could not create %s's log: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := ns.Start(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("could not start %s in %s: %w", name, ns.Name, err)
	}
	p := &process{name: name, cmd: cmd, log: log, logf: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError says that the process ended early, with the last lines of its
// log.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited early (%v); last lines of %s:\n%s", p.name, p.err, p.log, tail(p.log, 20))
}

// stop sends SIGTERM to the process group, SIGKILL after stopGrace, and
// waits for the process. A process that has already ended is no error
// here: what it said is in its log.
func (p *process) stop() error {
	if p == nil || p.exited() {
		return nil
	}
	pgid := p.cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("could not stop %s: %w", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Children left in the group (an iptables-restore) go too.
	syscall.Kill(-pgid, syscall.SIGKILL)
	return nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(could not read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dialIn returns a DialContext that creates each socket inside ns (a socket
// keeps the namespace it was created in). Addresses must be IP literals, so
// the dial runs on the calling (namespace) thread without resolver
// goroutines.
func dialIn(ns *netns.Namespace) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.Do(func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// poll calls f every interval until it returns true or an error, the
// timeout passes or ctx ends.
func poll(ctx context.Context, interval, timeout time.Duration, what string, f func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := f()
		if ok {
			return nil
		}
		if err != nil {
			var fatal *fatalError
			if errors.As(err, &fatal) {
				return fatal.err
			}
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("%s: not within %s: %w", what, timeout, last)
			}
			return fmt.Errorf("%s: not within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, context.Cause(ctx))
		case <-time.After(interval):
		}
	}
}

// fatalError stops poll at once.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// Process is a program StartProcess started inside a namespace: a real
// cluster's components beyond the control plane (harness/cluster's
// kube-controller-manager, kube-scheduler and node launchers).
type Process struct{ p *process }

// StartProcess starts argv inside ns the way the control plane's programs
// start: output to dir/<name>.log, a process group of its own, SIGKILL as
// parent-death signal, the environment without proxy variables plus env.
func StartProcess(ns *netns.Namespace, dir, name string, argv []string, env ...string) (*Process, error) {
	p, err := startProcess(ns, dir, name, argv, append(processEnv(), env...))
	if err != nil {
		return nil, err
	}
	return &Process{p: p}, nil
}

// Pid is the process's ID (and its process group's).
func (p *Process) Pid() int { return p.p.cmd.Process.Pid }

// Log is the path of its log.
func (p *Process) Log() string { return p.p.log }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool { return p.p.exited() }

// ExitError says that the process ended, with the last lines of its log.
func (p *Process) ExitError() error { return p.p.exitError() }

// Stop sends SIGTERM to the process group, SIGKILL after 10 s, and waits.
// Safe on a nil Process and more than once.
func (p *Process) Stop() error {
	if p == nil {
		return nil
	}
	return p.p.stop()
}
