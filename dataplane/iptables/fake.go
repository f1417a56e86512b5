package iptables

// Fake is a behavioural model of one node's filter and nat tables and ipsets,
// for unit tests: it applies restore text with iptables-restore --noflush
// semantics and fails where iptables-restore fails, and it dumps canonical
// text. It is ordinary code (not _test) so that other packages' tests, and the
// Backend's, can use it.
//
// Semantics modelled (iptables 1.8, both backends):
//   - a ":CHAIN - [0:0]" line creates a user chain, or flushes it if it
//     exists; on a built-in chain it only sets the policy (never flushes);
//   - chains not declared are kept, rules and all;
//   - -A/-I need an existing chain, and a jump needs an existing chain or a
//     standard target ("Couldn't load target");
//   - -X needs an existing, empty user chain that no rule jumps to;
//   - -m set and -j SET need the set to exist;
//   - Restore applies the whole input or none of it; FakeCommands, which
//     runs a Backend on the fake, restores table by table, as
//     iptables-restore commits each table at its COMMIT line (a failure in
//     nat leaves filter committed).

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/restore"
)

// Errors the fake returns (wrapped, with the line number).
var (
	ErrNoChain      = errors.New("no chain/target/match by that name")
	ErrChainInUse   = errors.New("too many links")
	ErrChainNotEmpt = errors.New("directory not empty")
	ErrBadInput     = errors.New("bad restore input")
	ErrNoSet        = errors.New("set does not exist")
	ErrSetExists    = errors.New("set with the same name already exists")
)

// maxChainName is iptables' limit (XT_EXTENSION_MAXNAMELEN - 1).
const maxChainName = 28

var builtinChains = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
}

// Chain is one chain of the fake.
type Chain struct {
	Name    string
	Builtin bool
	Policy  string // built-in chains only
	Rules   []*Rule
}

// Table is one table of the fake.
type Table struct {
	Name   string
	Chains map[string]*Chain
}

// IPSet is one set of the fake (hash:ip only).
type IPSet struct {
	Name string
	Type string
	// Timeout is the default entry timeout, -1 for a set without timeouts.
	Timeout int
}

// Fake holds one node's tables and sets.
type Fake struct {
	Tables map[string]*Table
	Sets   map[string]*IPSet
	// LocalAddrs are the node's own addresses, for -m addrtype LOCAL
	// (127.0.0.0/8 is always local).
	LocalAddrs []netip.Addr
	// NFAcct are the nfacct counters; a rule matching a missing one is
	// refused, as the kernel refuses it.
	NFAcct map[string]bool
}

// NewFake returns empty filter, mangle and nat tables with their built-in
// chains (policy ACCEPT), as in a fresh network namespace. Only the canary
// chain goes into mangle; the tracer never walks it.
func NewFake(localAddrs ...netip.Addr) *Fake {
	f := &Fake{Tables: map[string]*Table{}, Sets: map[string]*IPSet{}, LocalAddrs: localAddrs, NFAcct: map[string]bool{}}
	for name, chains := range builtinChains {
		t := &Table{Name: name, Chains: map[string]*Chain{}}
		for _, c := range chains {
			t.Chains[c] = &Chain{Name: c, Builtin: true, Policy: "ACCEPT"}
		}
		f.Tables[name] = t
	}
	return f
}

func (f *Fake) clone() *Fake {
	g := &Fake{Tables: map[string]*Table{}, Sets: maps.Clone(f.Sets), LocalAddrs: f.LocalAddrs, NFAcct: f.NFAcct}
	for n, t := range f.Tables {
		nt := &Table{Name: n, Chains: make(map[string]*Chain, len(t.Chains))}
		for cn, c := range t.Chains {
			cc := *c
			cc.Rules = slices.Clone(c.Rules)
			nt.Chains[cn] = &cc
		}
		g.Tables[n] = nt
	}
	return g
}

