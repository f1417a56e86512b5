package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// QEMU is the emulator binary (Debian package qemu-system-x86).
const QEMU = "qemu-system-x86_64"

// BootOptions configure one VM run.
type BootOptions struct {
	Kernel string
	// Initrd is the concatenated initramfs (base image and run archive).
	Initrd string
	// Share is a host directory mounted in the VM at /results over 9p
	// (mount_tag results); empty: results come back on the console only.
	Share string
	// MemoryMB is the guest's memory (default 1024).
	MemoryMB int
	// CPUs is the guest's CPU count (default 2).
	CPUs int
	// BootTimeout bounds the time to the READY marker (default 2 min).
	BootTimeout time.Duration
	// Timeout bounds the whole run (default 30 min).
	Timeout time.Duration
	// Console receives every console line as it arrives (nil: discarded).
	Console io.Writer
	// Accel forces "kvm" or "tcg"; empty chooses (see Boot).
	Accel string
	// KVMVerdict is a file that remembers a KVM that failed on this host
	// (empty: none).
	KVMVerdict string
	// Log receives the runner's own lines, such as the fallback from KVM
	// to TCG (nil: discarded).
	Log io.Writer

	// qemu, kvmProbe and haveKVM replace the emulator binary, the KVM
	// probe's bound and the /dev/kvm check in tests.
	qemu     string
	kvmProbe time.Duration
	haveKVM  func() bool
}

// kvmProbe bounds the wait for init's first line under KVM: a working KVM
// gets there in a second or two, TCG in about five; a nested KVM without
// the host's support can hang forever before the kernel prints anything.
const kvmProbe = 20 * time.Second

// ErrKVMStuck is returned when a guest under KVM did not start init in
// the probe's time.
var ErrKVMStuck = errors.New("the guest made no progress under KVM")

// Result is what a VM run reported.
type Result struct {
	// Accel is "kvm" or "tcg".
	Accel string
	// Booted is the wall time from starting qemu to init's first line;
	// Ready to the READY marker (modules loaded, share mounted).
	Booted, Ready time.Duration
	// GuestUptimeReady is the guest's own uptime at READY.
	GuestUptimeReady float64
	// Share reports whether the 9p share was mounted in the guest.
	Share bool
	// ExitCode is the code sim exited with in the guest (-1: none seen).
	ExitCode int
	// Files are result files sent on the console (when there was no share).
	Files map[string][]byte
	// Wall is the whole run's duration.
	Wall time.Duration
	// Tail holds the last console lines, for error messages.
	Tail []string
}

// KVMUsable reports whether /dev/kvm can be opened for reading and writing.
func KVMUsable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// Args returns the qemu command line: no network device at all (-nic
// none), the serial console on stdio (-nographic), no reboot (a guest
// panic or reboot ends qemu), KVM when usable with TCG as the fallback.
func (o *BootOptions) Args(accel string) []string {
	mem, cpus := o.MemoryMB, o.CPUs
	if mem == 0 {
		mem = 1024
	}
	if cpus == 0 {
		cpus = 2
	}
	args := []string{"-m", strconv.Itoa(mem), "-smp", strconv.Itoa(cpus)}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-accel", "tcg")
	} else {
		args = append(args, "-accel", "tcg")
	}
	args = append(args, "-cpu", "max", "-nographic", "-no-reboot", "-nic", "none", "-monitor", "none", "-serial", "stdio",
		"-kernel", o.Kernel, "-initrd", o.Initrd,
		"-append", "console=ttyS0 panic=-1 quiet loglevel=3 random.trust_cpu=on kpsim.scale="+strconv.Itoa(timeScale(accel)))
	if o.Share != "" {
		args = append(args, "-virtfs", "local,path="+o.Share+",mount_tag=results,security_model=none,id=results")
	}
	return args
}

// timeScale is how much the harness stretches its waits for packets in
// flight: software emulation (TCG) runs the guest's network stack several
// times slower than the host's.
func timeScale(accel string) int {
	if accel == "kvm" {
		return 1
	}
	return 4
}

// ErrBoot is wrapped when the guest did not reach READY.
var ErrBoot = errors.New("the VM did not boot")

