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

// readReference reads the one calibration in a reference file (sim
// calibrate of a single mode and variant, e.g. --mode nftables --layout
// fast); a file with none, several or no points, or unreadable, is bad
// input.
func readReference(path string) (*calibrate.Calibration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("could not read the reference calibration: %w", err)}
	}
	var cs []*calibrate.Calibration
	if err := json.Unmarshal(b, &cs); err != nil {
		return nil, &UsageError{Err: fmt.Errorf("%s: not a calibration file: %w", path, err)}
	}
	if len(cs) != 1 {
		var names []string
		for _, c := range cs {
			names = append(names, string(c.Mode)+"/"+c.Variant)
		}
		return nil, &UsageError{Err: fmt.Errorf("%s: a reference holds one calibration (sim calibrate of one mode and variant), this one %d: %s", path, len(cs), strings.Join(names, ", "))}
	}
	if len(cs[0].Points) == 0 {
		return nil, &UsageError{Err: fmt.Errorf("%s: the %s/%s calibration has no points", path, cs[0].Mode, cs[0].Variant)}
	}
	return cs[0], nil
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
	fmt.Fprintf(s.Err, "emulation: each point divided by the ratio at its size (median %.2f, range %.2f-%.2f; the range widens the band)\n", e.Ratio, e.Low, e.High)
	for _, c := range out {
		c.Emulation = e
	}
	return nil
}
