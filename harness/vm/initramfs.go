package vm

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// initScript is the VM's /init, run by busybox sh as PID 1. It mounts the
// kernel filesystems, loads the modules in the order resolved on the host,
// lifts two global limits of the VM's own root namespace (it is not the
// host's) and the network buffers, mounts the results share, runs sim with the arguments of
// /kpsim/args and reports on the serial console between markers:
//
//	KPSIM-BOOTED <uptime>        init started
//	KPSIM-READY <uptime> share=  modules loaded, share mounted or not
//	KPSIM-BEGIN <file> ... KPSIM-END   a result file in base64, when the
//	                             9p share could not be mounted
//	KPSIM-EXIT <code>            sim's exit code (on the console and again
//	                             through /dev/kmsg: the panic flushes that)
//
// Then init exits: the kernel panics (panic=-1 reboots at once) and qemu,
// started with -no-reboot, exits.
const initScript = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /run /tmp /results /root
/bin/busybox --install -s /bin
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs tmpfs /tmp
echo "KPSIM-BOOTED $(cut -d' ' -f1 /proc/uptime)"
release=$(uname -r)
while read -r path params; do
	[ -n "$path" ] || continue
	insmod "/lib/modules/$release/$path" $params 2>/tmp/insmod.err || echo "KPSIM-WARN insmod $path: $(cat /tmp/insmod.err)"
done < /etc/kpsim/modules
# The VM's own root namespace: a conformance phase opens far more
# connections than a 1 GB guest's default conntrack table holds, and every
# rejected probe needs its ICMP error (the global ICMP rate limit is not
# per namespace on this kernel).
echo 2097152 > /proc/sys/net/netfilter/nf_conntrack_max
echo 1000000 > /proc/sys/net/ipv4/icmp_msgs_per_sec
echo 1000000 > /proc/sys/net/ipv4/icmp_msgs_burst
# Software emulation is slow: let bursts of probes queue instead of being
# dropped (per-CPU backlog of veth, raw socket receive buffers, and the
# send buffer of the kernel's TCP control socket, which every RST a backend
# answers a probe with is charged to until it is consumed downstream).
echo 1000000 > /proc/sys/net/core/netdev_max_backlog
echo 67108864 > /proc/sys/net/core/rmem_max
echo 67108864 > /proc/sys/net/core/wmem_max
echo 33554432 > /proc/sys/net/core/wmem_default
# Packets to a neighbour still being resolved wait in a queue of 200 KB by
# default; under emulation a burst overflows it before the ARP reply comes
# back. Devices of every namespace made later copy these defaults.
echo 33554432 > /proc/sys/net/ipv4/neigh/default/unres_qlen_bytes
ip link set lo up
share=no
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /results 2>/dev/null; then share=yes; fi
echo "KPSIM-READY $(cut -d' ' -f1 /proc/uptime) share=$share"
set --
while IFS= read -r a; do set -- "$@" "$a"; done < /kpsim/args
cd /kpsim
# kpsim.scale= (set by the host under software emulation) stretches the
# harness's waits for packets still in flight.
scale=$(sed -n 's/.*kpsim.scale=\([0-9]*\).*/\1/p' /proc/cmdline)
KPSIM_IN_VM=1 KPSIM_TIME_SCALE=${scale:-1} sim "$@"
rc=$?
if [ "$share" = no ]; then
	# Every file, in folders too (sim conform --dump): named by its path
	# under /results.
	find /results -type f | while IFS= read -r f; do
		echo "KPSIM-BEGIN ${f#/results/}"
		base64 "$f"
		echo "KPSIM-END"
	done
