package cluster

import (
	"errors"
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	for _, m := range Modes() {
		got, err := ParseMode(string(m))
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %q, %v", m, got, err)
		}
	}
	_, err := ParseMode("userspace")
	if !errors.Is(err, ErrUnknownMode) {
		t.Fatalf("ParseMode(userspace): %v, want ErrUnknownMode", err)
	}
	if !strings.Contains(err.Error(), "iptables, nftables, ipvs") {
		t.Errorf("error %q does not name the valid modes", err)
	}
	if ModeList() != "iptables, nftables, ipvs" {
		t.Errorf("ModeList() = %q", ModeList())
	}
}
