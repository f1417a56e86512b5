package cluster

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func testSpec(dir string) (NodeFiles, NodeSpec) {
	return NodeFiles{Dir: filepath.Join(dir, "node-a")}, NodeSpec{Name: "node-a", IP: netip.MustParseAddr("198.18.0.1"),
		CgroupRoot: "/process_api/x/kpsim-3fa9c1/node-a/pods", Bin: "/k/bin", CNIBin: "/k/bin/cni"}
}

// TestKubeletConfig: the settings this machine kind needs are there, with
// the values the first runs needed (see the comments in node.go).
func TestKubeletConfig(t *testing.T) {
	f, s := testSpec(t.TempDir())
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(kubeletConfig(f, s)), &cfg); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"kind": "KubeletConfiguration", "failCgroupV1": false, "cgroupDriver": "cgroupfs",
		"cgroupRoot": s.CgroupRoot, "protectKernelDefaults": true, "seccompDefault": false, "resolvConf": "",
		"oomScoreAdj": float64(0), "readOnlyPort": float64(0), "address": "198.18.0.1",
		"volumePluginDir": f.VolumePluginDir(), "staticPodPath": f.ManifestsDir(),
		"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
	}
	for k, v := range want {
		if cfg[k] != v {
			t.Errorf("%s = %v (%T), want %v", k, cfg[k], cfg[k], v)
		}
	}
}

func TestContainerdConfig(t *testing.T) {
	f, s := testSpec(t.TempDir())
	c := containerdConfig(f, s)
	for _, line := range []string{
		"version = 3", "sandbox = '" + PauseImage + "'", "BinaryName = '/k/bin/runc'", "SystemdCgroup = false",
		"restrict_oom_score_adj = true", "bin_dirs = ['/k/bin/cni']", "conf_dir = '" + f.CNIConfDir() + "'",
		"path = '" + f.OptDir() + "'",
	} {
		if !strings.Contains(c, line) {
			t.Errorf("containerd.toml has no %q:\n%s", line, c)
		}
	}
}

// TestWriteNodeFiles: the kernel tunables' files hold the values the
// kubelet wants (so protectKernelDefaults passes without a write), and the
// launcher binds every one of them.
func TestWriteNodeFiles(t *testing.T) {
	f, s := testSpec(t.TempDir())
	if err := WriteNodeFiles(f, s, "kubeconfig"); err != nil {
		t.Fatal(err)
	}
	env := strings.Join(LauncherEnv(f, s, []string{"/sys/fs/cgroup/pids/x/cgroup.procs"}), "\n")
	for _, tn := range kernelTunables {
		data, err := os.ReadFile(filepath.Join(f.SysctlDir(), strings.ReplaceAll(tn.key, "/", ".")))
		if err != nil || strings.TrimSpace(string(data)) != tn.value {
			t.Errorf("tunable %s: %q, %v; want %s", tn.key, data, err, tn.value)
		}
		if !strings.Contains(env, tn.key) {
			t.Errorf("the launcher does not bind %s", tn.key)
		}
	}
	id, _ := os.ReadFile(f.MachineID())
	if len(strings.TrimSpace(string(id))) != 32 {
		t.Errorf("machine ID %q", id)
	}
	if err := WriteCNIConfig(f, netip.MustParsePrefix("10.244.1.0/24")); err != nil {
		t.Fatal(err)
	}
	conf, _ := os.ReadFile(filepath.Join(f.CNIConfDir(), "10-kpsim.conflist"))
	var c struct {
		Plugins []struct {
			Type   string
			IPMasq bool `json:"ipMasq"`
			IPAM   struct {
				Type   string
				Ranges [][]struct{ Subnet string }
			}
		}
	}
	if err := yaml.Unmarshal(conf, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Plugins) != 1 || c.Plugins[0].Type != "ptp" || c.Plugins[0].IPMasq || c.Plugins[0].IPAM.Type != "host-local" ||
		c.Plugins[0].IPAM.Ranges[0][0].Subnet != "10.244.1.0/24" {
		t.Errorf("CNI configuration %s", conf)
	}
}
