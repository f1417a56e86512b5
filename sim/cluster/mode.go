package cluster

import (
	"errors"
	"fmt"
	"strings"
)

// Mode is a kube-proxy proxy mode, spelled as kube-proxy's --proxy-mode
// spells it. It is a string so that scenario files, flags and reports keep
// that spelling when they carry it.
type Mode string

// The modes, in the canonical order Modes returns.
const (
	// ModeIPTables is kube-proxy's iptables mode.
	ModeIPTables Mode = "iptables"
	// ModeNFTables is kube-proxy's nftables mode.
	ModeNFTables Mode = "nftables"
	// ModeIPVS is kube-proxy's IPVS mode.
	ModeIPVS Mode = "ipvs"
)

// Modes returns every mode in the canonical order: iptables, nftables, ipvs.
func Modes() []Mode { return []Mode{ModeIPTables, ModeNFTables, ModeIPVS} }

// ErrUnknownMode is wrapped by ParseMode's error.
var ErrUnknownMode = errors.New("unknown mode")

// ParseMode reads a mode as kube-proxy's --proxy-mode spells it. Its error
// wraps ErrUnknownMode and names the valid values.
func ParseMode(s string) (Mode, error) {
	m := Mode(s)
	if m.Valid() {
		return m, nil
	}
	return "", fmt.Errorf("%w %q (valid: %s)", ErrUnknownMode, s, ModeList())
}

// Valid reports whether m is one of Modes.
func (m Mode) Valid() bool {
	switch m {
	case ModeIPTables, ModeNFTables, ModeIPVS:
		return true
	}
	return false
}

// ModeList is the modes joined with ", " in the canonical order, for help
// and error texts.
func ModeList() string { return JoinModes(Modes(), ", ") }

// JoinModes joins the modes' names with sep, as strings.Join does.
func JoinModes(ms []Mode, sep string) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = string(m)
	}
	return strings.Join(names, sep)
}
