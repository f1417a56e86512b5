package cluster

import (
	"os"
	"path/filepath"
)

// BuildHint is how to get the binaries a cluster runs.
const BuildHint = "build them with `make upstream cluster-tools`"

// binaries are the programs in Bin a cluster runs (CNI plugins in cni/):
// make upstream's etcd and kube-apiserver, make cluster-tools' others.
var binaries = []string{
	"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
	"containerd", "containerd-shim-runc-v2", "ctr", "runc", "pause",
	"cni/ptp", "cni/host-local", "cni/loopback",
}

// MissingBinaries lists the programs Up needs in bin that are missing or
// not executable (kube-proxy too unless proxyMode is ProxyNone); the
// agent is optional and not listed.
func MissingBinaries(bin, proxyMode string) []string {
	names := binaries
	if proxyMode != ProxyNone {
		names = append(names[:len(names):len(names)], "kube-proxy")
	}
	var missing []string
	for _, n := range names {
		p := filepath.Join(bin, n)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, p)
		}
	}
	return missing
}