// Restore applies restore text as `iptables-restore --noflush` does. On error
// nothing is applied; the error names the line.
func (f *Fake) Restore(text string) error {
	g := f.clone()
	var t *Table
	for i, line := range strings.Split(text, "\n") {
		ln := i + 1
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var err error
		switch {
		case strings.HasPrefix(line, "*"):
			if t != nil {
				err = fmt.Errorf("%w: table %s started before COMMIT of %s", ErrBadInput, line[1:], t.Name)
			} else if t = g.Tables[line[1:]]; t == nil {
				err = fmt.Errorf("%w: table %q does not exist", ErrBadInput, line[1:])
			}
		case t == nil:
			err = fmt.Errorf("%w: %q outside a table", ErrBadInput, line)
		case line == "COMMIT":
			t = nil
		case strings.HasPrefix(line, ":"):
			err = g.declare(t, line)
		default:
			err = g.command(t, line)
		}
		if err != nil {
			return fmt.Errorf("could not restore: line %d: %w", ln, err)
		}
	}
	if t != nil {
		return fmt.Errorf("could not restore: %w: no COMMIT for table %s", ErrBadInput, t.Name)
	}
	*f = *g
	return nil
}

func (f *Fake) declare(t *Table, line string) error {
	fields := strings.Fields(line[1:])
	if len(fields) < 2 {
		return fmt.Errorf("%w: bad chain line %q", ErrBadInput, line)
	}
	name, policy := fields[0], fields[1]
	if c := t.Chains[name]; c != nil && c.Builtin {
		if policy != "ACCEPT" && policy != "DROP" {
			return fmt.Errorf("%w: bad policy %q for built-in chain %s", ErrBadInput, policy, name)
		}
		c.Policy = policy
		return nil
	}
	if policy != "-" {
		return fmt.Errorf("%w: user chain %s cannot have a policy", ErrBadInput, name)
	}
	if len(name) > maxChainName {
		return fmt.Errorf("%w: chain name %q is longer than %d characters", ErrBadInput, name, maxChainName)
	}
	if c := t.Chains[name]; c != nil {
		c.Rules = nil // --noflush: a declared chain is flushed
		return nil
	}
	t.Chains[name] = &Chain{Name: name}
	return nil
}

func (f *Fake) command(t *Table, line string) error {
	args, err := restore.Tokenize(line)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadRule, err)
	}
	if len(args) < 2 {
		return fmt.Errorf("%w: %q", ErrBadInput, line)
	}
	op, name, rest := args[0], args[1], args[2:]
	c := t.Chains[name]
	switch op {
	case "-N", "--new-chain":
		if c != nil {
			return fmt.Errorf("%w: chain %s already exists", ErrBadInput, name)
		}
		t.Chains[name] = &Chain{Name: name}
		return nil
	case "-X", "--delete-chain":
		return f.deleteChain(t, name)
	}
	if c == nil {
		return fmt.Errorf("%w: chain %s does not exist in table %s", ErrNoChain, name, t.Name)
	}
	switch op {
	case "-F", "--flush":
		c.Rules = nil
		return nil
	case "-A", "--append", "-I", "--insert", "-D", "--delete":
	default:
		return fmt.Errorf("%w: command %q is not modelled", ErrBadInput, op)
	}
	pos := 0
	if op == "-I" || op == "--insert" {
		if len(rest) > 0 {
			if n, err := strconv.Atoi(rest[0]); err == nil {
				if n < 1 || n > len(c.Rules)+1 {
					return fmt.Errorf("%w: index of insertion %d too big", ErrBadInput, n)
				}
				pos = n - 1
				rest = rest[1:]
			}
		}
	}
	r, err := ParseRule(rest)
	if err != nil {
		return err
	}
	if err := f.checkRule(t, r); err != nil {
		return err
	}
	switch op {
	case "-A", "--append":
		c.Rules = append(c.Rules, r)
	case "-I", "--insert":
		c.Rules = slices.Insert(c.Rules, pos, r)
	default:
		want := restore.JoinArgs(r.Args)
		i := slices.IndexFunc(c.Rules, func(x *Rule) bool { return restore.JoinArgs(x.Args) == want })
		if i < 0 {
			return fmt.Errorf("%w: bad rule (does a matching rule exist in that chain?)", ErrNoChain)
		}
		c.Rules = slices.Delete(c.Rules, i, i+1)
	}
	return nil
}

