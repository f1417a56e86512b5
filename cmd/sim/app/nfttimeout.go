package app

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane/nftables"
)

// nftTimeoutFlag adds --nft-timeout, the bound on each nft transaction of
// our nftables dataplane, to a command that programs nftables. A negative
// value is refused while the flags are parsed (bad input, exit 2).
func nftTimeoutFlag(c *cobra.Command, d *time.Duration) {
	c.Flags().Var((*nftTimeout)(d), "nft-timeout", fmt.Sprintf(
		"bound on each nft transaction (0: derived from its size, max(%s, %s per operation)); a transaction that reaches it is stopped and the command exits 3",
		nftables.BoundFloor, nftables.BoundPerOperation))
}

// nftTimeout is a time.Duration flag that refuses negative values.
type nftTimeout time.Duration

func (t *nftTimeout) String() string { return time.Duration(*t).String() }
func (t *nftTimeout) Type() string   { return "duration" }

func (t *nftTimeout) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("%s: must be 0 (derived from the transaction's size) or positive", d)
	}
	*t = nftTimeout(d)
	return nil
}
