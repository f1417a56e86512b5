package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/sim/cluster"
)

type runFlags struct {
	out  outputFlag
	seed uint64
}

func newRun(s Streams) *cobra.Command {
	var f runFlags
	c := &cobra.Command{
		Use:   "run FILE",
		Short: "Simulate a scenario and print its report",
		Long: `run loads and expands the scenario, loads its objects into the cluster model
(client-go fake clientset and informers) and prints the cluster it describes:
nodes, Services, service ports, endpoints by condition and by node, policies.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.out.check(); err != nil {
				return err
			}
			var seed *uint64
			if c.Flags().Changed("seed") {
				seed = &f.seed
			}
			m, err := cluster.Open(context.Background(), args[0], seed)
			if err != nil {
				return err
			}
			defer m.Close()
			sum := cluster.Summarize(m.Expanded, m.State)
			if f.out.format == "json" {
				return writeJSON(s.Out, sum)
			}
			return sum.WriteTable(s.Out)
		},
	}
	f.out.add(c)
	c.Flags().Uint64Var(&f.seed, "seed", 0, "override the scenario's seed")
	return c
}