// Boot runs qemu until it exits, the run times out or ctx ends (qemu is
// killed then), reading the console for the markers of the init script.
//
// The accelerator is Accel (also $KPSIM_VM_ACCEL) when set, and then no
// other is tried. Otherwise it is KVM when /dev/kvm can be opened and KVM
// has not failed on this host before, TCG otherwise. Any failure under KVM
// before the guest reaches READY (qemu exits or aborts, prints an error, or
// the guest makes no progress) ends that qemu and the same run starts again
// under TCG; the verdict is kept in KVMVerdict with the host kernel's
// release and the reason, so later runs on this host go straight to TCG.
// On the machines this project runs on, /dev/kvm opens but qemu aborts
// ("failed to set MSR 0x10a", kvm_buf_set_msrs) or the guest hangs.
func Boot(ctx context.Context, o BootOptions) (*Result, error) {
	if o.qemu == "" {
		o.qemu = QEMU
	}
	if _, err := exec.LookPath(o.qemu); err != nil {
		return nil, &MissingError{Package: PackageQEMU, Err: fmt.Errorf("%s is not installed", QEMU)}
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 2 * time.Minute
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute
	}
	if o.kvmProbe == 0 {
		o.kvmProbe = kvmProbe
	}
	if o.haveKVM == nil {
		o.haveKVM = KVMUsable
	}
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	accel := o.Accel
	if accel == "" {
		accel = os.Getenv("KPSIM_VM_ACCEL")
	}
	if accel != "" {
		return boot(ctx, o, accel)
	}
	if !o.haveKVM() {
		return boot(ctx, o, "tcg")
	}
	if why, failed := kvmFailedBefore(o.KVMVerdict); failed {
		fmt.Fprintf(log, "vm: using TCG (software emulation): KVM failed on this host kernel before (%s); remove %s to try KVM again\n", why, o.KVMVerdict)
		return boot(ctx, o, "tcg")
	}
	res, err := boot(ctx, o, "kvm")
	if err == nil || ctx.Err() != nil || (res != nil && res.Ready > 0) {
		// Success, the caller's end, or a failure after READY: the
		// guest ran under KVM, so the failure is not KVM's.
		return res, err
	}
	why := kvmFailure(err)
	if o.KVMVerdict != "" {
		if werr := os.WriteFile(o.KVMVerdict, []byte(hostRelease()+"\t"+why+"\n"), 0o644); werr != nil {
			fmt.Fprintf(log, "vm: could not remember the KVM verdict: %v\n", werr)
		}
	}
	fmt.Fprintf(log, "vm: KVM failed before the guest was ready (%s): starting again under TCG (software emulation)\n", why)
	return boot(ctx, o, "tcg")
}

// kvmFailure says in one line why a boot under KVM failed.
func kvmFailure(err error) string {
	var qe *qemuError
	if errors.As(err, &qe) {
		return qe.short()
	}
	line, _, _ := strings.Cut(err.Error(), "\n")
	return line
}

// qemuError is a qemu that ended, or was ended, before the guest was ready.
type qemuError struct {
	// Stuck: killed because the guest made no progress in the probe's time.
	Stuck bool
	// Errored: killed because qemu printed an error under KVM.
	Errored bool
	// Late: killed because the guest was not ready in BootTimeout.
	Late bool
	// Probe is the probe's bound, BootTimeout the boot's.
	Probe, BootTimeout time.Duration
	// Wait is what waiting for qemu returned; Stderr what it printed.
	Wait   error
	Stderr string
	// Tail is the end of the console.
	Tail []string
}

func (e *qemuError) Error() string {
	msg := e.short()
	if !e.Stuck && !e.Late {
		msg = fmt.Sprintf("%v within %s (%s)", ErrBoot, e.BootTimeout, msg)
	}
	return msg + "; console:\n" + strings.Join(e.Tail, "\n")
}

func (e *qemuError) Unwrap() error {
	if e.Stuck {
		return ErrKVMStuck
	}
	return ErrBoot
}

// short is one line: what happened to qemu and the first error it printed.
func (e *qemuError) short() string {
	var what string
	switch {
	case e.Stuck:
		what = fmt.Sprintf("%v within %s", ErrKVMStuck, e.Probe)
	case e.Errored:
		what = "qemu printed an error"
	case e.Late:
		what = fmt.Sprintf("the guest was not ready within %s", e.BootTimeout)
	case e.Wait != nil:
		what = "qemu: " + e.Wait.Error()
	default:
		what = "qemu exited before the guest was ready"
	}
	if line := firstError(e.Stderr); line != "" && !e.Late {
		what += ": " + line
	}
	return what
}

