// Package testenv decides, in one place, whether a test that needs root or a
// kernel feature runs here. Without the privilege it skips with a message
// saying why; under `make test` (KPSIM_REQUIRE_ALL=1) a missing privilege is
// a failure instead, so the full gate can never pass by skipping.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// RequireAllEnv is the variable `make test` sets to turn skips into failures.
const RequireAllEnv = "KPSIM_REQUIRE_ALL"

// Strict reports whether skips are failures in this run.
func Strict() bool { return os.Getenv(RequireAllEnv) == "1" }

func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if Strict() {
		t.Fatalf("cannot run under %s=1: %s", RequireAllEnv, why)
	}
	t.Skip(why)
}

// RequireRoot skips (or fails under make test) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root: creates network namespaces and programs netfilter inside them (run make test as root)")
	}
}

// RequireCommands skips (or fails) unless every named command is on PATH.
func RequireCommands(t testing.TB, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			skipOrFail(t, "needs the "+c+" command (make test installs it with apt-get)")
		}
	}
}