fi
sync
echo "KPSIM-EXIT $rc"
# The last bytes written to the console can still sit in the tty's buffer
# when init exits and the panic reboots (seen under TCG: the table printed,
# the exit line lost): say it through the kernel log as well, which printk
# writes to the serial console itself and the panic flushes. A critical
# level, so that no console loglevel hides it.
echo "<2>KPSIM-EXIT $rc" > /dev/kmsg
exit 0
`

// modprobeStub answers every modprobe with success: the modules are loaded
// by init, and github.com/moby/ipvs runs `modprobe ip_vs` once.
const modprobeStub = "#!/bin/sh\nexit 0\n"

// Tool is a host command copied into the VM.
type Tool struct {
	Name     string
	Package  string
	Required bool
}

// Tools are the commands the dataplanes and the harness run inside the VM,
// copied from the host with their shared libraries (and the iptables
// extensions they load): simpler and faster than installing a userland, and
// the same versions as the host's namespace tier.
var Tools = []Tool{
	{"iptables-nft", "iptables", true}, {"iptables-nft-restore", "iptables", true}, {"iptables-nft-save", "iptables", true},
	{"iptables-legacy", "iptables", true}, {"iptables-legacy-restore", "iptables", true}, {"iptables-legacy-save", "iptables", true},
	{"ipset", "ipset", true},
	{"conntrack", "conntrack", false}, {"nft", "nftables", false}, {"ip", "iproute2", false}, {"ipvsadm", "ipvsadm", false},
}

// xtablesDir holds the iptables extensions, which the tools dlopen.
const xtablesDir = "/usr/lib/x86_64-linux-gnu/xtables"

// hostFiles lists the host files a tool set needs: each tool's real file and
// its PATH name (as a symlink when they differ), the xtables extensions, and
// every shared library. Missing required tools are an error naming their
// Debian packages.
type hostFiles struct {
	files []string          // copied at the same path
	links map[string]string // path -> target
}

func collectTools(tools []Tool, extra ...string) (*hostFiles, error) {
	hf := &hostFiles{links: map[string]string{}}
	var missing []string
	var elfs []string
	for _, t := range tools {
		p, err := exec.LookPath(t.Name)
		if err != nil {
			if t.Required {
				missing = append(missing, fmt.Sprintf("%s (Debian package %s)", t.Name, t.Package))
			}
			continue
		}
		p, _ = filepath.Abs(p)
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("could not resolve %s: %w", p, err)
		}
		if !slices.Contains(hf.files, real) {
			hf.files = append(hf.files, real)
			elfs = append(elfs, real)
		}
		if real != p {
			hf.links[p] = real
		}
	}
	if len(missing) > 0 {
		return nil, &MissingError{Package: "iptables ipset", Err: fmt.Errorf("missing commands for the VM: %s", strings.Join(missing, ", "))}
	}
	plugins, _ := filepath.Glob(filepath.Join(xtablesDir, "*.so"))
	hf.files = append(hf.files, plugins...)
	elfs = append(elfs, plugins...)
	for _, e := range extra {
		hf.files = append(hf.files, e)
		if static, err := IsStatic(e); err == nil && !static {
			elfs = append(elfs, e)
		}
	}
	libs, err := SharedDeps(elfs...)
	if err != nil {
		return nil, err
	}
	for _, l := range libs {
		if !slices.Contains(hf.files, l) {
			hf.files = append(hf.files, l)
		}
	}
	for _, etc := range []string{"/etc/protocols", "/etc/services", "/etc/ethertypes"} {
		if _, err := os.Stat(etc); err == nil {
			hf.files = append(hf.files, etc)
		}
	}
	slices.Sort(hf.files)
	return hf, nil
}

// Image is a built initramfs.
type Image struct {
	Path    string
	Modules []Module
	// Missing lists wanted modules the kernel does not have.
	Missing []string
	Cached  bool
	Size    int64
}

// simPath is where the sim binary goes in the VM.
const simPath = "/usr/local/bin/sim"

// BuildImage builds (or finds in the cache) the base initramfs: busybox,
// /init, the modules and their dependencies, the host tools with their
// libraries, and the sim binary (with its libraries when it is not
// static). The image is named by a hash of its inputs (paths, sizes and
// modification times), so a rebuilt sim or a new kernel makes a new one.
func BuildImage(a *Assets, sim string, log io.Writer) (*Image, error) {
	if log == nil {
		log = io.Discard
	}
	in, err := imageInputsFor(a, sim, log)
	if err != nil {
		return nil, err
	}
	sum, err := in.hash(a)
	if err != nil {
		return nil, err
	}
	imgDir := filepath.Join(a.Dir, "images")
	path := filepath.Join(imgDir, "base-"+a.KernelVersion+"-"+sum+".cpio.gz")
	img := &Image{Path: path, Modules: in.mods, Missing: in.missing}
	if st, err := os.Stat(path); err == nil {
		img.Cached, img.Size = true, st.Size()
		return img, nil
	}
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return nil, fmt.Errorf("could not create %s: %w", imgDir, err)
	}
	if err := in.write(a, imgDir, path); err != nil {
		return nil, err
	}
	pruneImages(imgDir, path)
	st, _ := os.Stat(path)
	img.Size = st.Size()
	fmt.Fprintf(log, "vm: built %s (%.1f MB, %d modules)\n", filepath.Base(path), float64(img.Size)/1e6, len(in.mods))
	return img, nil
}

// imageInputs is what goes into a base image: the kernel modules to load
// (in order, with the list /init reads), the host tools with their
// libraries and links, and the sim binary with its libraries.
type imageInputs struct {
	mods    []Module
	missing []string
	hf      *hostFiles
	sim     string
	simLibs []string
	modList string
}

// imageInputsFor resolves the modules (a missing required one is a
// MissingError for the kernel package), the host tools and sim's
// libraries when it is not static.
func imageInputsFor(a *Assets, sim string, log io.Writer) (*imageInputs, error) {
	idx, err := indexModules(a.Modules)
	if err != nil {
		return nil, err
	}
	in := &imageInputs{sim: sim}
	in.mods, in.missing, err = idx.Resolve(Wanted, Required)
	if err != nil {
		return nil, &MissingError{Package: PackageKernel, Err: err}
	}
	if in.hf, err = collectTools(Tools); err != nil {
		return nil, err
	}
	simStatic, err := IsStatic(sim)
	if err != nil {
		return nil, err
	}
	if !simStatic {
		fmt.Fprintf(log, "vm: %s is dynamically linked; copying its libraries (build it with CGO_ENABLED=0 for a static one)\n", sim)
		if in.simLibs, err = SharedDeps(sim); err != nil {
			return nil, err
		}
	}
	var modList strings.Builder
	for _, m := range in.mods {
		fmt.Fprintf(&modList, "%s %s\n", m.Path, m.Params)
	}
	in.modList = modList.String()
	return in, nil
}

// hash names the image: a hash of the init script, the module list, and
// the path, size and modification time of every file that goes in.
func (in *imageInputs) hash(a *Assets) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "v1\n%s\n%s\n%s\n", initScript, modprobeStub, in.modList)
	stamp := func(p string) error {
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("could not read %s: %w", p, err)
		}
		fmt.Fprintf(h, "%s %d %d\n", p, st.Size(), st.ModTime().UnixNano())
		return nil
	}
	all := append(append(slices.Clone(in.hf.files), in.simLibs...), a.Busybox, in.sim)
	for _, p := range all {
		if err := stamp(p); err != nil {
			return "", err
		}
	}
	for _, m := range in.mods {
		if err := stamp(filepath.Join(a.Modules, m.Path)); err != nil {
			return "", err
		}
	}
	for _, l := range slices.Sorted(maps.Keys(in.hf.links)) {
		fmt.Fprintf(h, "link %s %s\n", l, in.hf.links[l])
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// write builds the image in a temporary file in imgDir, pads it to 512
// bytes and renames it to path, so that a half-written image is never
// found in the cache.
func (in *imageInputs) write(a *Assets, imgDir, path string) error {
	tmp, err := os.CreateTemp(imgDir, "build-*.tmp")
	if err != nil {
		return fmt.Errorf("could not create the image: %w", err)
	}
	defer os.Remove(tmp.Name())
	zw, _ := gzip.NewWriterLevel(tmp, gzip.BestSpeed)
	w := NewCPIOWriter(zw)
	if err := in.archive(a, w); err != nil {
		tmp.Close()
		return fmt.Errorf("could not build the image: %w", err)
	}
	err = errors.Join(w.Close(), zw.Close())
	if err == nil {
		// Pad so that the per-run archive appended after it starts aligned
		// (the kernel skips zero bytes between archives).
		st, _ := tmp.Stat()
		if pad := (512 - st.Size()%512) % 512; pad > 0 {
			_, err = tmp.Write(make([]byte, pad))
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("could not write the image: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("could not move the image into place: %w", err)
	}
	return nil
}

// archive writes the image's entries: busybox, /init, the modprobe stub,
// the module list and sim first, then the host files, their links and the
// modules, each path once.
func (in *imageInputs) archive(a *Assets, w *CPIOWriter) error {
	add := func(dst, src string, perm uint32) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("could not read %s: %w", src, err)
		}
		if perm == 0 {
			st, _ := os.Stat(src)
			perm = uint32(st.Mode().Perm())
		}
		return w.File(dst, perm, b)
	}
	steps := []func() error{
		func() error { return w.Dir("/bin", 0o755) },
		func() error { return add("/bin/busybox", a.Busybox, 0o755) },
		func() error { return w.File("/init", 0o755, []byte(initScript)) },
		func() error { return w.File("/sbin/modprobe", 0o755, []byte(modprobeStub)) },
		func() error { return w.File("/etc/kpsim/modules", 0o644, []byte(in.modList)) },
		func() error { return add(simPath, in.sim, 0o755) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	for _, p := range append(slices.Clone(in.hf.files), in.simLibs...) {
		if w.Has(p) {
			continue
		}
		if err := add(p, p, 0); err != nil {
			return err
		}
	}
	for _, l := range slices.Sorted(maps.Keys(in.hf.links)) {
		if w.Has(l) {
			continue
		}
		if err := w.Symlink(l, in.hf.links[l]); err != nil {
			return err
		}
	}
	for _, m := range in.mods {
		if err := add(filepath.Join("/lib/modules", a.KernelVersion, m.Path), filepath.Join(a.Modules, m.Path), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// pruneImages keeps the newest three base images.
func pruneImages(dir, keep string) {
	ents, _ := filepath.Glob(filepath.Join(dir, "base-*.cpio.gz"))
	type aged struct {
		p string
		t int64
	}
	var l []aged
	for _, e := range ents {
		if st, err := os.Stat(e); err == nil && e != keep {
			l = append(l, aged{e, st.ModTime().UnixNano()})
		}
	}
	slices.SortFunc(l, func(a, b aged) int { return int(b.t - a.t) })
	for i, e := range l {
		if i >= 2 {
			_ = os.Remove(e.p)
		}
	}
}

// RunArchive builds the small per-run archive appended to the base image:
// the command line (one argument per line in /kpsim/args) and the given
// files at their VM paths.
func RunArchive(args []string, files map[string][]byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	w := NewCPIOWriter(zw)
	for _, a := range args {
		if strings.ContainsAny(a, "\n") {
			return nil, fmt.Errorf("argument %q holds a newline", a)
		}
	}
	if err := w.File("/kpsim/args", 0o644, []byte(strings.Join(args, "\n")+"\n")); err != nil {
		return nil, err
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		if err := w.File(p, 0o644, files[p]); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(w.Close(), zw.Close()); err != nil {
		return nil, fmt.Errorf("could not build the run archive: %w", err)
	}
	return buf.Bytes(), nil
}
