package app

import (
	"strings"
	"testing"
)

// TestConformSubjectUsage: what the kube-proxy subject cannot run is a
// usage error (exit 2) that names why, before any environment check.
func TestConformSubjectUsage(t *testing.T) {
	const file = "../../../scenarios/conformance/distribution.yaml"
	for _, c := range []struct {
		args []string
		why  string
	}{
		{[]string{"--subject", "kube-proxy", "--mode", "ipvs"}, "--mode ipvs"},
		{[]string{"--subject", "kube-proxy", "--fault", "uniform-probability"}, "--fault"},
		{[]string{"--subject", "kube-proxy", "--mode", "nftables", "--layout", "fast"}, "--layout fast"},
		{[]string{"--subject", "kube-proxy", "--affinity", "ipset"}, "--affinity ipset"},
		{[]string{"--subject", "kube-proxy", "--calibrate", "3"}, "--calibrate"},
		{[]string{"--subject", "kube-proxy", "--vm"}, "--vm"},
		{[]string{"--subject", "kube-proxi"}, "unknown --subject"},
		{[]string{"--kube-proxy", "/bin/true"}, "--kube-proxy is for --subject kube-proxy"},
	} {
		args := append([]string{"conform", file}, c.args...)
		code, _, errs := run(args...)
		if code != ExitBadInput || !strings.Contains(errs, c.why) {
			t.Errorf("sim %v: exit %d, want %d with %q (stderr %q)", args, code, ExitBadInput, c.why, errs)
		}
	}
}

// TestConformSubjectMissingBinaries: without etcd, kube-apiserver and
// kube-proxy beside the binary (a test binary has none), the kube-proxy
// subject exits 3 saying how to build them.
func TestConformSubjectMissingBinaries(t *testing.T) {
	code, _, errs := run("conform", "../../../scenarios/conformance/distribution.yaml", "--subject", "kube-proxy")
	if code != ExitEnvironment || !strings.Contains(errs, "make upstream") {
		t.Errorf("exit %d, want %d with how to build (stderr %q)", code, ExitEnvironment, errs)
	}
}