// firstError is the first line of qemu's stderr that reports an error,
// else its last line.
func firstError(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for _, l := range lines {
		if isQEMUError(l) {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// isQEMUError reports whether a line qemu printed is an error rather than
// a warning ("qemu-system-x86_64: error: failed to set MSR ...", an
// assertion, "Could not access KVM kernel module").
func isQEMUError(line string) bool {
	l := strings.ToLower(line)
	if strings.Contains(l, "warning") {
		return false
	}
	for _, w := range []string{"error", "assertion", "failed", "could not", "abort"} {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
}

// kvmFailedBefore reports whether KVM failed on this host kernel, and why.
func kvmFailedBefore(verdict string) (string, bool) {
	if verdict == "" {
		return "", false
	}
	b, err := os.ReadFile(verdict)
	if err != nil {
		return "", false
	}
	release, why, _ := strings.Cut(strings.TrimSpace(string(b)), "\t")
	if release != hostRelease() {
		return "", false
	}
	if why == "" {
		why = "no reason recorded"
	}
	return why, true
}

func hostRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// qemuRun is one qemu process booting the VM and what its watchers share:
// the markers seen on the console, why it was killed, and its stderr.
type qemuRun struct {
	o     BootOptions
	accel string
	cmd   *exec.Cmd
	res   *Result
	start time.Time
	// exited closes after qemu was reaped; ready and booted when the
	// console shows KPSIM-READY and KPSIM-BOOTED.
	exited, ready, booted           chan struct{}
	killOnce, readyOnce, bootedOnce sync.Once
	// Why qemu was killed: no KPSIM-BOOTED by the KVM probe, an error
	// line on stderr before READY under KVM, no READY by BootTimeout.
	stuck, errored, late atomic.Bool
	stderrMu             sync.Mutex
	stderr               strings.Builder
}

// boot runs qemu once with the given accelerator: it starts qemu, watches
// its stderr and its timers, reads the console until qemu exits, then
// decides what the run was.
func boot(ctx context.Context, o BootOptions, accel string) (*Result, error) {
	res := &Result{Accel: accel, ExitCode: -1, Files: map[string][]byte{}}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	q := &qemuRun{o: o, accel: accel, res: res, exited: make(chan struct{}), ready: make(chan struct{}), booted: make(chan struct{})}
	out, errPipe, err := q.startQEMU()
	if err != nil {
		return nil, err
	}
	stderrDone := make(chan struct{})
	go q.readStderr(errPipe, stderrDone)
	go q.watch(ctx)
	con := q.readConsole(out)
	<-stderrDone
	werr := q.cmd.Wait()
	close(q.exited)
	res.Wall = time.Since(q.start)
	res.Tail = con.tail
	return res, q.verdict(ctx, con, werr)
}

// startQEMU starts qemu in its own process group and returns its stdout
// (the serial console) and stderr.
func (q *qemuRun) startQEMU() (io.ReadCloser, io.ReadCloser, error) {
	o := q.o
	cmd := exec.Command(o.qemu, o.Args(q.accel)...)
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("could not start %s: %w", o.qemu, err)
	}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("could not start %s: %w", o.qemu, err)
	}
	q.cmd = cmd
	q.start = time.Now()
	// Pdeathsig fires when the forking thread ends, not the process: fork
	// from a locked thread kept until qemu exits, so that qemu dies with
	// this process and never earlier.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			<-q.exited
		}
	}()
	if err := <-started; err != nil {
		return nil, nil, fmt.Errorf("could not start %s: %w", o.qemu, err)
	}
	return out, errPipe, nil
}

// kill ends qemu's process group, once.
func (q *qemuRun) kill() {
	q.killOnce.Do(func() { _ = syscall.Kill(-q.cmd.Process.Pid, syscall.SIGKILL) })
}

// readStderr keeps qemu's stderr for the error message; under KVM an
// error line before READY ends the run (qemu may print one and hang).
func (q *qemuRun) readStderr(errPipe io.Reader, done chan<- struct{}) {
	defer close(done)
	sc := bufio.NewScanner(errPipe)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		q.stderrMu.Lock()
		if q.stderr.Len() < 64<<10 {
			q.stderr.WriteString(line + "\n")
		}
		q.stderrMu.Unlock()
		if q.accel == "kvm" && isQEMUError(line) {
			select {
			case <-q.ready:
			default:
				q.errored.Store(true)
				q.kill()
			}
		}
	}
	_, _ = io.Copy(io.Discard, errPipe)
}

// watch kills qemu when the context ends, when under KVM the guest has not
// booted by the KVM probe (KVM stuck: the caller falls back to TCG), or
// when it is not ready by BootTimeout. It returns when qemu has exited.
func (q *qemuRun) watch(ctx context.Context) {
	bootT := time.NewTimer(q.o.BootTimeout)
	defer bootT.Stop()
	var probe <-chan time.Time
	if q.accel == "kvm" {
		t := time.NewTimer(q.o.kvmProbe)
		defer t.Stop()
		probe = t.C
	}
	for {
		select {
		case <-q.exited:
			return
		case <-ctx.Done():
			q.kill()
			return
		case <-probe:
			probe = nil
			select {
			case <-q.booted:
			default:
				q.stuck.Store(true)
				q.kill()
				return
			}
		case <-bootT.C:
			select {
			case <-q.ready:
			default:
				q.late.Store(true)
				q.kill()
				return
			}
		}
	}
}

