package iptables

// Backend applies the renderer's output inside one node's network namespace
// the way kube-proxy does: one `iptables-restore --noflush --counters` per
// sync (with the affinity ipsets restored around it), the jumps from the
// built-in chains once, and `iptables-save -c` for counters. Either iptables
// backend can be used: "nft" runs iptables-nft-restore, "legacy"
// iptables-legacy-restore; the two keep separate tables in the kernel.

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Variants of the iptables userland.
const (
	VariantNFT    = "nft"
	VariantLegacy = "legacy"
)

// Commands runs the userland tools a Backend needs, in its node's network
// namespace. NewBackend runs the real commands; unit tests run a Backend on
// FakeCommands.
type Commands interface {
	// Restore runs `iptables-restore --noflush [--counters]` with input.
	Restore(input string, counters bool) error
	// Save returns the output of `iptables-save [-c]`.
	Save(counters bool) (string, error)
	// IPSetRestore runs `ipset restore [-exist]` with input.
	IPSetRestore(input string, exist bool) error
	// IPSetNames lists the sets (`ipset list -n`).
	IPSetNames() ([]string, error)
	// EnsureNFAcct creates the nfacct counter name unless it exists
	// (NFAcctEnsure).
	EnsureNFAcct(name string) error
}

// Backend is the iptables dataplane of one node.
//
// A failed sync leaves the kernel holding the last committed rules, the
// failed render's, or a mix (iptables-restore commits table by table, ipset
// restore line by line). So a failure never resets what the Backend knows:
// the renderer keeps the committed state and learns what the failed render
// may have added (Renderer.Abort), and the next sync is full and deletes
// every chain and set of either that it does not use. The two things that
// are not idempotent are checked in the kernel instead, and only after a
// failure: the jump rules from the built-in chains (appended only where
// `iptables-save` lacks them) and the stale sets (destroyed only when
// `ipset list` has them).
type Backend struct {
	// mu serialises the methods: the sync loop calls Sync while the
	// conformance checks read Counters.
	mu       sync.Mutex
	cmds     Commands
	r        *Renderer
	jumps    jumpState
	needFull bool
	// unsure reports a failed sync since the last successful one.
	unsure bool
	chains *ChainMap
	// LastRuleset is the last ruleset applied (for inspection and tests),
	// LastText the exact restore input sent.
	LastRuleset *Ruleset
	LastText    string
}

// jumpState is what the Backend knows of the jump rules in the kernel.
type jumpState int

const (
	jumpsAbsent  jumpState = iota // a fresh (or cleaned) namespace
	jumpsApplied                  // a restore with them succeeded
	jumpsUnknown                  // a restore with them failed: maybe some tables took them
)

var _ dataplane.Backend = (*Backend)(nil)

// NewBackend returns a backend that programs ns. variant is "nft" or
// "legacy".
func NewBackend(ns *netns.Namespace, cfg Config, variant string) (*Backend, error) {
	if variant != VariantNFT && variant != VariantLegacy {
		return nil, fmt.Errorf("unknown iptables backend %q (nft or legacy)", variant)
	}
	return NewBackendWithCommands(NamespaceCommands(ns, variant), cfg)
}

// NamespaceCommands returns the real commands of variant ("nft" or
// "legacy"), run in ns: what NewBackend uses, for a caller that wraps them
// (to inject failures into a real namespace, for example).
func NamespaceCommands(ns *netns.Namespace, variant string) Commands {
	return nsCommands{ns: ns, variant: variant}
}

// NewBackendWithCommands returns a backend that runs its commands through
// cmds (FakeCommands in unit tests).
func NewBackendWithCommands(cmds Commands, cfg Config) (*Backend, error) {
	r, err := NewRenderer(cfg)
	if err != nil {
		return nil, err
	}
	return &Backend{cmds: cmds, r: r, needFull: true}, nil
}

// Tool returns the command name of an iptables tool for a variant, e.g.
// Tool("nft", "restore") is "iptables-nft-restore".
func Tool(variant, verb string) string {
	if verb == "" {
		return "iptables-" + variant
	}
	return "iptables-" + variant + "-" + verb
}

// CheckTools reports which commands the backend needs and lacks.
func CheckTools(variant string, ipset bool) error {
	need := []string{Tool(variant, "restore"), Tool(variant, "save")}
	if ipset {
		need = append(need, "ipset")
	}
	var missing []string
	for _, c := range need {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing commands %s (Debian packages iptables and ipset)", strings.Join(missing, ", "))
	}
	return nil
}

// nsCommands runs the real commands in a node namespace.
type nsCommands struct {
	ns      *netns.Namespace
	variant string
}

var _ Commands = nsCommands{}

func (c nsCommands) Restore(input string, counters bool) error {
	args := []string{"--noflush"}
	if counters {
		args = append(args, "--counters")
	}
	return c.run(input, Tool(c.variant, "restore"), args...)
}

