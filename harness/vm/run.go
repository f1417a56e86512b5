package vm

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Options configure the VM.
type Options struct {
	// CacheDir holds the kernel, busybox and images ("": CacheDir()).
	CacheDir string
	// NoFetch forbids downloading a missing kernel or busybox.
	NoFetch bool
	// Sim is the sim binary to run in the VM ("": this executable).
	Sim string
	// MemoryMB and CPUs size the guest (default 1024 MB, 2).
	MemoryMB, CPUs int
	// Timeout bounds the whole run (default 30 min); BootTimeout the boot
	// (default 2 min).
	Timeout, BootTimeout time.Duration
	// Log receives progress lines and the guest's console (nil: discarded).
	Log io.Writer
}

// Run boots the VM and runs `sim args...` in it, with files placed at
// their (absolute) VM paths. It returns the VM's report and the result
// files sim wrote to /results, named by their slash-separated path under it
// ("run.json", "dump/manifest.json"). A missing qemu, kernel or busybox is a
// *MissingError.
func Run(ctx context.Context, args []string, files map[string][]byte, o Options) (*Result, map[string][]byte, error) {
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	if _, err := lookQEMU(); err != nil {
		return nil, nil, err
	}
	dir := o.CacheDir
	if dir == "" {
		var err error
		if dir, err = CacheDir(); err != nil {
			return nil, nil, err
		}
	}
	assets, err := Prepare(ctx, dir, !o.NoFetch, log)
	if err != nil {
		return nil, nil, err
	}
	sim := o.Sim
	if sim == "" {
		if sim, err = os.Executable(); err != nil {
			return nil, nil, fmt.Errorf("could not find the sim binary: %w", err)
		}
	}
	t0 := time.Now()
	img, err := BuildImage(assets, sim, log)
	if err != nil {
		return nil, nil, err
	}
	if len(img.Missing) > 0 {
		fmt.Fprintf(log, "vm: kernel %s has no module %s (skipped)\n", assets.KernelVersion, strings.Join(img.Missing, ", "))
	}
	run, err := RunArchive(args, files)
	if err != nil {
		return nil, nil, err
	}
	work, err := os.MkdirTemp("", "kpsim-vm-")
	if err != nil {
		return nil, nil, fmt.Errorf("could not create a work directory: %w", err)
	}
	defer os.RemoveAll(work)
	share := filepath.Join(work, "results")
	if err := os.Mkdir(share, 0o777); err != nil {
		return nil, nil, fmt.Errorf("could not create the results share: %w", err)
	}
	initrd := filepath.Join(work, "initrd")
	if err := concat(initrd, img.Path, run); err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(log, "vm: image ready in %.1f s (%s, %.1f MB, cached %v); booting %s\n",
		time.Since(t0).Seconds(), filepath.Base(img.Path), float64(img.Size)/1e6, img.Cached, assets.KernelVersion)
	res, err := Boot(ctx, BootOptions{Kernel: assets.Kernel, Initrd: initrd, Share: share, MemoryMB: o.MemoryMB, CPUs: o.CPUs,
		Timeout: o.Timeout, BootTimeout: o.BootTimeout, Console: prefixWriter(log, "vm| "), Log: log, KVMVerdict: filepath.Join(dir, "kvm-stuck")})
	if res != nil && res.Ready > 0 {
		fmt.Fprintf(log, "vm: %s, ready %.2f s after start (guest uptime %.2f s), run %.1f s, exit %d\n",
			res.Accel, res.Ready.Seconds(), res.GuestUptimeReady, res.Wall.Seconds(), res.ExitCode)
	}
	if err != nil {
		return res, nil, err
	}
	out := map[string][]byte{}
	for k, v := range res.Files {
		out[k] = v
	}
	// Result files by their slash-separated path under the share: sim
	// conform --dump writes a folder tree.
	_ = filepath.WalkDir(share, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		rel, rerr := filepath.Rel(share, p)
		if b, err := os.ReadFile(p); err == nil && rerr == nil {
			out[filepath.ToSlash(rel)] = b
		}
		return nil
	})
	return res, out, nil
}

func lookQEMU() (string, error) {
	if p, err := exec.LookPath(QEMU); err == nil {
		return p, nil
	}
	return "", &MissingError{Package: PackageQEMU, Err: fmt.Errorf("%s is not installed", QEMU)}
}

func concat(dst, base string, tail []byte) error {
	b, err := os.ReadFile(base)
	if err != nil {
		return fmt.Errorf("could not read the image: %w", err)
	}
	if err := os.WriteFile(dst, append(b, tail...), 0o644); err != nil {
		return fmt.Errorf("could not write the initrd: %w", err)
	}
	return nil
}

// prefixWriter writes each line with a prefix.
func prefixWriter(w io.Writer, prefix string) io.Writer {
	if w == io.Discard {
		return nil
	}
	return &prefixed{w: w, prefix: prefix}
}

type prefixed struct {
	w      io.Writer
	prefix string
}

func (p *prefixed) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if _, err := io.WriteString(p.w, p.prefix+line); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}
