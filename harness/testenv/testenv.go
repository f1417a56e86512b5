// Package testenv decides, in one place, whether a test that needs root, a
// command, a kernel feature or a fetched asset runs here. Without it the
// test skips with a message saying why and how to get it; under `make test`
// (KPSIM_REQUIRE_ALL=1) a missing requirement is a failure instead, so the
// full gate can never pass by skipping. It is the only place in the
// repository that calls Skip: every other test goes through it.
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

// skipOrFail is the one skip of the repository.
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

// Require skips (or fails) unless ok. why says what is missing and how to
// get it, e.g. "no kernel in the VM cache (run sim vm fetch or make
// test-vm)". It is for requirements the helpers above do not name: a
// kernel feature, a fetched asset.
func Require(t testing.TB, ok bool, why string) {
	t.Helper()
	if !ok {
		skipOrFail(t, why)
	}
}

// SkipIfShort skips a long test under -short; why says what it would do.
// Under make test, which never passes -short, -short with
// KPSIM_REQUIRE_ALL=1 is a contradiction and fails.
func SkipIfShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		skipOrFail(t, "-short: "+why)
	}
}
