// Command pause is the pod sandbox's process of the local cluster's nodes
// (harness/cluster): it holds the pod's namespaces, reaps the orphans
// re-parented to it, and exits 0 on SIGINT or SIGTERM, as Kubernetes'
// build/pause/linux/pause.c does. It is built static (CGO_ENABLED=0) and
// packed into the image kpsim.local/pause by harness/cluster.WriteImage, so
// no node ever pulls a sandbox image from a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		os.Stdout.WriteString("pause (kpsim)\n")
		return
	}
	if os.Getpid() != 1 {
		os.Stderr.WriteString("pause: warning: not pid 1\n")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
