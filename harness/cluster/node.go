package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// kernelTunables are the host-wide sysctls kubelet 1.37 sets at start
// (setupKernelTunables in pkg/kubelet/cm/container_manager_linux.go) and
// the values it wants. They are not per network namespace: the node's
// launcher bind-mounts a file holding the wanted value over each one in the
// node's own mount namespace, and the kubelet runs with
// protectKernelDefaults: true, so it only reads them and fails to start,
// rather than write the host's, if a bind mount is missing.
var kernelTunables = []struct{ key, value string }{
	{"vm/overcommit_memory", "1"},
	{"vm/panic_on_oom", "0"},
	{"kernel/panic", "10"},
	{"kernel/panic_on_oops", "1"},
	{"kernel/keys/root_maxkeys", "1000000"},
	{"kernel/keys/root_maxbytes", "25000000"},
}

// NodeFiles are a node's configuration and state folders on the host,
// under the run's folder; the launcher binds the state folders over the
// default paths in the node's mount namespace, so containerd, the kubelet
// and the CNI plugins keep their defaults (/var/lib/..., /run/containerd)
// and the host's own folders are never written.
type NodeFiles struct {
	Dir string // <run dir>/node-a
}

func (f NodeFiles) path(elem ...string) string {
	return filepath.Join(append([]string{f.Dir}, elem...)...)
}

// Paths of a node's files.
func (f NodeFiles) ContainerdConfig() string  { return f.path("containerd.toml") }
func (f NodeFiles) KubeletConfig() string     { return f.path("kubelet.yaml") }
func (f NodeFiles) KubeletKubeconfig() string { return f.path("kubelet.kubeconfig") }
func (f NodeFiles) CNIConfDir() string        { return f.path("cni-conf") }
func (f NodeFiles) ImagesDir() string         { return f.path("images") }
func (f NodeFiles) ManifestsDir() string      { return f.path("manifests") }
func (f NodeFiles) VarLib() string            { return f.path("var-lib") }
func (f NodeFiles) VarLog() string            { return f.path("var-log") }
func (f NodeFiles) MachineID() string         { return f.path("machine-id") }
func (f NodeFiles) SysctlDir() string         { return f.path("sysctl") }
func (f NodeFiles) VolumePluginDir() string   { return f.path("volume-plugins") }
func (f NodeFiles) OptDir() string            { return f.path("opt") }

// NodeSpec is what a node's files say.
type NodeSpec struct {
	Name string
	// IP is the node's address on the fabric (--node-ip, the kubelet's
	// serving address).
	IP netip.Addr
	// CgroupRoot is the kubelet's cgroupRoot (the cgroup path of the node's
	// pods: <run cgroup>/<node>/pods).
	CgroupRoot string
	// Bin is the folder of containerd, its shim, ctr, runc and kubelet;
	// CNIBin the CNI plugins'.
	Bin, CNIBin string
}

// WriteNodeFiles creates the node's folders and writes containerd's and
// the kubelet's configuration, a machine ID and the kernel tunables' files.
// The kubelet's kubeconfig and the CNI configuration come later
// (WriteCNIConfig: once the node has its pod CIDR).
func WriteNodeFiles(f NodeFiles, s NodeSpec, kubeconfig string) error {
	for _, d := range []string{f.Dir, f.CNIConfDir(), f.ImagesDir(), f.ManifestsDir(), f.VarLib(), f.VarLog(), f.SysctlDir(), f.VolumePluginDir(), f.OptDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("could not create %s: %w", d, err)
		}
	}
	id, err := newToken16()
	if err != nil {
		return err
	}
	files := map[string]string{
		f.ContainerdConfig():  containerdConfig(f, s),
		f.KubeletConfig():     kubeletConfig(f, s),
		f.KubeletKubeconfig(): kubeconfig,
		f.MachineID():         id + "\n",
	}
	for _, t := range kernelTunables {
		files[filepath.Join(f.SysctlDir(), strings.ReplaceAll(t.key, "/", "."))] = t.value + "\n"
	}
	for p, data := range files {
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			return fmt.Errorf("could not write %s: %w", p, err)
		}
	}
	return nil
}

// containerdConfig is containerd 2.x's configuration (version 3): state
// under /run (a tmpfs of the node's mount namespace), the pinned local
// pause image (the kubelet has no sandbox image flag any more; pinning also
// keeps it from image GC), runc by path with the cgroupfs driver (no
// systemd here), the CNI plugins' folder and the node's conf folder, no TCP
// streaming port outside the node, and the opt plugin's folder in the run.
//
// restrict_oom_score_adj: this machine kind's bounding set lacks
// CAP_SYS_RESOURCE, so no process may lower its oom_score_adj; runc's
// nsexec failed every sandbox with "failed to update
// /proc/self/oom_score_adj: Permission denied" (the sandbox asks for -998).
// Restricted, containerd raises every container's score to at least its
// own, which is allowed.
func containerdConfig(f NodeFiles, s NodeSpec) string {
	return fmt.Sprintf(`version = 3
root = '/var/lib/containerd'
state = '/run/containerd'

[grpc]
  address = '/run/containerd/containerd.sock'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '%[1]s'

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '%[2]s'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    tolerate_missing_hugetlb_controller = true
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '%[3]s'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['%[4]s']
      conf_dir = '%[5]s'
`, f.OptDir(), PauseImage, filepath.Join(s.Bin, "runc"), s.CNIBin, f.CNIConfDir())
}

