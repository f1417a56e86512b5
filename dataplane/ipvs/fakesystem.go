package ipvs

// FakeSystem is a behavioural model of what the backend does in a node
// namespace besides IPVS: links and their addresses, ipsets (`ipset
// restore`, `save`, `list -n`), the filter and nat tables (`iptables-restore
// --noflush` applied atomically, `iptables-save`) and sysctls. Like the
// tools, it refuses a rule that jumps to a missing chain or matches a
// missing set, a set that is destroyed while a rule uses it, and an entry
// added to a set that does not exist.

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/kpsim/kpsim/dataplane/restore"
)

type fakeChain struct {
	rules []string
}

type fakeTable struct {
	builtin []string
	chains  map[string]*fakeChain
	order   []string // user chains in creation order
}

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{builtin: t.builtin, chains: map[string]*fakeChain{}, order: slices.Clone(t.order)}
	for n, ch := range t.chains {
		c.chains[n] = &fakeChain{rules: slices.Clone(ch.rules)}
	}
	return c
}

type fakeSet struct {
	typ     string
	entries map[string]bool
}

// FakeSystem implements System in memory. It is safe for concurrent use.
type FakeSystem struct {
	mu      sync.Mutex
	links   map[string]map[netip.Addr]bool
	sysctls map[string]string
	sets    map[string]*fakeSet
	setOrd  []string
	tables  map[string]*fakeTable
	// IPVS, when set, provides the live totals of StatsPerCPU.
	IPVS *Fake
	// Release is the kernel release KernelRelease reports.
	Release string
	// Commands logs every command run, as "name arg...".
	Commands []string
	// Fail makes the next command with this name fail (then it is cleared).
	Fail map[string]error
}

var _ System = (*FakeSystem)(nil)

// NewFakeSystem returns a namespace with lo, the kernel's default IPVS
// sysctls, empty tables and no sets, on kernel 6.1.
func NewFakeSystem(ipvs *Fake) *FakeSystem {
	return &FakeSystem{
		links: map[string]map[netip.Addr]bool{"lo": {netip.MustParseAddr("127.0.0.1"): true}},
		sysctls: map[string]string{
			"net/ipv4/vs/conntrack": "0", "net/ipv4/vs/conn_reuse_mode": "1", "net/ipv4/vs/expire_nodest_conn": "0",
			"net/ipv4/vs/expire_quiescent_template": "0", "net/ipv4/ip_forward": "1",
		},
		sets: map[string]*fakeSet{},
		tables: map[string]*fakeTable{
			"filter": {builtin: []string{"INPUT", "FORWARD", "OUTPUT"}, chains: map[string]*fakeChain{"INPUT": {}, "FORWARD": {}, "OUTPUT": {}}},
			"nat":    {builtin: []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}, chains: map[string]*fakeChain{"PREROUTING": {}, "INPUT": {}, "OUTPUT": {}, "POSTROUTING": {}}},
		},
		IPVS:    ipvs,
		Release: "6.1.0-57-amd64",
		Fail:    map[string]error{},
	}
}

// EnsureDummy creates the link if missing.
func (f *FakeSystem) EnsureDummy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.links[name] == nil {
		f.links[name] = map[netip.Addr]bool{}
	}
	return nil
}

// DeleteLink removes the link if present.
func (f *FakeSystem) DeleteLink(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.links, name)
	return nil
}

// Addresses lists the link's addresses, sorted.
func (f *FakeSystem) Addresses(link string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[link]
	if l == nil {
		return nil, fmt.Errorf("could not find link %s: link not found", link)
	}
	out := slices.Collect(maps.Keys(l))
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// AddAddress adds an address to an existing link.
func (f *FakeSystem) AddAddress(link string, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[link]
	if l == nil {
		return fmt.Errorf("could not find link %s: link not found", link)
	}
	l[a] = true
	return nil
}

// DelAddress removes an address (absent is fine, as the backend treats
// EADDRNOTAVAIL).
func (f *FakeSystem) DelAddress(link string, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[link]
	if l == nil {
		return fmt.Errorf("could not find link %s: link not found", link)
	}
	delete(l, a)
	return nil
}

// Sysctl writes a sysctl.
func (f *FakeSystem) Sysctl(key, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sysctls[key] = value
	return nil
}

// ReadSysctl reads a sysctl.
func (f *FakeSystem) ReadSysctl(key string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.sysctls[key]
	if !ok {
		return "", fmt.Errorf("could not read %s: no such sysctl", key)
	}
	return v, nil
}

// Sysctls returns a copy of the sysctls.
func (f *FakeSystem) Sysctls() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.sysctls)
}

