package vm

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// entry is one parsed newc record.
type entry struct {
	name string
	mode uint32
	data string
}

// readCPIO parses a newc archive the way the kernel's initramfs unpacker
// does (header, name, padding to 4, data, padding to 4) up to the trailer.
func readCPIO(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	off := 0
	field := func(h []byte, i int) uint32 {
		v, err := strconv.ParseUint(string(h[6+8*i:6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("bad header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	for {
		if off+110 > len(b) {
			t.Fatalf("truncated archive at %d", off)
		}
		h := b[off : off+110]
		if string(h[:6]) != "070701" {
			t.Fatalf("bad magic %q at %d", h[:6], off)
		}
		mode, size, namesize := field(h, 1), int(field(h, 6)), int(field(h, 11))
		name := string(b[off+110 : off+110+namesize-1])
		off += 110 + namesize
		off += pad4(off)
		data := string(b[off : off+size])
		off += size
		off += pad4(off)
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, entry{name, mode, data})
	}
}

func TestCPIOWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewCPIOWriter(&buf)
	if err := w.File("/usr/local/bin/sim", 0o755, []byte("binary")); err != nil {
		t.Fatal(err)
	}
	if err := w.Symlink("/usr/sbin/iptables-nft", "/usr/sbin/xtables-nft-multi"); err != nil {
		t.Fatal(err)
	}
	if err := w.Dir("/run", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.File("init", 0o755, []byte("#!/bin/sh\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.File("/init", 0o755, nil); !errors.Is(err, ErrDuplicate) {
		t.Errorf("duplicate path: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4", buf.Len())
	}
	got := readCPIO(t, buf.Bytes())
	var names []string
	for _, e := range got {
		names = append(names, fmt.Sprintf("%s %o %q", e.name, e.mode, e.data))
	}
	want := []string{
		`usr 40755 ""`, `usr/local 40755 ""`, `usr/local/bin 40755 ""`, `usr/local/bin/sim 100755 "binary"`,
		`usr/sbin 40755 ""`, `usr/sbin/iptables-nft 120777 "/usr/sbin/xtables-nft-multi"`,
		`run 40755 ""`, `init 100755 "#!/bin/sh\n"`,
	}
	if !slices.Equal(names, want) {
		t.Errorf("entries:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
}

func TestRunArchive(t *testing.T) {
	b, err := RunArchive([]string{"conform", "/kpsim/scenarios/0/a.yaml", "--mode", "ipvs"}, map[string][]byte{"/kpsim/scenarios/0/a.yaml": []byte("x: 1\n")})
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(zr)
	got := map[string]string{}
	for _, e := range readCPIO(t, raw) {
		got[e.name] = e.data
	}
	if got["kpsim/args"] != "conform\n/kpsim/scenarios/0/a.yaml\n--mode\nipvs\n" || got["kpsim/scenarios/0/a.yaml"] != "x: 1\n" {
		t.Errorf("archive %q", got)
	}
	if _, err := RunArchive([]string{"a\nb"}, nil); err == nil {
		t.Error("an argument with a newline was accepted")
	}
}

// TestResolveModules orders dependencies first, once each, skips built-in
// modules and reports missing ones, and fails on a missing required one.
func TestResolveModules(t *testing.T) {
	deps := map[string][]string{
		"ip_vs":        {"nf_conntrack", "libcrc32c", "nf_defrag_ipv6"},
		"nf_conntrack": {"nf_defrag_ipv4", "nf_defrag_ipv6", "libcrc32c"},
		"ip_vs_rr":     {"ip_vs"},
		"libcrc32c":    nil, "crc32c_generic": nil, "nf_defrag_ipv4": nil, "nf_defrag_ipv6": nil, "dummy": nil,
	}
	idx := &moduleIndex{files: map[string]string{}, builtin: map[string]bool{"virtio_pci": true}, dependsFn: func(n string) ([]string, error) { return deps[n], nil }}
	for n := range deps {
		idx.files[n] = "kernel/" + n + ".ko"
	}
	order, missing, err := idx.Resolve([]Module{{Name: "crc32c-generic"}, {Name: "ip_vs_rr"}, {Name: "ip_vs", Params: "conn_tab_bits=18"}, {Name: "virtio_pci"}, {Name: "nft_fib"}, {Name: "dummy"}}, []string{"ip_vs"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range order {
		names = append(names, m.Name+"("+m.Params+")")
	}
	want := []string{"crc32c_generic()", "nf_defrag_ipv4()", "nf_defrag_ipv6()", "libcrc32c()", "nf_conntrack()", "ip_vs(conn_tab_bits=18)", "ip_vs_rr()", "dummy()"}
	if !slices.Equal(names, want) {
		t.Errorf("order %v, want %v", names, want)
	}
	if !slices.Equal(missing, []string{"nft_fib"}) {
		t.Errorf("missing %v", missing)
	}
	if _, _, err := idx.Resolve([]Module{{Name: "veth"}}, []string{"veth"}); err == nil {
		t.Error("a missing required module was accepted")
	}
}

// TestWantedModulesResolveOnTheCachedKernel runs the real resolution on the
// kernel in the cache when there is one (make test-vm fetches it; the VM
// tier then loads these modules); without one it only logs, since the
// pure tests above cover the logic and `make test` fails on any skip.
func TestWantedModulesResolveOnTheCachedKernel(t *testing.T) {
	dir, err := CacheDir()
	if err != nil {
		t.Log(err)
		return
	}
	k := newestCached(dir, "kernel-")
	if k == "" {
		t.Log("no kernel in the cache yet (make test-vm fetches one): nothing to resolve")
		return
	}
	ver := strings.TrimPrefix(filepath.Base(k), "kernel-")
	idx, err := indexModules(filepath.Join(k, "lib", "modules", ver))
	if err != nil {
		t.Fatal(err)
	}
	order, _, err := idx.Resolve(Wanted, Required)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range order {
		pos[m.Name] = i
	}
	if pos["crc32c_generic"] != 0 {
		t.Errorf("crc32c_generic is not loaded first: %v", order[:3])
	}
	for _, m := range order {
		deps, _ := idx.depends(m.Name)
		for _, d := range deps {
			if p, ok := pos[d]; ok && p > pos[m.Name] {
				t.Errorf("%s is loaded before its dependency %s", m.Name, d)
			}
		}
	}
}

func TestConsole(t *testing.T) {
	res := &Result{ExitCode: -1, Files: map[string][]byte{}}
	c := &console{res: res}
	payload := base64.StdEncoding.EncodeToString([]byte(`{"mode":"ipvs"}`))
	var events []string
	for _, l := range []string{
		"\x1bc\x1b[?7l\x1b[2JKPSIM-BOOTED 4.88",
		"[    5.091379] IPVS: Registered protocols",
		"KPSIM-READY 6.89 share=no",
		"conform: distribution",
		"KPSIM-BEGIN run.json", payload[:8], payload[8:], "KPSIM-END",
		"KPSIM-EXIT 1",
	} {
		if ev, _ := c.feed(l); ev != "" {
			events = append(events, ev)
		}
	}
	if !slices.Equal(events, []string{"KPSIM-BOOTED", "KPSIM-READY", "KPSIM-BEGIN", "KPSIM-EXIT"}) {
		t.Errorf("events %v", events)
	}
	if res.ExitCode != 1 || res.Share || res.GuestUptimeReady != 6.89 || string(res.Files["run.json"]) != `{"mode":"ipvs"}` || c.err != nil {
		t.Errorf("result %+v, err %v", res, c.err)
	}
	for _, l := range c.tail {
		if strings.Contains(l, payload[:8]) {
			t.Error("file contents kept in the console tail")
		}
	}
}

func TestQEMUArgs(t *testing.T) {
	o := BootOptions{Kernel: "/k", Initrd: "/i", Share: "/s"}
	for accel, want := range map[string][]string{
		"kvm": {"-m 1024", "-smp 2", "-accel kvm -accel tcg", "-nographic", "-no-reboot", "-nic none", "panic=-1", "kpsim.scale=1", "mount_tag=results,security_model=none"},
		"tcg": {"-accel tcg -cpu max", "kpsim.scale=4"},
	} {
		args := strings.Join(o.Args(accel), " ")
		for _, w := range want {
			if !strings.Contains(args, w) {
				t.Errorf("%s: %q lacks %q", accel, args, w)
			}
		}
	}
}

func TestKVMVerdict(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kvm-stuck")
	if _, ok := kvmFailedBefore(p); ok {
		t.Fatal("no verdict yet")
	}
	if _, ok := kvmFailedBefore(""); ok {
		t.Fatal("no verdict file")
	}
	if err := os.WriteFile(p, []byte(hostRelease()+"\tqemu: signal: aborted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if why, ok := kvmFailedBefore(p); !ok || why != "qemu: signal: aborted" {
		t.Errorf("the verdict for this kernel: %q, %v", why, ok)
	}
	// A verdict written before reasons were recorded still counts.
	if err := os.WriteFile(p, []byte(hostRelease()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := kvmFailedBefore(p); !ok {
		t.Error("a verdict without a reason is ignored")
	}
	if err := os.WriteFile(p, []byte("1.0.0-other\tqemu: signal: aborted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := kvmFailedBefore(p); ok {
		t.Error("a verdict for another host kernel is applied")
	}
}

func TestSharedDeps(t *testing.T) {
	sh := "/bin/sh"
	if static, err := IsStatic(sh); err != nil || static {
		t.Fatalf("%s is not a dynamic ELF here (%v)", sh, err)
	}
	deps, err := SharedDeps(sh)
	if err != nil {
		t.Fatal(err)
	}
	hasLibc := slices.ContainsFunc(deps, func(p string) bool { return strings.HasSuffix(p, "/libc.so.6") })
	in, _ := Interpreter(sh)
	if !hasLibc || !slices.Contains(deps, in) {
		t.Errorf("deps of %s: %v (interpreter %s)", sh, deps, in)
	}
}

func TestMissingErrorNamesPackage(t *testing.T) {
	err := error(&MissingError{Package: PackageQEMU, Err: errors.New("qemu-system-x86_64 is not installed")})
	if !strings.Contains(err.Error(), "qemu-system-x86") {
		t.Errorf("%v", err)
	}
	var me *MissingError
	if !errors.As(fmt.Errorf("wrapped: %w", err), &me) || me.Package != PackageQEMU {
		t.Error("MissingError does not unwrap")
	}
}
