package vm

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Module is one kernel module to load in the VM, with its parameters.
type Module struct {
	Name string
	// Path is the .ko file, relative to the modules directory.
	Path   string
	Params string
}

// Wanted lists the modules the VM loads, by name, with parameters. Order
// matters only where stated; dependencies are added before each module.
//
//   - crc32c_generic first: libcrc32c (needed by nf_conntrack and IPVS)
//     only soft-depends on a crc32c implementation, which busybox insmod
//     does not follow.
//   - nf_conntrack with a large hash, ip_vs with a 2^18-bucket connection
//     table: a conformance phase opens hundreds of thousands of
//     connections.
//   - the IPVS schedulers, netfilter (legacy iptables, nftables with the
//     compat layer for iptables-nft), ipset types, the matches and
//     targets the rules use, dummy/veth/bridge for the topology, and 9p
//     over virtio for the results share.
var Wanted = []Module{
	{Name: "crc32c_generic"},
	{Name: "libcrc32c"},
	{Name: "nf_conntrack", Params: "hashsize=262144"},
	{Name: "nf_nat"},
	{Name: "nf_conntrack_netlink"},
	{Name: "ip_vs", Params: "conn_tab_bits=18"},
	{Name: "ip_vs_rr"}, {Name: "ip_vs_wrr"}, {Name: "ip_vs_lc"}, {Name: "ip_vs_wlc"}, {Name: "ip_vs_sed"},
	{Name: "ip_vs_nq"}, {Name: "ip_vs_sh"}, {Name: "ip_vs_dh"}, {Name: "ip_vs_mh"},
	{Name: "x_tables"}, {Name: "ip_tables"}, {Name: "iptable_filter"}, {Name: "iptable_nat"}, {Name: "iptable_mangle"}, {Name: "iptable_raw"},
	{Name: "ip_set"}, {Name: "ip_set_hash_ip"}, {Name: "ip_set_hash_ipport"}, {Name: "ip_set_hash_ipportip"},
	{Name: "ip_set_hash_ipportnet"}, {Name: "ip_set_hash_net"}, {Name: "ip_set_bitmap_port"}, {Name: "xt_set"},
	{Name: "xt_comment"}, {Name: "xt_mark"}, {Name: "xt_MASQUERADE"}, {Name: "xt_addrtype"}, {Name: "xt_conntrack"},
	{Name: "xt_statistic"}, {Name: "xt_recent"}, {Name: "xt_nat"}, {Name: "xt_tcpudp"}, {Name: "xt_multiport"},
	{Name: "xt_ipvs"}, {Name: "xt_physdev"}, {Name: "ipt_REJECT"}, {Name: "nf_reject_ipv4"}, {Name: "xt_cluster"},
	{Name: "nf_tables"}, {Name: "nft_compat"}, {Name: "nft_chain_nat"}, {Name: "nft_ct"}, {Name: "nft_nat"},
	{Name: "nft_masq"}, {Name: "nft_numgen"}, {Name: "nft_reject"}, {Name: "nft_reject_inet"}, {Name: "nft_reject_ipv4"},
	{Name: "nft_fib"}, {Name: "nft_fib_ipv4"}, {Name: "nft_fib_inet"}, {Name: "nft_hash"}, {Name: "nft_limit"},
	{Name: "nft_redir"}, {Name: "nft_quota"}, {Name: "nft_objref"},
	{Name: "dummy"}, {Name: "veth"}, {Name: "bridge"},
	{Name: "virtio_pci"}, {Name: "9pnet_virtio"}, {Name: "9p"},
}

// Required are the modules without which no conformance run can work.
var Required = []string{"ip_vs", "nf_conntrack", "nf_nat", "dummy", "veth", "bridge", "ip_set", "x_tables"}

// moduleIndex knows the .ko files of a kernel's module tree by module name.
type moduleIndex struct {
	dir     string
	files   map[string]string // name -> path relative to dir
	builtin map[string]bool
	// dependsFn replaces reading .modinfo (tests).
	dependsFn func(name string) ([]string, error)
}

// modName normalises a module name: '-' and '_' are the same to the kernel.
func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// indexModules walks lib/modules/<version> of an extracted kernel package.
// The Debian package ships no modules.dep (depmod writes it at install),
// so dependencies come from each module's .modinfo "depends=" field.
func indexModules(dir string) (*moduleIndex, error) {
	idx := &moduleIndex{dir: dir, files: map[string]string{}, builtin: map[string]bool{}}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			rel, _ := filepath.Rel(dir, p)
			idx.files[modName(strings.TrimSuffix(d.Name(), ".ko"))] = rel
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("could not index the kernel modules in %s: %w", dir, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if line != "" {
				idx.builtin[modName(strings.TrimSuffix(filepath.Base(line), ".ko"))] = true
			}
		}
	}
	return idx, nil
}

// depends reads a module's "depends=" from its .modinfo section.
func (idx *moduleIndex) depends(name string) ([]string, error) {
	if idx.dependsFn != nil {
		return idx.dependsFn(name)
	}
	f, err := elf.Open(filepath.Join(idx.dir, idx.files[name]))
	if err != nil {
		return nil, fmt.Errorf("could not read module %s: %w", name, err)
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, nil
	}
	data, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf("could not read the .modinfo of %s: %w", name, err)
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var out []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					out = append(out, modName(d))
				}
			}
			return out, nil
		}
	}
	return nil, nil
}

// Resolve orders the wanted modules with their dependencies first, each
// once. Built-in modules are skipped; a module missing from the tree is
// skipped and reported, unless it is required (an error).
func (idx *moduleIndex) Resolve(wanted []Module, required []string) (order []Module, missing []string, err error) {
	params := map[string]string{}
	for _, m := range wanted {
		params[modName(m.Name)] = m.Params
	}
	done := map[string]bool{}
	var visit func(name string, stack []string) error
	visit = func(name string, stack []string) error {
		if done[name] || idx.builtin[name] {
			return nil
		}
		for _, s := range stack {
			if s == name {
				return fmt.Errorf("module dependency cycle: %s", strings.Join(append(stack, name), " -> "))
			}
		}
		if _, ok := idx.files[name]; !ok {
			missing = append(missing, name)
			done[name] = true
			return nil
		}
		deps, err := idx.depends(name)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, append(stack, name)); err != nil {
				return err
			}
		}
		done[name] = true
		order = append(order, Module{Name: name, Path: idx.files[name], Params: params[name]})
		return nil
	}
	for _, m := range wanted {
		if err := visit(modName(m.Name), nil); err != nil {
			return nil, nil, err
		}
	}
	for _, r := range required {
		for _, m := range missing {
			if m == modName(r) {
				return nil, missing, fmt.Errorf("the kernel has no module %s", r)
			}
		}
	}
	return order, missing, nil
}
