package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/harness/vm"
)

func init() { extraCommands = append(extraCommands, newVM) }

// newVM is the hidden `sim vm` command: the microVM runner's plumbing
// (fetch the kernel and busybox into the cache, build the image, boot it
// once and time it). `sim conform --vm` is the way to run checks in it.
func newVM(s Streams) *cobra.Command {
	var o vm.Options
	var noFetch bool
	c := &cobra.Command{
		Use:    "vm",
		Short:  "MicroVM runner plumbing: fetch, boot",
		Hidden: true,
	}
	c.PersistentFlags().StringVar(&o.CacheDir, "cache", "", "cache directory (default $KPSIM_VM_CACHE, $XDG_CACHE_HOME/kpsim/vm or ~/.cache/kpsim/vm)")
	c.PersistentFlags().BoolVar(&noFetch, "no-fetch", false, "never download the kernel or busybox")
	c.PersistentFlags().IntVar(&o.MemoryMB, "memory", 1024, "guest memory in MB")
	c.PersistentFlags().DurationVar(&o.Timeout, "timeout", 30*time.Minute, "bound on the whole VM run")
	envErr := func(err error) error {
		var me *vm.MissingError
		if errors.As(err, &me) {
			return &EnvError{Err: err}
		}
		return err
	}
	fetch := &cobra.Command{
		Use:   "fetch",
		Short: "Download the Debian kernel and busybox into the cache (apt-get download, dpkg-deb -x) and build the image",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			dir := o.CacheDir
			if dir == "" {
				var err error
				if dir, err = vm.CacheDir(); err != nil {
					return err
				}
			}
			a, err := vm.Prepare(c.Context(), dir, !noFetch, s.Err)
			if err != nil {
				return envErr(err)
			}
			sim, err := os.Executable()
			if err != nil {
				return err
			}
			img, err := vm.BuildImage(a, sim, s.Err)
			if err != nil {
				return envErr(err)
			}
			fmt.Fprintf(s.Out, "kernel  %s\nmodules %s\nbusybox %s\nimage   %s (%d modules)\n", a.Kernel, a.Modules, a.Busybox, img.Path, len(img.Modules))
			return nil
		},
	}
	boot := &cobra.Command{
		Use:   "boot [-- SIM-ARGS...]",
		Short: "Boot the VM, run sim SIM-ARGS (default: version) and report the boot times",
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{"version"}
			}
			o.NoFetch = noFetch
			o.Log = s.Err
			ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, _, err := vm.Run(ctx, args, nil, o)
			if err != nil {
				return envErr(err)
			}
			fmt.Fprintf(s.Out, "accel %s, init started %.2f s, ready %.2f s (guest uptime %.2f s), total %.2f s, exit %d\n",
				res.Accel, res.Booted.Seconds(), res.Ready.Seconds(), res.GuestUptimeReady, res.Wall.Seconds(), res.ExitCode)
			if res.ExitCode != 0 {
				return fmt.Errorf("sim exited %d in the VM", res.ExitCode)
			}
			return nil
		},
	}
	c.AddCommand(fetch, boot)
	c.SetContext(context.Background())
	return c
}
