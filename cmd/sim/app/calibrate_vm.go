package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/harness/vm"
	"github.com/kpsim/kpsim/sim/cluster"
)

// vmCalibrationFile is where the guest writes its calibration (under the
// results share).
const vmCalibrationFile = "calibration.json"

// vmMemoryMB and vmCPUs size the guest (harness/vm's defaults, stated here
// because the calibration records them).
const vmMemoryMB, vmCPUs = 1024, 2

// calibrateArgs is the guest's command line: the same calibration, written
// to the results share.
func calibrateArgs(f *calibrateFlags) []string {
	sizes := make([]string, len(f.sizes))
	for i, n := range f.sizes {
		sizes[i] = strconv.Itoa(n)
	}
	args := []string{"calibrate", "--mode", string(f.mode.m), "--sizes", strings.Join(sizes, ","),
		"--endpoints", strconv.Itoa(f.endpoints), "--runs", strconv.Itoa(f.runs), "--write", "/results/" + vmCalibrationFile}
	if f.mode.m == cluster.ModeNFTables {
		return append(args, "--layout", strings.Join(f.layouts, ","))
	}
	return append(args, "--backend", strings.Join(f.backends, ","))
}

// calibrateInVM runs the calibration in the microVM and brings its file
// back, each calibration marked with the machine it was measured on.
func calibrateInVM(ctx context.Context, s Streams, f *calibrateFlags) ([]*calibrate.Calibration, error) {
	res, files, err := vm.Run(ctx, calibrateArgs(f), nil, vm.Options{Log: s.Err, Timeout: f.vmTimeout, MemoryMB: vmMemoryMB, CPUs: vmCPUs})
	if err != nil {
		var me *vm.MissingError
		if errors.As(err, &me) || errors.Is(err, vm.ErrBoot) {
			return nil, &EnvError{Err: err}
		}
		return nil, err
	}
	b, ok := files[vmCalibrationFile]
	if !ok || res.ExitCode != 0 {
		return nil, &EnvError{Err: fmt.Errorf("sim calibrate exited %d in the VM (%s); console:\n%s", res.ExitCode, res.Accel, strings.Join(res.Tail, "\n"))}
	}
	var out []*calibrate.Calibration
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("could not read the VM's calibration: %w", err)
	}
	for _, c := range out {
		c.Machine = fmt.Sprintf("qemu microVM (harness/vm), %s, %d vCPUs, %d MB, on a host with kernel %s", strings.ToUpper(res.Accel), vmCPUs, vmMemoryMB, kernelRelease())
		c.Source += " --vm"
	}
	if res.Accel != "kvm" && f.refVM == "" {
		fmt.Fprintf(s.Err, "calibrate: measured under %s (an emulated CPU) and no --reference-vm/--reference-host given: the times are the VM's, not a host's\n", res.Accel)
	}
	return out, nil
}

// readReference reads the iptables-legacy calibration in a calibration
// file; a file without one, or unreadable, is bad input.
func readReference(path string) (*calibrate.Calibration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("could not read the reference calibration: %w", err)}
	}
	var cs []*calibrate.Calibration
	if err := json.Unmarshal(b, &cs); err != nil {
		return nil, &UsageError{Err: fmt.Errorf("%s: not a calibration file: %w", path, err)}
	}
	for _, c := range cs {
		if c.Mode == cluster.ModeIPTables && c.Variant == "legacy" {
			if len(c.Points) == 0 {
				return nil, &UsageError{Err: fmt.Errorf("%s: the iptables legacy calibration has no points", path)}
			}
			return c, nil
		}
	}
	return nil, &UsageError{Err: fmt.Errorf("%s: no iptables legacy calibration in it (sim calibrate --mode iptables --backend legacy writes one)", path)}
}

// applyEmulation sets every calibration's emulation from the references'
// ratio and prints the ratio per size.
func applyEmulation(s Streams, f *calibrateFlags, out []*calibrate.Calibration) error {
	vmRef, err := readReference(f.refVM)
	if err != nil {
		return err
	}
	hostRef, err := readReference(f.refHost)
	if err != nil {
		return err
	}
	accel := "unknown accelerator"
	if vmRef.Machine != "" {
		accel = vmRef.Machine
	}
	e, rs, err := calibrate.EmulationRatio(vmRef, hostRef, accel)
	if err != nil {
		return &UsageError{Err: fmt.Errorf("%s against %s: %w", f.refVM, f.refHost, err)}
	}
	for _, r := range rs {
		fmt.Fprintf(s.Err, "emulation: %5d x %d: VM %.3f s, host %.3f s, ratio %.2f\n", r.Services, r.Endpoints, r.VM, r.Host, r.Ratio)
	}
	fmt.Fprintf(s.Err, "emulation: ratio applied %.2f (range %.2f-%.2f)\n", e.Ratio, e.Low, e.High)
	if e.High > 1.5*e.Low {
		fmt.Fprintf(s.Err, "emulation: the ratio is not constant across sizes (%.2f to %.2f): the range is the band, read the per-size ratios above\n", e.Low, e.High)
	}
	for _, c := range out {
		c.Emulation = e
	}
	return nil
}