func (c nsCommands) Save(counters bool) (string, error) {
	if counters {
		return c.output(Tool(c.variant, "save"), "-c")
	}
	return c.output(Tool(c.variant, "save"))
}

func (c nsCommands) IPSetRestore(input string, exist bool) error {
	if exist {
		return c.run(input, "ipset", "restore", "-exist")
	}
	return c.run(input, "ipset", "restore")
}

func (c nsCommands) IPSetNames() ([]string, error) {
	list, err := c.output("ipset", "list", "-n")
	if err != nil {
		return nil, err
	}
	return strings.Fields(list), nil
}

func (c nsCommands) EnsureNFAcct(name string) error { return NFAcctEnsure(c.ns, name) }

func (c nsCommands) run(stdin string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := c.ns.Run(cmd); err != nil {
		return fmt.Errorf("%s in %s: %w: %s", name, c.ns.Name, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (c nsCommands) output(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := c.ns.Run(cmd); err != nil {
		return "", fmt.Errorf("%s in %s: %w: %s", name, c.ns.Name, err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// Sync renders and applies. A failure keeps the renderer's committed state
// and tells it what may have been applied (Renderer.Abort); the next sync is
// full, as kube-proxy's after a failed restore, and removes what is stale
// relative to either.
func (b *Backend) Sync(st *cluster.State, changed []cluster.ServicePortName, full bool) (dataplane.SyncResult, error) {
	start := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	full = full || b.needFull
	if full {
		b.ensureNFAcct()
	}
	rs, err := b.r.Render(st, changed, full)
	if err != nil {
		return dataplane.SyncResult{}, err
	}
	res := dataplane.SyncResult{Full: rs.Full, Bytes: len(rs.Restore), Lines: rs.Lines, NoLocalEndpoints: rs.NoLocalEndpoints}
	fail := func(err error) (dataplane.SyncResult, error) {
		b.needFull = true
		b.unsure = true
		b.r.Abort(rs)
		res.Duration = time.Since(start)
		return res, err
	}
	if rs.IPSetRestore != "" {
		if err := b.cmds.IPSetRestore(rs.IPSetRestore, true); err != nil {
			return fail(fmt.Errorf("could not create ipsets: %w", err))
		}
	}
	text := rs.Restore
	switch b.jumps {
	case jumpsAbsent:
		// The jumps from the built-in chains go in the same transaction the
		// first time: a second restore would read and rewrite whole tables
		// again (with iptables-legacy, as costly as the first).
		text = MergeJumps(text, rs.Jumps)
	case jumpsUnknown:
		// Built-in chains are never flushed, so a jump appended twice
		// stays twice: add only those the kernel lacks.
		save, err := b.cmds.Save(false)
		if err != nil {
			return fail(fmt.Errorf("could not read the jump rules: %w", err))
		}
		text = MergeJumps(text, MissingJumps(rs.Jumps, save))
	}
	b.LastText = text
	if err := b.cmds.Restore(text, true); err != nil {
		if b.jumps == jumpsAbsent {
			b.jumps = jumpsUnknown
		}
		return fail(fmt.Errorf("could not restore rules: %w", err))
	}
	b.jumps = jumpsApplied
	if destroy := rs.IPSetDestroy; destroy != "" {
		if b.unsure {
			// Some stale sets may never have been created, or already
			// destroyed, and destroying a missing set fails.
			names, err := b.cmds.IPSetNames()
			if err != nil {
				return fail(fmt.Errorf("could not list ipsets: %w", err))
			}
			destroy = destroyExisting(rs.StaleSets, names)
		}
		if destroy != "" {
			if err := b.cmds.IPSetRestore(destroy, false); err != nil {
				return fail(fmt.Errorf("could not destroy stale ipsets: %w", err))
			}
		}
	}
	b.r.Commit(rs)
	b.chains = rs.Chains
	b.LastRuleset = rs
	b.needFull = false
	b.unsure = false
	res.Duration = time.Since(start)
	return res, nil
}

// ensureNFAcct creates kube-proxy's nfacct counters, as kube-proxy does on
// each full sync, and tells the renderer which ones it may match: a counter
// that could not be created (a kernel without nfnetlink_acct) is left out
// of the rules, as kube-proxy leaves it out, and the sync goes on.
func (b *Backend) ensureNFAcct() {
	have := make(map[string]bool, len(NFAcctCounters))
	for _, name := range NFAcctCounters {
		have[name] = b.cmds.EnsureNFAcct(name) == nil
	}
	b.r.SetNFAcct(have)
}

// destroyExisting returns `ipset restore` input destroying the sets of stale
// that names has.
func destroyExisting(stale, names []string) string {
	have := make(map[string]bool, len(names))
	for _, n := range names {
		have[n] = true
	}
	var b strings.Builder
	for _, s := range stale {
		if have[s] {
			b.WriteString("destroy " + s + "\n")
		}
	}
	return b.String()
}

// SavedRules returns the rules of save, the output of `iptables-save`, as
// "TABLE -A CHAIN ..." keys, exactly as iptables-save prints them.
func SavedRules(save string) map[string]bool {
	have := map[string]bool{}
	table := ""
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, "-A "):
			have[table+" "+line] = true
		}
	}
	return have
}

// MissingJumps returns the rules of a jump text (Ruleset.Jumps) that save,
// the output of `iptables-save`, lacks, as a jump text, with every chain
// declaration of the jump text kept. It compares lines as iptables-save
// prints them, which is how the jump text writes them.
func MissingJumps(jumps, save string) string {
	have := SavedRules(save)
	var out strings.Builder
	table := ""
	for _, line := range strings.Split(jumps, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			out.WriteString(line + "\n")
		case strings.HasPrefix(line, ":"):
			// Declaring the (empty) canary again is harmless.
			out.WriteString(line + "\n")
		case strings.HasPrefix(line, "-A "):
			if !have[table+" "+line] {
				out.WriteString(line + "\n")
			}
		case line == "COMMIT":
			out.WriteString("COMMIT\n")
		}
	}
	return out.String()
}

// Dump returns `iptables-save` of the filter and nat tables.
func (b *Backend) Dump() (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmds.Save(false)
}

// Counters reads `iptables-save -c` and maps the counters to service ports
// and endpoints.
func (b *Backend) Counters() ([]dataplane.Counter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.chains == nil {
		return nil, errors.New("no rules applied yet")
	}
	save, err := b.cmds.Save(true)
	if err != nil {
		return nil, err
	}
	return ParseCounters(save, b.chains), nil
}

// Cleanup removes the jump rules and every KUBE- chain from the filter and
// nat tables, and the affinity ipsets. (The run's namespaces are deleted at
// the end anyway; this is for reuse of a namespace.)
func (b *Backend) Cleanup() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	save, err := b.cmds.Save(false)
	if err != nil {
		return err
	}
	if err := b.cmds.Restore(CleanupText(save), false); err != nil {
		return fmt.Errorf("could not remove rules: %w", err)
	}
	b.jumps = jumpsAbsent
	b.needFull = true
	b.unsure = false
	b.r.Reset()
	if b.r.Config().Affinity == AffinityIPSet {
		names, err := b.cmds.IPSetNames()
		if err != nil {
			return err
		}
		var destroy strings.Builder
		for _, n := range names {
			if strings.HasPrefix(n, "KUBE-") {
				destroy.WriteString("destroy " + n + "\n")
			}
		}
		if destroy.Len() > 0 {
			return b.cmds.IPSetRestore(destroy.String(), false)
		}
	}
	return nil
}

// MergeJumps adds the rules of a jump text (per table: "-A <BUILTIN> ...")
// to the table sections of a restore text, before each table's COMMIT, and
// its chain declarations (":KUBE-PROXY-CANARY - [0:0]") after each table's
// header.
func MergeJumps(restore, jumps string) string {
	perTable, decls := map[string][]string{}, map[string][]string{}
	table := ""
	for _, line := range strings.Split(jumps, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line
		case strings.HasPrefix(line, ":"):
			decls[table] = append(decls[table], line)
		case strings.HasPrefix(line, "-A "):
			perTable[table] = append(perTable[table], line)
		}
	}
	var out strings.Builder
	out.Grow(len(restore) + len(jumps))
	// The restore text is copied in spans between the insertion points,
	// without splitting it (a full sync's text has 200,000 lines).
	table = ""
	done := 0 // restore[:done] is written
	for pos := 0; pos < len(restore); {
		end, next := len(restore), len(restore)
		if i := strings.IndexByte(restore[pos:], '\n'); i >= 0 {
			end, next = pos+i, pos+i+1
		}
		line := restore[pos:end]
		if strings.HasPrefix(line, "*") {
			table = line
			out.WriteString(restore[done:next])
			done = next
			for _, d := range decls[table] {
				out.WriteString(d + "\n")
			}
			delete(decls, table)
		}
		if line == "COMMIT" {
			out.WriteString(restore[done:pos])
			done = pos
			for _, j := range perTable[table] {
				out.WriteString(j + "\n")
			}
			delete(perTable, table)
		}
		pos = next
	}
	out.WriteString(restore[done:])
	// A table with jumps or declarations but no section in restore gets a
	// section of its own, in the jump text's order.
	for _, line := range strings.Split(jumps, "\n") {
		if !strings.HasPrefix(line, "*") || (decls[line] == nil && perTable[line] == nil) {
			continue
		}
		out.WriteString(line + "\n")
		for _, l := range append(decls[line], perTable[line]...) {
			out.WriteString(l + "\n")
		}
		out.WriteString("COMMIT\n")
		delete(decls, line)
		delete(perTable, line)
	}
	return out.String()
}
