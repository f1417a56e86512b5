package app

import (
	"strings"
	"testing"
)

// TestNFTTimeoutFlag: the commands that program nftables take --nft-timeout,
// and a negative one is bad input (exit 2, while the flags are parsed), named in
// the message.
func TestNFTTimeoutFlag(t *testing.T) {
	const sc = "../../../scenarios/1000-services.yaml"
	for _, args := range [][]string{
		{"calibrate", "--mode", "nftables", "--nft-timeout", "-1s"},
		{"conform", sc, "--mode", "nftables", "--nft-timeout", "-1s"},
		{"rules", sc, "--mode", "nftables", "--listed", "--nft-timeout", "-1s"},
	} {
		code, _, errs := run(args...)
		if code != ExitBadInput || !strings.Contains(errs, `"--nft-timeout" flag: -1s: must be 0`) {
			t.Errorf("sim %v: exit %d, stderr %q; want %d naming --nft-timeout", args, code, errs, ExitBadInput)
		}
	}
	for _, cmd := range []string{"calibrate", "conform", "rules"} {
		code, out, _ := run(cmd, "--help")
		if code != 0 || !strings.Contains(out, "--nft-timeout duration") {
			t.Errorf("sim %s --help: exit %d, no --nft-timeout in\n%s", cmd, code, out)
		}
	}
}