// StatsPerCPU prints the live totals of IPVS as the kernel's
// /proc/net/ip_vs_stats_percpu does, all on CPU 0.
func (f *FakeSystem) StatsPerCPU() (string, error) {
	if f.IPVS == nil {
		return "", errors.New("no ipvs table")
	}
	c, p := f.IPVS.Totals()
	return fmt.Sprintf("       Total Incoming Outgoing         Incoming         Outgoing\nCPU    Conns  Packets  Packets            Bytes            Bytes\n  0 %8X %8X %8X %16X %16X\n  ~ %8X %8X %8X %16X %16X\n", c, p, 0, 0, 0, 0, 0, 0, 0, 0), nil
}

// KernelRelease reports Release.
func (f *FakeSystem) KernelRelease() string { return f.Release }

// Run emulates ipset and the iptables tools.
func (f *FakeSystem) Run(stdin string, name string, args ...string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Commands = append(f.Commands, strings.TrimSpace(name+" "+strings.Join(args, " ")))
	if err := f.Fail[name]; err != nil {
		delete(f.Fail, name)
		return "", fmt.Errorf("%s: %w", name, err)
	}
	switch {
	case name == "ipset":
		return f.ipset(stdin, args)
	case strings.HasPrefix(name, "iptables-") && strings.HasSuffix(name, "-restore"):
		if !slices.Contains(args, "--noflush") {
			return "", fmt.Errorf("%s: the fake only models --noflush", name)
		}
		return "", f.restore(stdin)
	case strings.HasPrefix(name, "iptables-") && strings.HasSuffix(name, "-save"):
		return f.save(), nil
	}
	return "", fmt.Errorf("%s: command not modelled by the fake", name)
}

func (f *FakeSystem) ipset(stdin string, args []string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("ipset: no command")
	}
	switch args[0] {
	case "save":
		var b strings.Builder
		for _, n := range f.setOrd {
			s := f.sets[n]
			fmt.Fprintf(&b, "create %s %s\n", n, s.typ)
			for _, e := range slices.Sorted(maps.Keys(s.entries)) {
				fmt.Fprintf(&b, "add %s %s\n", n, e)
			}
		}
		return b.String(), nil
	case "list":
		return strings.Join(f.setOrd, "\n") + "\n", nil
	case "restore":
		return "", f.ipsetRestore(stdin, slices.Contains(args, "-exist"))
	}
	return "", fmt.Errorf("ipset %s: not modelled by the fake", args[0])
}

// ipsetRestore applies a restore script; like ipset it stops at the first
// failing line (earlier lines stay applied).
func (f *FakeSystem) ipsetRestore(script string, exist bool) error {
	for i, line := range strings.Split(script, "\n") {
		fl := strings.Fields(line)
		if len(fl) == 0 {
			continue
		}
		fail := func(msg string) error { return fmt.Errorf("ipset restore: line %d: %s", i+1, msg) }
		if len(fl) < 2 {
			return fail("missing set name")
		}
		s := f.sets[fl[1]]
		switch fl[0] {
		case "create":
			if len(fl) < 3 {
				return fail("missing set type")
			}
			if s != nil {
				if !exist || s.typ != fl[2] {
					return fail("set with the same name already exists")
				}
				continue
			}
			f.sets[fl[1]] = &fakeSet{typ: fl[2], entries: map[string]bool{}}
			f.setOrd = append(f.setOrd, fl[1])
		case "add", "del":
			if s == nil {
				return fail("the set with the given name does not exist")
			}
			if len(fl) < 3 {
				return fail("missing entry")
			}
			if fl[0] == "add" {
				if s.entries[fl[2]] && !exist {
					return fail("element is already added")
				}
				s.entries[fl[2]] = true
			} else {
				if !s.entries[fl[2]] && !exist {
					return fail("element is missing")
				}
				delete(s.entries, fl[2])
			}
		case "destroy", "flush":
			if s == nil {
				return fail("the set with the given name does not exist")
			}
			if fl[0] == "flush" {
				clear(s.entries)
				continue
			}
			if f.setInUse(fl[1]) {
				return fail("set cannot be destroyed: it is in use by a kernel component")
			}
			delete(f.sets, fl[1])
			f.setOrd = slices.DeleteFunc(f.setOrd, func(n string) bool { return n == fl[1] })
		default:
			return fail("unknown command " + fl[0])
		}
	}
	return nil
}