// kubeletConfig is the kubelet's configuration for a cgroup v1 host
// (failCgroupV1: false; cgroupfs driver; the node's own cgroupRoot, which
// must exist in every hierarchy), kernel tunables checked, not written
// (protectKernelDefaults, see kernelTunables), no DNS from the host
// (resolvConf ""), no image GC (the images are imported, not pulled) and
// eviction thresholds low enough for a host every node shares. oomScoreAdj
// 0: the kubelet cannot lower its own score here (no CAP_SYS_RESOURCE, see
// containerdConfig).
func kubeletConfig(f NodeFiles, s NodeSpec) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
cgroupsPerQOS: true
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
staticPodPath: %[2]s
volumePluginDir: %[3]s
address: %[4]s
readOnlyPort: 0
oomScoreAdj: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
protectKernelDefaults: true
failSwapOn: true
seccompDefault: false
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
serializeImagePulls: false
`, s.CgroupRoot, f.ManifestsDir(), f.VolumePluginDir(), s.IP)
}

// WriteCNIConfig writes the node's CNI network: ptp with host-local
// addresses from the node's pod CIDR, each pod's default route via its
// gateway on the node (the same shape as the harness's own pod veths), no
// masquerading (kube-proxy's rules do that). containerd reports the
// network ready once this file exists.
func WriteCNIConfig(f NodeFiles, podCIDR netip.Prefix) error {
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kpsim",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "%s"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, podCIDR.Masked())
	p := filepath.Join(f.CNIConfDir(), "10-kpsim.conflist")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("could not write the CNI configuration: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("could not write the CNI configuration: %w", err)
	}
	return nil
}

// launcher is the node's first process, run as
// `unshare --mount --uts --propagation private sh -c launcher kpsim-node`
// inside the node's network namespace. It joins the node's daemon cgroup,
// makes the node's mount namespace (a private /run; the run's folders over
// /var/lib and /var/log; its own machine ID; the kernel tunables' files over
// /proc/sys; everything shared inside it, as on a real node, and private
// from the host), starts containerd, imports the images, starts the kubelet
// and waits. Its environment: KPSIM_NODE, KPSIM_DIR (NodeFiles.Dir),
// KPSIM_BIN, KPSIM_NODE_IP, KPSIM_CGROUP_PROCS (the daemon cgroup's
// cgroup.procs files), KPSIM_TUNABLES.
const launcher = `set -eu
for f in $KPSIM_CGROUP_PROCS; do echo $$ > "$f"; done
hostname "$KPSIM_NODE"
mount -t tmpfs -o mode=0755,size=256m kpsim-run /run
mount --bind "$KPSIM_DIR/var-lib" /var/lib
mount --bind "$KPSIM_DIR/var-log" /var/log
mount --bind "$KPSIM_DIR/machine-id" /etc/machine-id
for s in $KPSIM_TUNABLES; do
  mount --bind "$KPSIM_DIR/sysctl/$(echo "$s" | tr / .)" "/proc/sys/$s"
done
mount --make-rshared /
echo "launcher: mount namespace ready"
"$KPSIM_BIN/containerd" --config "$KPSIM_DIR/containerd.toml" > "$KPSIM_DIR/containerd.log" 2>&1 &
i=0
while [ ! -S /run/containerd/containerd.sock ]; do
  i=$((i+1)); [ $i -le 300 ] || { echo "launcher: containerd made no socket within 30 s" >&2; exit 1; }
  sleep 0.1
done
echo "launcher: containerd up"
for img in "$KPSIM_DIR"/images/*.tar; do
  "$KPSIM_BIN/ctr" -a /run/containerd/containerd.sock -n k8s.io images import "$img"
done
echo "launcher: images imported"
"$KPSIM_BIN/kubelet" --config="$KPSIM_DIR/kubelet.yaml" --kubeconfig="$KPSIM_DIR/kubelet.kubeconfig" \
  --hostname-override="$KPSIM_NODE" --node-ip="$KPSIM_NODE_IP" --v=2 > "$KPSIM_DIR/kubelet.log" 2>&1 &
echo "launcher: kubelet started"
wait
`

// LauncherArgs is the node launcher's command line.
func LauncherArgs() []string {
	return []string{"unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", launcher, "kpsim-node"}
}

// LauncherEnv is the node launcher's environment.
func LauncherEnv(f NodeFiles, s NodeSpec, procsFiles []string) []string {
	var keys []string
	for _, t := range kernelTunables {
		keys = append(keys, t.key)
	}
	return []string{
		"KPSIM_NODE=" + s.Name,
		"KPSIM_DIR=" + f.Dir,
		"KPSIM_BIN=" + s.Bin,
		"KPSIM_NODE_IP=" + s.IP.String(),
		"KPSIM_CGROUP_PROCS=" + strings.Join(procsFiles, " "),
		"KPSIM_TUNABLES=" + strings.Join(keys, " "),
		"PATH=" + s.Bin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	}
}
