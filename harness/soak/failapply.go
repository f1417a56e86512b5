package soak

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/sim/cluster"
)

// FailApply makes every K-th kernel apply fail for real. It puts a wrapper
// named like the apply tool (iptables-nft-restore, iptables-legacy-restore,
// nft) first on this process's PATH; the backends find it with
// exec.LookPath as they would the tool. The wrapper counts applies under a
// lock (every node's syncer applies concurrently) and on every K-th one
// feeds the real tool its input with one line added that the tool rejects:
// a rule in a chain that does not exist (iptables-restore) or in a table
// that does not exist (nft -f). The tool itself fails, with its own
// message and exit status, and commits nothing (iptables-nft-restore and
// nft -f apply a batch atomically; the line goes in the first table of an
// iptables-legacy-restore input, before its first COMMIT). Calls that are
// not applies (nft --check, nft list, --version) pass straight through.
type FailApply struct {
	Dir   string
	Every int
	path  string // PATH before
}

// failTools are the apply tools a mode uses.
func failTools(mode cluster.Mode, variant string) []string {
	if mode == cluster.ModeNFTables {
		return []string{"nft"}
	}
	return []string{"iptables-" + variant + "-restore"}
}

// wrapperCount counts the apply under a lock, passes it through unless it
// is the K-th one (and injection is enabled), and records an injection.
const wrapperCount = `exec 9>>"$d/lock"
flock 9
n=$(( $(cat "$d/count" 2>/dev/null || echo 0) + 1 ))
echo "$n" >"$d/count"
flock -u 9
exec 9>&-
if [ $(( n %% %[3]d )) -ne 0 ] || [ ! -e "$d/enabled" ]; then
	exec "$real" "$@"
fi
echo "$n" >>"$d/injected"
`

const wrapperIPTables = `#!/bin/sh
# Written by sim soak (kpsim, harness/soak/failapply.go): every %[3]d-th apply
# fails in the real tool. Removed when the soak ends.
d=%[1]q
real=%[2]q
` + wrapperCount + `awk 'BEGIN { done = 0 }
	/^COMMIT$/ && !done { print "-A KPSIM-SOAK-NO-SUCH-CHAIN -j ACCEPT"; done = 1 }
	{ print }
	END { if (!done) print "*filter\n-A KPSIM-SOAK-NO-SUCH-CHAIN -j ACCEPT\nCOMMIT" }' | "$real" "$@"
`

const wrapperNFT = `#!/bin/sh
# Written by sim soak (kpsim, harness/soak/failapply.go): every %[3]d-th apply
# (nft -f -) fails in the real tool. Removed when the soak ends.
d=%[1]q
real=%[2]q
if [ "$#" -ne 2 ] || [ "$1" != "-f" ] || [ "$2" != "-" ]; then
	exec "$real" "$@"
fi
` + wrapperCount + `{ cat; echo "add rule ip kpsim-soak-no-such-table no-such-chain counter"; } | "$real" "$@"
`

// InstallFailApply writes the wrappers for mode's apply tools into a fresh
// directory under dir (os.TempDir when empty), puts it first on PATH and
// enables injection. Call Remove when done: it restores PATH and removes
// the directory.
func InstallFailApply(dir string, mode cluster.Mode, variant string, every int) (*FailApply, error) {
	if every < 2 {
		return nil, fmt.Errorf("could not inject apply failures: every %d: must be at least 2 (a retry must be able to succeed)", every)
	}
	for _, t := range []string{"flock", "awk", "sh"} {
		if _, err := exec.LookPath(t); err != nil {
			return nil, &MissingToolError{Tool: t, Package: map[string]string{"flock": "util-linux", "awk": "mawk", "sh": "dash"}[t]}
		}
	}
	d, err := os.MkdirTemp(dir, "kpsim-soak-failapply-")
	if err != nil {
		return nil, fmt.Errorf("could not create the apply wrapper directory: %w", err)
	}
	f := &FailApply{Dir: d, Every: every, path: os.Getenv("PATH")}
	for _, tool := range failTools(mode, variant) {
		real, err := exec.LookPath(tool)
		if err != nil {
			os.RemoveAll(d)
			return nil, &MissingToolError{Tool: tool, Package: map[bool]string{true: "nftables", false: "iptables"}[tool == "nft"]}
		}
		tmpl := wrapperIPTables
		if tool == "nft" {
			tmpl = wrapperNFT
		}
		if err := os.WriteFile(filepath.Join(d, tool), []byte(fmt.Sprintf(tmpl, d, real, every)), 0o755); err != nil {
			os.RemoveAll(d)
			return nil, fmt.Errorf("could not write the apply wrapper: %w", err)
		}
	}
	if err := f.SetEnabled(true); err != nil {
		os.RemoveAll(d)
		return nil, err
	}
	if err := os.Setenv("PATH", d+string(os.PathListSeparator)+f.path); err != nil {
		os.RemoveAll(d)
		return nil, fmt.Errorf("could not put the apply wrapper on PATH: %w", err)
	}
	return f, nil
}

// SetEnabled turns injection on or off (applies are counted either way).
func (f *FailApply) SetEnabled(on bool) error {
	p := filepath.Join(f.Dir, "enabled")
	if on {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return fmt.Errorf("could not enable apply failures: %w", err)
		}
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("could not disable apply failures: %w", err)
	}
	return nil
}

// Applies is the number of applies the wrapper has seen.
func (f *FailApply) Applies() int {
	b, err := os.ReadFile(filepath.Join(f.Dir, "count"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// Injected is the number of applies the wrapper made fail.
func (f *FailApply) Injected() int {
	b, err := os.ReadFile(filepath.Join(f.Dir, "injected"))
	if err != nil {
		return 0
	}
	return len(strings.Fields(string(b)))
}

// Remove restores PATH and deletes the wrappers.
func (f *FailApply) Remove() error {
	err := os.Setenv("PATH", f.path)
	if rerr := os.RemoveAll(f.Dir); err == nil {
		err = rerr
	}
	return err
}

// MissingToolError is a command this machine lacks.
type MissingToolError struct{ Tool, Package string }

func (e *MissingToolError) Error() string {
	return fmt.Sprintf("the %s command is missing (Debian package %s)", e.Tool, e.Package)
}