func (f *FakeSystem) setInUse(name string) bool {
	for _, t := range f.tables {
		for _, c := range t.chains {
			for _, r := range c.rules {
				if strings.Contains(r, "--match-set "+name+" ") {
					return true
				}
			}
		}
	}
	return false
}

var builtinTargets = []string{"ACCEPT", "DROP", "RETURN", "REJECT", "MASQUERADE", "MARK", "DNAT", "SNAT"}

// restore applies iptables-restore --noflush input to copies of the tables
// and commits each table at its COMMIT, as the tool does.
func (f *FakeSystem) restore(text string) error {
	var cur *fakeTable
	var name string
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		fail := func(msg string) error { return fmt.Errorf("iptables-restore: line %d failed: %s", i+1, msg) }
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			name = line[1:]
			t := f.tables[name]
			if t == nil {
				return fail("unknown table " + name)
			}
			cur = t.clone()
		case cur == nil:
			return fail("no table")
		case line == "COMMIT":
			f.tables[name] = cur
			cur = nil
		case strings.HasPrefix(line, ":"):
			c := strings.Fields(line[1:])[0]
			if ch := cur.chains[c]; ch != nil {
				if !slices.Contains(cur.builtin, c) {
					ch.rules = nil
				}
			} else {
				cur.chains[c] = &fakeChain{}
				cur.order = append(cur.order, c)
			}
		default:
			args, err := restore.Tokenize(line)
			if err != nil || len(args) < 2 {
				return fail("bad rule")
			}
			op, chain := args[0], args[1]
			ch := cur.chains[chain]
			if ch == nil {
				return fail("no chain " + chain)
			}
			rule := canonicalRule(args[2:])
			switch op {
			case "-A", "-I":
				if err := f.checkRule(cur, args[2:]); err != nil {
					return fail(err.Error())
				}
				if op == "-A" {
					ch.rules = append(ch.rules, rule)
				} else {
					ch.rules = slices.Insert(ch.rules, 0, rule)
				}
			case "-D":
				j := slices.Index(ch.rules, rule)
				if j < 0 {
					return fail("rule to delete not found in " + chain)
				}
				ch.rules = slices.Delete(ch.rules, j, j+1)
			case "-X":
				if slices.Contains(cur.builtin, chain) {
					return fail("cannot delete built-in chain " + chain)
				}
				for _, other := range cur.chains {
					for _, r := range other.rules {
						if strings.HasSuffix(r, "-j "+chain) || strings.Contains(r, "-j "+chain+" ") {
							return fail("chain " + chain + " is still referenced")
						}
					}
				}
				delete(cur.chains, chain)
				cur.order = slices.DeleteFunc(cur.order, func(n string) bool { return n == chain })
			default:
				return fail("unknown command " + op)
			}
		}
	}
	if cur != nil {
		return errors.New("iptables-restore: COMMIT expected at the end of the input")
	}
	return nil
}

// canonicalRule prints rule arguments as iptables-save does (quoting only
// comments with spaces).
func canonicalRule(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \"") || a == "" {
			out[i] = fmt.Sprintf("%q", a)
		} else {
			out[i] = a
		}
	}
	return strings.Join(out, " ")
}

func (f *FakeSystem) checkRule(t *fakeTable, args []string) error {
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-j":
			tgt := args[i+1]
			if !slices.Contains(builtinTargets, tgt) && t.chains[tgt] == nil {
				return fmt.Errorf("couldn't load target %s: no such chain", tgt)
			}
		case "--match-set":
			if f.sets[args[i+1]] == nil {
				return fmt.Errorf("set %s doesn't exist", args[i+1])
			}
		}
	}
	return nil
}

func (f *FakeSystem) save() string {
	var b strings.Builder
	for _, name := range []string{"filter", "nat"} {
		t := f.tables[name]
		fmt.Fprintf(&b, "*%s\n", name)
		for _, c := range t.builtin {
			fmt.Fprintf(&b, ":%s ACCEPT [0:0]\n", c)
		}
		for _, c := range t.order {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, c := range append(slices.Clone(t.builtin), t.order...) {
			for _, r := range t.chains[c].rules {
				fmt.Fprintf(&b, "-A %s %s\n", c, r)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
