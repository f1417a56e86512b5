package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/testenv"
)

// Binaries are the paths of the three upstream programs a run starts.
type Binaries struct{ Etcd, APIServer, KubeProxy string }

// Names of the binaries in bin/, as `make upstream` writes them.
const (
	EtcdName      = "etcd"
	APIServerName = "kube-apiserver"
	KubeProxyName = "kube-proxy"
)

// BuildHint is how to get the binaries, quoted by MissingError.
const BuildHint = "build them with `make upstream` (about 10 minutes on two cores the first time)"

// MissingError says which binaries are missing. Callers turn it into exit
// code 3 (this environment cannot run it).
type MissingError struct {
	// Paths are the missing (or non-executable) paths.
	Paths []string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("missing upstream binaries: %s; %s", strings.Join(e.Paths, ", "), BuildHint)
}

// Find locates etcd, kube-apiserver and kube-proxy beside the running
// executable (filepath.Dir(os.Executable()): bin/ next to bin/sim).
// kubeProxy, when non-empty, overrides kube-proxy (any kube-proxy build: a
// developer's own). A missing binary gives a *MissingError naming every
// missing path.
func Find(kubeProxy string) (Binaries, error) {
	exe, err := os.Executable()
	if err != nil {
		return Binaries{}, fmt.Errorf("could not locate the running executable: %w", err)
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	return findIn(filepath.Dir(exe), kubeProxy)
}

// findIn is Find with the folder given.
func findIn(dir, kubeProxy string) (Binaries, error) {
	b := Binaries{
		Etcd:      filepath.Join(dir, EtcdName),
		APIServer: filepath.Join(dir, APIServerName),
		KubeProxy: filepath.Join(dir, KubeProxyName),
	}
	if kubeProxy != "" {
		abs, err := filepath.Abs(kubeProxy)
		if err != nil {
			return Binaries{}, fmt.Errorf("could not resolve %s: %w", kubeProxy, err)
		}
		b.KubeProxy = abs
	}
	var missing []string
	for _, p := range []string{b.Etcd, b.APIServer, b.KubeProxy} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return Binaries{}, &MissingError{Paths: missing}
	}
	return b, nil
}

// FindForTest locates the binaries in the repository's bin/ (the folder
// beside the go.mod found walking up from the working directory). When
// they are missing it skips through testenv (a failure under make test).
func FindForTest(t testing.TB) Binaries {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := findIn(filepath.Join(root, "bin"), "")
	var me *MissingError
	if errors.As(err, &me) {
		testenv.Require(t, false, me.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// repoRoot walks up from the working directory to the main module's go.mod
// (nested modules under harness/upstream/tools are skipped by name).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("could not find the repository root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(data, []byte("module github.com/kpsim/kpsim\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("could not find the repository root: no go.mod of github.com/kpsim/kpsim above the working directory")
		}
		dir = parent
	}
}

// Version runs `kube-proxy --version` and returns the version it prints
// after "Kubernetes " (e.g. "v1.37.2").
func (b Binaries) Version() (string, error) {
	out, err := exec.Command(b.KubeProxy, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("could not run %s --version: %w: %s", b.KubeProxy, err, bytes.TrimSpace(out))
	}
	return parseVersion(string(out))
}

func parseVersion(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Kubernetes "); ok && v != "" {
			return strings.Fields(v)[0], nil
		}
	}
	return "", fmt.Errorf("could not read the version from kube-proxy --version: %q", strings.TrimSpace(out))
}
