package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// TestAgentImages: one binary, two images, the entrypoints the agent's
// modes need.
func TestAgentImages(t *testing.T) {
	imgs := AgentImages([]byte("agent"))
	for file, want := range map[string]struct{ name, mode string }{"echo.tar": {EchoImage, "echo"}, "prober.tar": {ProberImage, "probe"}} {
		img, ok := imgs[file]
		if !ok || img.Name != want.name || !slices.Equal(img.Entrypoint, []string{"/kpsim-agent", want.mode}) ||
			len(img.Files) != 1 || img.Files[0].Path != "/kpsim-agent" || img.Files[0].Mode != 0o755 {
			t.Errorf("%s: %+v", file, img)
		}
	}
	if len(imgs) != 2 {
		t.Errorf("%d images, want 2", len(imgs))
	}
}

// TestKubeconfig: the admin kubeconfig parses, names its context after
// the run and points at the server given.
func TestKubeconfig(t *testing.T) {
	kc := kubeconfig(ContextName("abc123"), "https://127.0.0.1:40000", []byte("-----BEGIN CERTIFICATE-----\n"), "tok")
	cfg, err := clientcmd.Load(kc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if cfg.CurrentContext != "kpsim-abc123" || ctx == nil || cfg.Clusters[ctx.Cluster].Server != "https://127.0.0.1:40000" ||
		cfg.AuthInfos[ctx.AuthInfo].Token != "tok" || string(cfg.Clusters[ctx.Cluster].CertificateAuthorityData) != "-----BEGIN CERTIFICATE-----\n" {
		t.Errorf("kubeconfig:\n%s", kc)
	}
}

func TestMissingBinaries(t *testing.T) {
	dir := t.TempDir()
	if got := MissingBinaries(dir, ProxyNone); len(got) != len(binaries) || slices.Contains(got, filepath.Join(dir, "kube-proxy")) {
		t.Errorf("empty folder, no proxy: %v", got)
	}
	os.MkdirAll(filepath.Join(dir, "cni"), 0o755)
	for _, b := range append(slices.Clone(binaries), "kube-proxy") {
		os.WriteFile(filepath.Join(dir, b), nil, 0o755)
	}
	os.Chmod(filepath.Join(dir, "kubelet"), 0o644)
	if got := MissingBinaries(dir, ProxyIPTables); !slices.Equal(got, []string{filepath.Join(dir, "kubelet")}) {
		t.Errorf("a non-executable kubelet: %v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := Config{Bin: "/b", Nodes: []string{"node-a"}}
	if err := cfg.validate(); err != nil || cfg.ProxyMode != ProxyIPTables || cfg.Agent != "/b/kpsim-agent" {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
	for _, bad := range []Config{
		{Nodes: []string{"node-a"}, ProxyMode: "ipvs"},
		{},
		{Nodes: []string{"node-a"}, RunID: "XYZ"},
		{Nodes: make([]string, maxNodes+1)},
	} {
		if err := bad.validate(); err == nil || !strings.HasPrefix(err.Error(), "could not start the cluster") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

func TestPodCIDR(t *testing.T) {
	for i, want := range []string{"10.244.0.0/24", "10.244.1.0/24", "10.244.199.0/24"} {
		if i == 2 {
			i = 199
		}
		if got := PodCIDR(i); got.String() != want || !ClusterCIDR().Contains(got.Addr()) {
			t.Errorf("PodCIDR(%d) = %s, want %s inside %s", i, got, want, ClusterCIDR())
		}
	}
}
