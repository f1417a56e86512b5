package app

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/sim/scenario"
)

func init() { extraCommands = append(extraCommands, newImport) }

type importFlags struct {
	out   string
	force bool
}

func newImport(s Streams) *cobra.Command {
	var f importFlags
	c := &cobra.Command{
		Use:   "import FILE -o SCENARIO",
		Short: "Write a runnable scenario around a cluster dump (kubectl get -o yaml)",
		Long: `import reads what kubectl get nodes,pods,svc,endpointslices -A -o yaml prints
for a real cluster (a v1 List, one kind, one object or several documents) and
writes a scenario around it: the cluster section inferred to cover the
addresses the objects use, default proxy settings (iptables mode), a traffic
section (one client on every node) and default checks (a distribution or
affinity check on every Service port with ready endpoints in pod networks),
then the dump's documents unchanged under objects. sim validate, sim run and
sim conform accept the result; edit it to taste.

The warnings (what was inferred, what is accepted and not modelled: IPv6 and
FQDN slices, the IPv6 half of dual-stack Services) go to stderr. An existing
file is not overwritten without --force; the file is written atomically
(a temporary file renamed into place). Exit 2 on bad input, nothing written.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if f.out == "" {
				return &UsageError{Err: errors.New("give the scenario to write with -o FILE")}
			}
			if !f.force {
				if _, err := os.Lstat(f.out); err == nil {
					return &UsageError{Err: fmt.Errorf("%s exists; pass --force to overwrite it", f.out)}
				} else if !errors.Is(err, fs.ErrNotExist) {
					return &EnvError{Err: fmt.Errorf("could not check %s: %w", f.out, err)}
				}
			}
			data, err := os.ReadFile(args[0])
			if err != nil {
				return scenario.ErrorList{{File: args[0], Message: "could not read the dump: " + err.Error()}}
			}
			text, l, err := scenario.Import(args[0], data, f.out)
			if err != nil {
				return err
			}
			printWarnings(s.Err, l.Warnings)
			if err := writeAtomic(f.out, text); err != nil {
				return &EnvError{Err: err}
			}
			fmt.Fprintf(s.Out, "wrote %s: %d objects, %d checks (sim validate %s; sim run %s)\n", f.out, len(l.Scenario.Objects), len(l.Scenario.Checks), f.out, f.out)
			return nil
		},
	}
	c.Flags().StringVarP(&f.out, "output", "o", "", "the scenario file to write")
	c.Flags().BoolVar(&f.force, "force", false, "overwrite the file if it exists")
	return c
}

// writeAtomic writes data to a temporary file beside path and renames it
// into place, so that a reader sees the old file or the whole new one.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	name := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(name)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	if err := os.Chmod(name, 0o644); err != nil {
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		return fmt.Errorf("could not write %s: %w", path, err)
	}
	ok = true
	return nil
}
