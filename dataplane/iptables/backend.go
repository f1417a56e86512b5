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

// Backend is the iptables dataplane of one node.
type Backend struct {
	ns       *netns.Namespace
	r        *Renderer
	variant  string
	jumps    bool
	needFull bool
	chains   *ChainMap
	// LastRuleset is the last ruleset applied (for inspection and tests),
	// LastText the exact restore input sent.
	LastRuleset *Ruleset
	LastText    string
}

var _ dataplane.Backend = (*Backend)(nil)

// NewBackend returns a backend that programs ns. variant is "nft" or
// "legacy".
func NewBackend(ns *netns.Namespace, cfg Config, variant string) (*Backend, error) {
	if variant != VariantNFT && variant != VariantLegacy {
		return nil, fmt.Errorf("unknown iptables backend %q (nft or legacy)", variant)
	}
	r, err := NewRenderer(cfg)
	if err != nil {
		return nil, err
	}
	return &Backend{ns: ns, r: r, variant: variant, needFull: true}, nil
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

func (b *Backend) run(stdin string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := b.ns.Run(cmd); err != nil {
		return fmt.Errorf("%s in %s: %w: %s", name, b.ns.Name, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (b *Backend) output(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := b.ns.Run(cmd); err != nil {
		return "", fmt.Errorf("%s in %s: %w: %s", name, b.ns.Name, err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// Sync renders and applies; a failure leaves the renderer uncommitted so
// that the next sync is full, as kube-proxy does after a failed restore.
func (b *Backend) Sync(st *cluster.State, changed []cluster.ServicePortName, full bool) (dataplane.SyncResult, error) {
	start := time.Now()
	full = full || b.needFull
	rs, err := b.r.Render(st, changed, full)
	if err != nil {
		return dataplane.SyncResult{}, err
	}
	res := dataplane.SyncResult{Full: rs.Full, Bytes: len(rs.Restore), Lines: rs.Lines, NoLocalEndpoints: rs.NoLocalEndpoints}
	fail := func(err error) (dataplane.SyncResult, error) {
		b.needFull = true
		b.r.Reset()
		res.Duration = time.Since(start)
		return res, err
	}
	if rs.IPSetRestore != "" {
		if err := b.run(rs.IPSetRestore, "ipset", "restore", "-exist"); err != nil {
			return fail(err)
		}
	}
	text := rs.Restore
	if !b.jumps {
		// The jumps from the built-in chains go in the same transaction the
		// first time: a second restore would read and rewrite whole tables
		// again (with iptables-legacy, as costly as the first).
		text = MergeJumps(text, rs.Jumps)
	}
	b.LastText = text
	if err := b.run(text, Tool(b.variant, "restore"), "--noflush", "--counters"); err != nil {
		return fail(fmt.Errorf("could not restore rules: %w", err))
	}
	b.jumps = true
	if rs.IPSetDestroy != "" {
		if err := b.run(rs.IPSetDestroy, "ipset", "restore"); err != nil {
			return fail(err)
		}
	}
	b.r.Commit(rs)
	b.chains = rs.Chains
	b.LastRuleset = rs
	b.needFull = false
	res.Duration = time.Since(start)
	return res, nil
}

// Dump returns `iptables-save` of the filter and nat tables.
func (b *Backend) Dump() (string, error) {
	return b.output(Tool(b.variant, "save"))
}

// Counters reads `iptables-save -c` and maps the counters to service ports
// and endpoints.
func (b *Backend) Counters() ([]dataplane.Counter, error) {
	if b.chains == nil {
		return nil, errors.New("no rules applied yet")
	}
	save, err := b.output(Tool(b.variant, "save"), "-c")
	if err != nil {
		return nil, err
	}
	return ParseCounters(save, b.chains), nil
}

// Cleanup removes the jump rules and every KUBE- chain from the filter and
// nat tables, and the affinity ipsets. (The run's namespaces are deleted at
// the end anyway; this is for reuse of a namespace.)
func (b *Backend) Cleanup() error {
	save, err := b.output(Tool(b.variant, "save"))
	if err != nil {
		return err
	}
	var out strings.Builder
	var dels []string
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			out.WriteString(line + "\n")
			dels = dels[:0]
		case strings.HasPrefix(line, ":KUBE-"):
			name := strings.Fields(line[1:])[0]
			out.WriteString(":" + name + " - [0:0]\n")
			dels = append(dels, name)
		case strings.HasPrefix(line, "-A ") && strings.Contains(line, " -j KUBE-") && !strings.HasPrefix(line, "-A KUBE-"):
			out.WriteString("-D" + line[2:] + "\n")
		case line == "COMMIT":
			for _, d := range dels {
				out.WriteString("-X " + d + "\n")
			}
			out.WriteString("COMMIT\n")
		}
	}
	if err := b.run(out.String(), Tool(b.variant, "restore"), "--noflush"); err != nil {
		return fmt.Errorf("could not remove rules: %w", err)
	}
	b.jumps = false
	b.needFull = true
	b.r.Reset()
	if b.r.Config().Affinity == AffinityIPSet {
		list, err := b.output("ipset", "list", "-n")
		if err != nil {
			return err
		}
		var destroy strings.Builder
		for _, n := range strings.Fields(list) {
			if strings.HasPrefix(n, "KUBE-") {
				destroy.WriteString("destroy " + n + "\n")
			}
		}
		if destroy.Len() > 0 {
			return b.run(destroy.String(), "ipset", "restore")
		}
	}
	return nil
}

// MergeJumps adds the rules of a jump text (per table: "-A <BUILTIN> ...")
// to the table sections of a restore text, before each table's COMMIT.
func MergeJumps(restore, jumps string) string {
	perTable := map[string][]string{}
	table := ""
	for _, line := range strings.Split(jumps, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line
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
	// A table with jumps but no section in restore gets a section of its own.
	for t, js := range perTable {
		out.WriteString(t + "\n" + strings.Join(js, "\n") + "\nCOMMIT\n")
	}
	return out.String()
}