// readConsole reads the serial console until qemu closes it, echoing it to
// o.Console, timing the BOOTED and READY markers and, after EXIT, giving a
// guest that hangs instead of rebooting ten seconds before it is killed.
func (q *qemuRun) readConsole(out io.Reader) *console {
	con := &console{res: q.res}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		ev, show := con.feed(line)
		if show && q.o.Console != nil {
			fmt.Fprintln(q.o.Console, line)
		}
		switch ev {
		case "KPSIM-BOOTED":
			q.res.Booted = time.Since(q.start)
			q.bootedOnce.Do(func() { close(q.booted) })
		case "KPSIM-READY":
			q.res.Ready = time.Since(q.start)
			q.readyOnce.Do(func() { close(q.ready) })
		case "KPSIM-EXIT":
			// Init exits next and the kernel's panic reboots into
			// -no-reboot; do not wait on a guest that hangs instead.
			go func() {
				select {
				case <-q.exited:
				case <-time.After(10 * time.Second):
					q.kill()
				}
			}()
		}
	}
	_, _ = io.Copy(io.Discard, out)
	return con
}

// verdict decides what a finished run was: a console that could not be
// read, a VM that never got ready (a *qemuError saying why, which the
// caller reads to fall back from KVM to TCG), one that stopped without an
// exit code, or a run that finished (nil).
func (q *qemuRun) verdict(ctx context.Context, con *console, werr error) error {
	res := q.res
	if con.err != nil {
		return con.err
	}
	if res.Ready == 0 {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ctx.Err()
		}
		q.stderrMu.Lock()
		msg := q.stderr.String()
		q.stderrMu.Unlock()
		return &qemuError{Stuck: q.stuck.Load(), Errored: q.errored.Load(), Late: q.late.Load(), Probe: q.o.kvmProbe, BootTimeout: q.o.BootTimeout,
			Wait: werr, Stderr: msg, Tail: res.Tail}
	}
	if res.ExitCode < 0 {
		if ctx.Err() != nil {
			return fmt.Errorf("the VM run did not finish: %w; console:\n%s", ctx.Err(), strings.Join(res.Tail, "\n"))
		}
		return fmt.Errorf("the VM stopped without reporting an exit code (qemu: %v); console:\n%s", werr, strings.Join(res.Tail, "\n"))
	}
	return nil
}

// console reads the guest's serial console: it keeps the last lines, picks
// out the init script's markers and reassembles result files sent in
// base64 between KPSIM-BEGIN and KPSIM-END.
type console struct {
	res  *Result
	tail []string
	cur  string
	buf  bytes.Buffer
	err  error
}

// feed takes one line and returns the marker it holds ("" for none) and
// whether the line is worth showing (file contents are not).
func (c *console) feed(line string) (string, bool) {
	if c.cur != "" {
		if strings.TrimSpace(line) != "KPSIM-END" {
			c.buf.WriteString(strings.TrimSpace(line))
			return "", false
		}
		b, err := base64.StdEncoding.DecodeString(c.buf.String())
		if err != nil && c.err == nil {
			c.err = fmt.Errorf("could not decode %s from the console: %w", c.cur, err)
		}
		c.res.Files[c.cur] = b
		c.cur = ""
		c.buf.Reset()
		return "", false
	}
	c.tail = append(c.tail, line)
	if len(c.tail) > 40 {
		c.tail = c.tail[1:]
	}
	// A marker may follow the terminal escapes SeaBIOS leaves.
	i := strings.Index(line, "KPSIM-")
	if i < 0 {
		return "", true
	}
	f := strings.Fields(line[i:])
	switch f[0] {
	case "KPSIM-READY":
		if len(f) > 1 {
			c.res.GuestUptimeReady, _ = strconv.ParseFloat(f[1], 64)
		}
		c.res.Share = strings.Contains(line, "share=yes")
	case "KPSIM-BEGIN":
		if len(f) > 1 {
			c.cur = f[1]
		}
		return f[0], false
	case "KPSIM-EXIT":
		if len(f) > 1 {
			c.res.ExitCode, _ = strconv.Atoi(f[1])
		}
	}
	return f[0], true
}
