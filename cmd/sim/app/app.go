// Package app holds the sim command's cobra commands. Each command parses its
// flags into a small struct and calls library code in sim/, dataplane/ or
// harness/; exit codes are decided here, in one place.
package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/sim/scenario"
)

// Exit codes, the project's contract for every command (README.md).
const (
	ExitOK          = 0
	ExitCheckFailed = 1
	ExitBadInput    = 2
	ExitEnvironment = 3
)

// Streams are the command's standard streams, injected for tests.
type Streams struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

// Version is set at build time with -ldflags "-X ...app.Version=...".
var Version = "dev"

// UsageError is bad usage: a wrong flag or argument (exit 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// EnvError means this machine cannot run the command: not root, a kernel
// feature or a package is missing (exit 3). What names what is missing.
type EnvError struct{ Err error }

func (e *EnvError) Error() string { return e.Err.Error() }
func (e *EnvError) Unwrap() error { return e.Err }

// CheckFailedError means the command ran and a check failed (exit 1).
type CheckFailedError struct{ Failed []string }

func (e *CheckFailedError) Error() string {
	return fmt.Sprintf("%d check(s) failed: %v", len(e.Failed), e.Failed)
}

// ExitCode maps an error to the process exit code.
func ExitCode(err error) int {
	var ue *UsageError
	var ee *EnvError
	var ce *CheckFailedError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue), scenario.IsInvalid(err):
		return ExitBadInput
	case errors.As(err, &ee):
		return ExitEnvironment
	case errors.As(err, &ce):
		return ExitCheckFailed
	}
	return ExitCheckFailed
}

// Main runs the command line and returns the exit code.
func Main(args []string, s Streams) int {
	root := NewRoot(s)
	root.SetArgs(args)
	err := root.Execute()
	if err != nil && strings.HasPrefix(err.Error(), "unknown command") {
		err = &UsageError{Err: err}
	}
	if err != nil {
		fmt.Fprintln(s.Err, "error:", err.Error())
	}
	return ExitCode(err)
}

// extraCommands lets each command file register itself from init(), so that
// adding a command does not touch this file:
//
//	func init() { extraCommands = append(extraCommands, newRules) }
var extraCommands []func(Streams) *cobra.Command

// NewRoot builds the sim command tree.
func NewRoot(s Streams) *cobra.Command {
	root := &cobra.Command{
		Use:   "sim",
		Short: "Model, program and check Kubernetes Service load balancing",
		Long: `sim reads scenarios (Kubernetes objects, generators, traffic, events, checks)
and either simulates kube-proxy's iptables, nftables and IPVS modes (sim run),
or sweeps a scenario over Service counts for capacity planning (sim capacity),
or programs them for real in network namespaces and checks them with traffic.

Exit codes: 0 success; 1 a check failed; 2 bad input or usage;
3 this environment cannot run it (the message says what is missing).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &UsageError{Err: fmt.Errorf("%w (see %s --help)", err, c.CommandPath())}
	})
	root.AddCommand(newVersion(s), newValidate(s), newRun(s))
	for _, nc := range extraCommands {
		root.AddCommand(nc(s))
	}
	for _, c := range root.Commands() {
		if c.Args == nil {
			c.Args = cobra.NoArgs
		}
		wrapArgs(c)
	}
	return root
}

// wrapArgs turns cobra's argument errors into usage errors.
func wrapArgs(c *cobra.Command) {
	check := c.Args
	c.Args = func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &UsageError{Err: fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())}
		}
		return nil
	}
}

// outputFlag is the -o flag of commands that print results.
type outputFlag struct{ format string }

func (o *outputFlag) add(c *cobra.Command) {
	c.Flags().StringVarP(&o.format, "output", "o", "table", "output format: table or json")
}

func (o *outputFlag) check() error {
	if o.format != "table" && o.format != "json" {
		return &UsageError{Err: fmt.Errorf("unknown output format %q: use table or json", o.format)}
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newVersion(s Streams) *cobra.Command {
	var o outputFlag
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the version of sim",
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if o.format == "json" {
				return writeJSON(s.Out, map[string]string{"version": Version, "scenarioAPIVersion": scenario.APIVersion})
			}
			fmt.Fprintf(s.Out, "sim %s (scenarios %s)\n", Version, scenario.APIVersion)
			return nil
		},
	}
	o.add(c)
	return c
}
