// Package testenv decides, in one place, whether a test that needs root, a
// command, a kernel feature or a fetched asset runs here. Without it the
// test skips with a message saying why and how to get it; under `make test`
// (KPSIM_REQUIRE_ALL=1) a missing requirement is a failure instead, so the
// full gate can never pass by skipping. It is the only place in the
// repository that calls Skip: every other test goes through it.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// UpstreamSource returns the path of a file of the pinned
// k8s.io/kubernetes release's source (rel, e.g.
// "pkg/proxy/iptables/proxier_test.go") in the Go module cache, where
// `make upstream` leaves it (the release pinned in
// harness/upstream/tools/kubernetes/go.mod). Without it the test skips (or
// fails under make test) saying how to get it.
func UpstreamSource(t testing.TB, rel string) string {
	t.Helper()
	dir, err := upstreamDir()
	if err != nil {
		skipOrFail(t, "needs the source of the pinned k8s.io/kubernetes release in the Go module cache (run make upstream): "+err.Error())
		return ""
	}
	path := filepath.Join(dir, filepath.FromSlash(rel))
	if _, err := os.Stat(path); err != nil {
		skipOrFail(t, "needs the source of the pinned k8s.io/kubernetes release in the Go module cache (run make upstream): "+err.Error())
	}
	return path
}

// upstreamDir is the module cache folder of the pinned k8s.io/kubernetes.
func upstreamDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	const nested = "harness/upstream/tools/kubernetes/go.mod"
	var mod []byte
	for d := wd; ; d = filepath.Dir(d) {
		if mod, err = os.ReadFile(filepath.Join(d, filepath.FromSlash(nested))); err == nil {
			break
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no %s above %s", nested, wd)
		}
	}
	version := ""
	for _, l := range strings.Split(string(mod), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "k8s.io/kubernetes" {
			version = f[1]
		}
	}
	if version == "" {
		return "", fmt.Errorf("%s requires no k8s.io/kubernetes", nested)
	}
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "k8s.io", "kubernetes@"+version)
	if _, err := os.Stat(dir); err != nil {
		return "", err
	}
	return dir, nil
}