// AppendRule parses one rule as iptables-save prints it (args after "-A
// CHAIN", tokenised) and appends it to chain of table, with the checks -A
// makes (the chain and the jump target exist, and so do the sets it
// names). It is how a dump taken elsewhere is loaded rule by rule, so that
// a reader can skip the rules the fake does not model and keep the rest;
// Restore stays all or nothing.
func (f *Fake) AppendRule(table, chain string, args []string) error {
	t := f.Tables[table]
	if t == nil {
		return fmt.Errorf("%w: table %q does not exist", ErrBadInput, table)
	}
	c := t.Chains[chain]
	if c == nil {
		return fmt.Errorf("%w: chain %s does not exist in table %s", ErrNoChain, chain, table)
	}
	r, err := ParseRule(args)
	if err != nil {
		return err
	}
	if err := f.checkRule(t, r); err != nil {
		return err
	}
	c.Rules = append(c.Rules, r)
	return nil
}

// checkRule checks what depends on the table: the jump target, the sets.
func (f *Fake) checkRule(t *Table, r *Rule) error {
	switch {
	case r.target == "":
	case builtinTargets[r.target]:
		if (r.target == "DNAT" || r.target == "SNAT" || r.target == "MASQUERADE") && t.Name != "nat" {
			return fmt.Errorf("%w: target %s is only valid in the nat table", ErrBadRule, r.target)
		}
		if r.target == "REJECT" && t.Name == "nat" {
			return fmt.Errorf("%w: target REJECT is not valid in the nat table", ErrBadRule)
		}
	case t.Chains[r.target] == nil:
		return fmt.Errorf("%w: couldn't load target `%s'", ErrNoChain, r.target)
	case t.Chains[r.target].Builtin:
		return fmt.Errorf("%w: cannot jump to built-in chain %s", ErrBadRule, r.target)
	}
	for _, s := range []string{r.matchSet, r.addSet} {
		if s != "" && f.Sets[s] == nil {
			return fmt.Errorf("%w: set %s doesn't exist", ErrNoSet, s)
		}
	}
	if r.nfacct != "" && !f.NFAcct[r.nfacct] {
		return fmt.Errorf("%w: nfacct object %s does not exist", ErrBadRule, r.nfacct)
	}
	return nil
}

func (f *Fake) deleteChain(t *Table, name string) error {
	c := t.Chains[name]
	switch {
	case c == nil:
		return fmt.Errorf("%w: chain %s does not exist", ErrNoChain, name)
	case c.Builtin:
		return fmt.Errorf("%w: cannot delete built-in chain %s", ErrBadInput, name)
	case len(c.Rules) > 0:
		return fmt.Errorf("%w: chain %s is not empty", ErrChainNotEmpt, name)
	}
	for _, o := range t.Chains {
		for _, r := range o.Rules {
			if r.target == name {
				return fmt.Errorf("%w: chain %s is referenced by chain %s", ErrChainInUse, name, o.Name)
			}
		}
	}
	delete(t.Chains, name)
	return nil
}

// RestoreIPSet applies `ipset restore -exist` input: create lines (a set that
// exists with the same type and timeout is left alone, another is an error)
// and destroy lines (the set must exist and no rule may refer to it). On
// error nothing is applied.
func (f *Fake) RestoreIPSet(text string) error {
	sets := maps.Clone(f.Sets)
	for i, line := range strings.Split(text, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if err := f.ipsetLine(sets, fields); err != nil {
			return fmt.Errorf("could not restore ipsets: line %d: %w", i+1, err)
		}
	}
	f.Sets = sets
	return nil
}

