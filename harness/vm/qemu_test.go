package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// standIn writes a shell script that plays qemu: under TCG (-accel tcg
// alone) it prints the init script's markers and exits as a guest would;
// under KVM it does what kvm says. It records each accelerator it was
// started with, in order, in the returned log file.
func standIn(t *testing.T, kvm string) (qemu, calls string) {
	t.Helper()
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	script := `#!/bin/sh
accel=tcg
case " $* " in *" -accel kvm "*) accel=kvm ;; esac
echo "$accel" >> '` + calls + `'
if [ "$accel" = kvm ]; then
` + kvm + `
fi
echo "KPSIM-BOOTED"
echo "KPSIM-READY 1.25 share=no"
echo "KPSIM-EXIT 0"
exit 0
`
	qemu = filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(qemu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return qemu, calls
}

// TestBootFallsBackFromKVM runs Boot against a stand-in qemu for each way
// KVM fails on the machines this project runs on, and requires the same
// run to end under TCG, one line saying why, and the verdict remembered:
// the next run goes straight to TCG.
func TestBootFallsBackFromKVM(t *testing.T) {
	for name, tc := range map[string]struct {
		kvm, why string
	}{
		// qemu's own assertion under KVM on these machines.
		"abort": {`echo "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69" >&2
echo "qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion failed." >&2
kill -ABRT $$`, "failed to set MSR 0x10a"},
		"exit 1":        {`echo "qemu-system-x86_64: Could not access KVM kernel module: Permission denied" >&2; exit 1`, "Could not access KVM"},
		"silent exit 1": {`exit 1`, "qemu: exit status 1"},
		"hang":          {`exec sleep 60`, "no progress"},
		"error":         {`echo "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69" >&2; exec sleep 60`, "printed an error"},
		"no ready":      {`echo KPSIM-BOOTED; exec sleep 60`, "not ready within 3s"},
	} {
		t.Run(name, func(t *testing.T) {
			qemu, calls := standIn(t, tc.kvm)
			verdict := filepath.Join(t.TempDir(), "kvm-stuck")
			var log bytes.Buffer
			o := BootOptions{Kernel: "/k", Initrd: "/i", KVMVerdict: verdict, Log: &log,
				BootTimeout: 3 * time.Second, Timeout: time.Minute,
				qemu: qemu, kvmProbe: 2 * time.Second, haveKVM: func() bool { return true }}
			t.Setenv("KPSIM_VM_ACCEL", "")
			res, err := Boot(context.Background(), o)
			if err != nil {
				t.Fatalf("Boot: %v (log: %s)", err, log.String())
			}
			if res.Accel != "tcg" || res.ExitCode != 0 || res.GuestUptimeReady != 1.25 {
				t.Errorf("result: accel %s, exit %d, uptime %v", res.Accel, res.ExitCode, res.GuestUptimeReady)
			}
			if got := readCalls(t, calls); got != "kvm tcg" {
				t.Errorf("accelerators tried: %q, want \"kvm tcg\"", got)
			}
			lines := strings.Split(strings.TrimSpace(log.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], "KVM failed") || !strings.Contains(lines[0], tc.why) {
				t.Errorf("log: %q, want one line saying KVM failed with %q", log.String(), tc.why)
			}
			why, ok := kvmFailedBefore(verdict)
			if !ok || !strings.Contains(why, tc.why) {
				t.Errorf("verdict: %q, %v", why, ok)
			}

			// The next run remembers and does not try KVM.
			log.Reset()
			if err := os.Remove(calls); err != nil {
				t.Fatal(err)
			}
			if _, err := Boot(context.Background(), o); err != nil {
				t.Fatalf("second Boot: %v", err)
			}
			if got := readCalls(t, calls); got != "tcg" {
				t.Errorf("second run tried %q, want tcg only", got)
			}
			if !strings.Contains(log.String(), "KVM failed on this host kernel before") {
				t.Errorf("second run's log: %q", log.String())
			}
		})
	}
}

// TestBootKeepsWorkingKVM: a KVM that boots is used, and no verdict is
// written.
func TestBootKeepsWorkingKVM(t *testing.T) {
	qemu, calls := standIn(t, ":")
	verdict := filepath.Join(t.TempDir(), "kvm-stuck")
	var log bytes.Buffer
	t.Setenv("KPSIM_VM_ACCEL", "")
	res, err := Boot(context.Background(), BootOptions{Kernel: "/k", Initrd: "/i", KVMVerdict: verdict, Log: &log,
		qemu: qemu, haveKVM: func() bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Accel != "kvm" || readCalls(t, calls) != "kvm" || log.Len() != 0 {
		t.Errorf("accel %s, calls %q, log %q", res.Accel, readCalls(t, calls), log.String())
	}
	if _, err := os.Stat(verdict); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a verdict was written for a working KVM: %v", err)
	}
}

// TestBootForcedAccel: an accelerator the user chose is never replaced,
// and its failure is the run's error.
func TestBootForcedAccel(t *testing.T) {
	qemu, calls := standIn(t, "exit 1")
	t.Setenv("KPSIM_VM_ACCEL", "kvm")
	_, err := Boot(context.Background(), BootOptions{Kernel: "/k", Initrd: "/i", BootTimeout: 3 * time.Second,
		qemu: qemu, haveKVM: func() bool { return true }})
	if !errors.Is(err, ErrBoot) {
		t.Fatalf("err = %v, want ErrBoot", err)
	}
	if got := readCalls(t, calls); got != "kvm" {
		t.Errorf("tried %q, want kvm only", got)
	}
}

// TestBootNoKVM: without /dev/kvm, TCG at once.
func TestBootNoKVM(t *testing.T) {
	qemu, calls := standIn(t, "exit 1")
	t.Setenv("KPSIM_VM_ACCEL", "")
	res, err := Boot(context.Background(), BootOptions{Kernel: "/k", Initrd: "/i",
		qemu: qemu, haveKVM: func() bool { return false }})
	if err != nil || res.Accel != "tcg" || readCalls(t, calls) != "tcg" {
		t.Fatalf("err %v, calls %q", err, readCalls(t, calls))
	}
}

func readCalls(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}
