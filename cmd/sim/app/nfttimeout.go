package app

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane/nftables"
)

// nftTimeoutFlag adds --nft-timeout, the bound on each nft transaction of
// our nftables dataplane, to a command that programs nftables.
func nftTimeoutFlag(c *cobra.Command, d *time.Duration) {
	c.Flags().DurationVar(d, "nft-timeout", 0, fmt.Sprintf(
		"bound on each nft transaction (0: derived from its size, max(%s, %s per operation)); a transaction that reaches it is stopped and the command exits 3",
		nftables.BoundFloor, nftables.BoundPerOperation))
}

// checkNFTTimeout refuses a negative --nft-timeout (exit 2).
func checkNFTTimeout(d time.Duration) error {
	if d < 0 {
		return &UsageError{Err: fmt.Errorf("--nft-timeout %s: must be 0 (derived from the transaction's size) or positive", d)}
	}
	return nil
}
