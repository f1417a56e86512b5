package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Debian packages the VM needs. Only qemu is installed on the host; the
// kernel and busybox are downloaded with `apt-get download` and unpacked
// with `dpkg-deb -x` into the cache, touching nothing else.
const (
	PackageKernel  = "linux-image-amd64"
	PackageBusybox = "busybox-static"
	PackageQEMU    = "qemu-system-x86"
)

// MissingError names a Debian package that is needed and could be neither
// found nor fetched.
type MissingError struct {
	Package string
	Err     error
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("%v (Debian package %s; `make test-vm` installs and fetches it)", e.Err, e.Package)
}

func (e *MissingError) Unwrap() error { return e.Err }

// CacheDir is where the kernel, busybox and built images are kept:
// $KPSIM_VM_CACHE, else $XDG_CACHE_HOME/kpsim/vm, else ~/.cache/kpsim/vm.
func CacheDir() (string, error) {
	if d := os.Getenv("KPSIM_VM_CACHE"); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "kpsim", "vm"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("could not find a cache directory (set KPSIM_VM_CACHE): %w", err)
	}
	return filepath.Join(home, ".cache", "kpsim", "vm"), nil
}

// Assets are the unpacked kernel and busybox.
type Assets struct {
	Dir string
	// KernelVersion is the release, e.g. "6.1.0-57-amd64".
	KernelVersion string
	// Kernel is the vmlinuz image.
	Kernel string
	// Modules is lib/modules/<version>.
	Modules string
	// Busybox is the static busybox binary.
	Busybox string
}

const completeMarker = ".complete"

// Prepare finds the kernel and busybox in the cache dir and, when fetch is
// set, downloads what is missing (or out of date with apt's current
// kernel) with apt-get download. A package that is neither cached nor
// fetchable is a *MissingError.
func Prepare(ctx context.Context, dir string, fetch bool, log io.Writer) (*Assets, error) {
	if log == nil {
		log = io.Discard
	}
	a := &Assets{Dir: dir}
	pkg, perr := currentKernelPackage(ctx)
	var kdir string
	if perr == nil {
		kdir = filepath.Join(dir, "kernel-"+strings.TrimPrefix(pkg, "linux-image-"))
		if !complete(kdir) {
			if !fetch {
				perr = errors.New("not fetched")
			} else if err := download(ctx, dir, pkg, kdir, log); err != nil {
				perr = err
			}
		}
	}
	if perr != nil || !complete(kdir) {
		// Fall back to any kernel already cached.
		kdir = newestCached(dir, "kernel-")
		if kdir == "" {
			return nil, &MissingError{Package: PackageKernel, Err: fmt.Errorf("no Debian kernel in %s and none could be fetched: %v", dir, perr)}
		}
		fmt.Fprintf(log, "vm: using the cached kernel %s (%v)\n", filepath.Base(kdir), perr)
	}
	a.KernelVersion = strings.TrimPrefix(filepath.Base(kdir), "kernel-")
	a.Kernel = filepath.Join(kdir, "boot", "vmlinuz-"+a.KernelVersion)
	a.Modules = filepath.Join(kdir, "lib", "modules", a.KernelVersion)
	for _, p := range []string{a.Kernel, a.Modules} {
		if _, err := os.Stat(p); err != nil {
			return nil, &MissingError{Package: PackageKernel, Err: fmt.Errorf("the cached kernel is incomplete: %w", err)}
		}
	}
	bdir := filepath.Join(dir, "busybox")
	if !complete(bdir) {
		if !fetch {
			return nil, &MissingError{Package: PackageBusybox, Err: fmt.Errorf("busybox is not in %s", dir)}
		}
		if err := download(ctx, dir, PackageBusybox, bdir, log); err != nil {
			return nil, &MissingError{Package: PackageBusybox, Err: err}
		}
	}
	a.Busybox = filepath.Join(bdir, "bin", "busybox")
	if static, err := IsStatic(a.Busybox); err != nil || !static {
		return nil, &MissingError{Package: PackageBusybox, Err: fmt.Errorf("%s is not a static busybox: %v", a.Busybox, err)}
	}
	return a, nil
}

func complete(dir string) bool {
	if dir == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, completeMarker))
	return err == nil
}

func newestCached(dir, prefix string) string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), prefix) && complete(filepath.Join(dir, e.Name())) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	return filepath.Join(dir, names[len(names)-1])
}

// currentKernelPackage asks apt which versioned package linux-image-amd64
// depends on (e.g. linux-image-6.1.0-57-amd64).
func currentKernelPackage(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", PackageKernel).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %w", PackageKernel, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("apt-cache knows no dependency of %s (run apt-get update)", PackageKernel)
}

// download fetches a package with apt-get download into dir/debs and
// unpacks it with dpkg-deb -x into dest (atomically: a temporary directory
// renamed, then a completion marker).
func download(ctx context.Context, dir, pkg, dest string, log io.Writer) error {
	debs := filepath.Join(dir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return fmt.Errorf("could not create %s: %w", debs, err)
	}
	fmt.Fprintf(log, "vm: apt-get download %s\n", pkg)
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg)
	cmd.Dir = debs
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %w: %s", pkg, err, strings.TrimSpace(string(out)))
	}
	matches, _ := filepath.Glob(filepath.Join(debs, pkg+"_*.deb"))
	if len(matches) == 0 {
		return fmt.Errorf("apt-get download %s left no .deb in %s", pkg, debs)
	}
	sort.Strings(matches)
	deb := matches[len(matches)-1]
	tmp := dest + ".tmp"
	_ = os.RemoveAll(tmp)
	fmt.Fprintf(log, "vm: dpkg-deb -x %s\n", filepath.Base(deb))
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, tmp).CombinedOutput(); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("dpkg-deb -x %s: %w: %s", deb, err, strings.TrimSpace(string(out)))
	}
	_ = os.RemoveAll(dest)
	if err := os.Rename(tmp, dest); err != nil {
		return fmt.Errorf("could not move %s into place: %w", dest, err)
	}
	_ = os.Remove(deb) // the unpacked tree is what is kept
	return os.WriteFile(filepath.Join(dest, completeMarker), nil, 0o644)
}
