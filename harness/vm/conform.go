package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/ipvs"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/conform"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// InVMEnv is set in the guest's environment: a sim that sees it never
// starts another VM.
const InVMEnv = "KPSIM_IN_VM"

// InVM reports whether this process runs inside the kpsim VM.
func InVM() bool { return os.Getenv(InVMEnv) == "1" }

// NeedsVM reports whether `sim conform --mode mode` must run in the VM on
// this host: IPVS mode on a kernel without IPVS.
func NeedsVM(mode cluster.Mode) bool {
	return mode == cluster.ModeIPVS && !InVM() && ipvs.Available() != nil
}

// resultFile is where sim writes its JSON report in the guest.
const resultFile = "run.json"

// dumpDir is the guest's --dump folder under /results (the share), whose
// tree comes back to the host's --dump folder.
const dumpDir = "dump"

// writeDump writes the guest's dump tree into dir on the host, the
// manifest's scenario files mapped back to the host's names. The host
// checked dir (absent or empty) before booting; a path that would leave
// dir (the console's file names are the guest's word) is refused.
func writeDump(dir string, out map[string][]byte, vmFiles, files []string) error {
	prefix := dumpDir + "/"
	n := 0
	for name, b := range out {
		rel, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		if !filepath.IsLocal(filepath.FromSlash(rel)) {
			return fmt.Errorf("the VM's dump names %q, outside the dump folder", name)
		}
		if rel == "manifest.json" {
			var err error
			if b, err = mapFileNames(b, vmFiles, files); err != nil {
				return fmt.Errorf("could not read the VM's dump manifest: %w", err)
			}
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("could not create the dump folder: %w", err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return fmt.Errorf("could not write the dump: %w", err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("the VM wrote no dump into --dump")
	}
	return nil
}

// mapFileNames replaces, in a JSON document, every string that is a guest
// scenario path by the host's name for it.
func mapFileNames(b []byte, vmFiles, files []string) ([]byte, error) {
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		case string:
			for i, vf := range vmFiles {
				if x == vf {
					return files[i]
				}
			}
		}
		return v
	}
	b, err := json.MarshalIndent(walk(doc), "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Conform runs `sim conform` on the scenario files inside the VM and
// returns the report as if it had run here: the kernel property is the
// guest's, the file names are the host's. Bad input is caught on the host
// before booting. Failed checks are in the report (err nil); a VM that
// cannot run (qemu, kernel or busybox missing, the guest reports an
// environment error) is a *conform.EnvironmentError naming what is missing.
func Conform(ctx context.Context, files []string, co conform.Options, o Options) (*report.Run, error) {
	if InVM() {
		return nil, errors.New("already inside the kpsim VM: refusing to start another")
	}
	if _, err := proxy.ParseFaults(co.Faults); err != nil {
		return nil, err
	}
	in := map[string][]byte{}
	vmFiles := make([]string, len(files))
	for i, f := range files {
		l, err := scenario.LoadFile(f)
		if err != nil {
			return nil, err
		}
		if _, err := scenario.Expand(l, co.Seed); err != nil {
			return nil, err
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("could not read %s: %w", f, err)
		}
		// One directory per file keeps names unique and the base name as
		// the user wrote it.
		vmFiles[i] = path.Join("/kpsim/scenarios", strconv.Itoa(i), filepath.Base(f))
		in[vmFiles[i]] = b
	}
	args := append([]string{"conform"}, vmFiles...)
	args = append(args, "--mode", string(co.Mode), "--json", "/results/"+resultFile)
	for _, f := range co.Faults {
		if f != "" {
			args = append(args, "--fault", f)
		}
	}
	if co.Seed != nil {
		args = append(args, "--seed", strconv.FormatUint(*co.Seed, 10))
	}
	if co.Dump != "" {
		args = append(args, "--dump", "/results/"+dumpDir)
	}
	if co.IPTablesBackend != "" {
		args = append(args, "--iptables-backend", co.IPTablesBackend)
	}
	if co.IPTablesAffinity != "" {
		args = append(args, "--affinity", co.IPTablesAffinity)
	}
	if co.NFTablesLayout != "" {
		args = append(args, "--layout", co.NFTablesLayout)
	}
	if co.NFTTimeout > 0 {
		args = append(args, "--nft-timeout", co.NFTTimeout.String())
	}
	if o.Log == nil {
		o.Log = co.Log
	}
	res, out, err := Run(ctx, args, in, o)
	if err != nil {
		var me *MissingError
		if errors.As(err, &me) || errors.Is(err, ErrBoot) {
			return nil, &conform.EnvironmentError{Err: err}
		}
		return nil, err
	}
	b, ok := out[resultFile]
	if !ok {
		if res.ExitCode == 3 || res.ExitCode == 2 {
			return nil, &conform.EnvironmentError{Err: fmt.Errorf("sim conform exited %d in the VM without a report; console:\n%s", res.ExitCode, strings.Join(res.Tail, "\n"))}
		}
		return nil, fmt.Errorf("sim conform exited %d in the VM without a report; console:\n%s", res.ExitCode, strings.Join(res.Tail, "\n"))
	}
	if co.Dump != "" {
		if err := writeDump(co.Dump, out, vmFiles, files); err != nil {
			return nil, err
		}
	}
	var run report.Run
	if err := json.Unmarshal(b, &run); err != nil {
		return nil, fmt.Errorf("could not read the VM's report: %w", err)
	}
	for _, s := range run.Suites {
		for i, vf := range vmFiles {
			if s.File == vf {
				s.File = files[i]
			}
		}
	}
	switch res.ExitCode {
	case 0, 1:
		return &run, nil
	case 3:
		msg := "the VM cannot run the suite"
		for _, s := range run.Suites {
			if s.SetupError != "" {
				msg = s.SetupError
			}
		}
		return &run, &conform.EnvironmentError{Err: fmt.Errorf("in the VM (kernel %s): %s", run.Kernel, msg)}
	}
	return &run, fmt.Errorf("sim conform exited %d in the VM", res.ExitCode)
}