func (f *Fake) ipsetLine(sets map[string]*IPSet, fields []string) error {
	if len(fields) < 2 {
		return fmt.Errorf("%w: %q", ErrBadInput, strings.Join(fields, " "))
	}
	name := fields[1]
	switch fields[0] {
	case "create":
		if len(fields) < 3 || fields[2] != "hash:ip" {
			return fmt.Errorf("%w: only hash:ip sets are modelled", ErrBadInput)
		}
		s := &IPSet{Name: name, Type: fields[2], Timeout: -1}
		for i := 3; i < len(fields); i++ {
			switch fields[i] {
			case "family":
				if i+1 >= len(fields) || fields[i+1] != "inet" {
					return fmt.Errorf("%w: only family inet is modelled", ErrBadInput)
				}
				i++
			case "timeout":
				if i+1 >= len(fields) {
					return fmt.Errorf("%w: timeout needs a value", ErrBadInput)
				}
				n, err := strconv.Atoi(fields[i+1])
				if err != nil || n < 0 {
					return fmt.Errorf("%w: timeout %q", ErrBadInput, fields[i+1])
				}
				s.Timeout = n
				i++
			default:
				return fmt.Errorf("%w: create option %q is not modelled", ErrBadInput, fields[i])
			}
		}
		if len(name) > 31 {
			return fmt.Errorf("%w: set name %q is longer than 31 characters", ErrBadInput, name)
		}
		if old := sets[name]; old != nil && *old != *s {
			return fmt.Errorf("%w: %s", ErrSetExists, name)
		}
		sets[name] = s
	case "destroy":
		if sets[name] == nil {
			return fmt.Errorf("%w: %s", ErrNoSet, name)
		}
		for _, t := range f.Tables {
			for _, c := range t.Chains {
				for _, r := range c.Rules {
					if r.matchSet == name || r.addSet == name {
						return fmt.Errorf("%w: set %s is in use by a rule of %s", ErrChainInUse, name, c.Name)
					}
				}
			}
		}
		delete(sets, name)
	default:
		return fmt.Errorf("%w: ipset command %q is not modelled", ErrBadInput, fields[0])
	}
	return nil
}

// Dump prints the tables as iptables-save would, in a canonical order:
// tables by name, built-in chains first in hook order, then user chains by
// name; each chain's rules in order. Counters are zero.
func (f *Fake) Dump() string {
	var b strings.Builder
	for _, tn := range slices.Sorted(maps.Keys(f.Tables)) {
		t := f.Tables[tn]
		order := f.chainOrder(t)
		b.WriteString("*" + tn + "\n")
		for _, c := range order {
			pol := "-"
			if c.Builtin {
				pol = c.Policy
			}
			fmt.Fprintf(&b, ":%s %s [0:0]\n", c.Name, pol)
		}
		for _, c := range order {
			for _, r := range c.Rules {
				b.WriteString("-A " + c.Name + " " + restore.JoinArgs(r.Args) + "\n")
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// DumpIPSets prints the sets as `ipset save` create lines, sorted.
func (f *Fake) DumpIPSets() string {
	var b strings.Builder
	for _, n := range slices.Sorted(maps.Keys(f.Sets)) {
		s := f.Sets[n]
		if s.Timeout >= 0 {
			fmt.Fprintf(&b, "create %s %s family inet timeout %d\n", s.Name, s.Type, s.Timeout)
		} else {
			fmt.Fprintf(&b, "create %s %s family inet\n", s.Name, s.Type)
		}
	}
	return b.String()
}

func (f *Fake) chainOrder(t *Table) []*Chain {
	var out []*Chain
	for _, n := range builtinChains[t.Name] {
		out = append(out, t.Chains[n])
	}
	for _, n := range slices.Sorted(maps.Keys(t.Chains)) {
		if !t.Chains[n].Builtin {
			out = append(out, t.Chains[n])
		}
	}
	return out
}

// ChainNames lists the user chains of a table, sorted.
func (f *Fake) ChainNames(table string) []string {
	t := f.Tables[table]
	if t == nil {
		return nil
	}
	var out []string
	for n, c := range t.Chains {
		if !c.Builtin {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// FakeCommands runs a Backend's commands against a Fake, so that unit tests
// drive the real Backend. A restore input is committed table by table, as
// iptables-legacy-restore does (the worst case for a Backend): a table that
// fails leaves the tables before it committed. Failures makes chosen calls
// fail on purpose.
type FakeCommands struct {
	Fake *Fake
	// Failures are the injected failures.
	Failures []FakeFailure
	// Restores and IPSetRestores count the calls so far.
	Restores, IPSetRestores int
	// NoNFAcct makes EnsureNFAcct fail, as on a kernel without
	// nfnetlink_acct.
	NoNFAcct bool
}

// Commands of a FakeFailure.
const (
	CommandRestore      = "iptables-restore"
	CommandIPSetRestore = "ipset restore"
)

// FakeFailure makes one call of a FakeCommands fail.
type FakeFailure struct {
	// Command is CommandRestore or CommandIPSetRestore, and Call the number
	// of the call of that command to fail, from 1.
	Command string
	Call    int
	// Table, for iptables-restore, is the table whose commit fails: the
	// tables before it in the input are committed. "" fails before any
	// table (and ipset restore always fails before any line).
	Table string
	// Applied applies the whole input and fails all the same (a command
	// killed after its last commit).
	Applied bool
}

// ErrInjected is the error of an injected failure.
var ErrInjected = errors.New("injected failure")

var _ Commands = (*FakeCommands)(nil)

// NewFakeCommands returns FakeCommands on a fresh Fake for a node with
// the addresses localAddrs.
func NewFakeCommands(localAddrs ...netip.Addr) *FakeCommands {
	return &FakeCommands{Fake: NewFake(localAddrs...)}
}

// Fail adds a failure of the next call of command.
func (c *FakeCommands) Fail(command string, ff FakeFailure) {
	ff.Command = command
	if command == CommandRestore {
		ff.Call = c.Restores + 1
	} else {
		ff.Call = c.IPSetRestores + 1
	}
	c.Failures = append(c.Failures, ff)
}

func (c *FakeCommands) failure(command string, n int) *FakeFailure {
	for i := range c.Failures {
		if f := &c.Failures[i]; f.Command == command && f.Call == n {
			return f
		}
	}
	return nil
}

// Restore applies input table by table with Fake.Restore (counters are not
// modelled).
func (c *FakeCommands) Restore(input string, counters bool) error {
	c.Restores++
	inj := c.failure(CommandRestore, c.Restores)
	if inj != nil && inj.Table == "" && !inj.Applied {
		return fmt.Errorf("could not restore: %w", ErrInjected)
	}
	for _, section := range tableSections(input) {
		table, _, _ := strings.Cut(strings.TrimPrefix(section, "*"), "\n")
		if inj != nil && !inj.Applied && inj.Table == table {
			return fmt.Errorf("could not restore table %s: %w", table, ErrInjected)
		}
		if err := c.Fake.Restore(section); err != nil {
			return err
		}
	}
	if inj != nil {
		return fmt.Errorf("could not restore after the last commit: %w", ErrInjected)
	}
	return nil
}

// tableSections splits restore input into its tables' sections ("*table"
// through "COMMIT"); text outside a section goes with the next one, or is
// a section of its own at the end (which Fake.Restore then refuses).
func tableSections(input string) []string {
	var out []string
	start := 0
	for pos := 0; pos < len(input); {
		end := strings.IndexByte(input[pos:], '\n')
		next := len(input)
		if end >= 0 {
			next = pos + end + 1
		}
		if strings.TrimSpace(input[pos:next]) == "COMMIT" {
			out = append(out, input[start:next])
			start = next
		}
		pos = next
	}
	if strings.TrimSpace(input[start:]) != "" {
		out = append(out, input[start:])
	}
	return out
}

// Save returns the Fake's Dump (counters are zero).
func (c *FakeCommands) Save(counters bool) (string, error) {
	return c.Fake.Dump(), nil
}

// IPSetRestore applies input with Fake.RestoreIPSet; without exist, a
// create of an existing set fails, as ipset restore does.
func (c *FakeCommands) IPSetRestore(input string, exist bool) error {
	c.IPSetRestores++
	inj := c.failure(CommandIPSetRestore, c.IPSetRestores)
	if inj != nil && !inj.Applied {
		return fmt.Errorf("could not restore ipsets: %w", ErrInjected)
	}
	if !exist {
		for _, line := range strings.Split(input, "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "create" && c.Fake.Sets[f[1]] != nil {
				return fmt.Errorf("could not restore ipsets: %w: %s", ErrSetExists, f[1])
			}
		}
	}
	if err := c.Fake.RestoreIPSet(input); err != nil {
		return err
	}
	if inj != nil {
		return fmt.Errorf("could not restore ipsets after the last line: %w", ErrInjected)
	}
	return nil
}

// EnsureNFAcct adds the counter to the Fake (or fails under NoNFAcct).
func (c *FakeCommands) EnsureNFAcct(name string) error {
	if c.NoNFAcct {
		return fmt.Errorf("could not create nfacct counter %s: %w", name, ErrInjected)
	}
	c.Fake.NFAcct[name] = true
	return nil
}

// IPSetNames lists the Fake's sets, sorted.
func (c *FakeCommands) IPSetNames() ([]string, error) {
	return slices.Sorted(maps.Keys(c.Fake.Sets)), nil
}
