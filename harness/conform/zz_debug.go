package conform

import (
	"context"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/dataplane/netns"
	"os/exec"
)

func debugDump(s *suite) {
	if os.Getenv("KPSIM_DEBUG_DUMP") == "" || s.topo == nil {
		return
	}
	_ = exec.Command("cp", "-r", netns.RunDir(s.topo.RunID()), "/tmp/f-rundir").Run()
	if k, ok := s.px.(*kubeProxies); ok && k.cp != nil {
		f, _ := os.Create("/tmp/f-dump-api.txt")
		svcs, err := k.cp.Client().CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
		fmt.Fprintln(f, err)
		for _, x := range svcs.Items {
			fmt.Fprintf(f, "%s/%s %v %v %v\n", x.Namespace, x.Name, x.Spec.ClusterIP, x.Labels, x.Spec.Type)
		}
		sl, err := k.cp.Client().DiscoveryV1().EndpointSlices("").List(context.Background(), metav1.ListOptions{})
		fmt.Fprintln(f, err)
		for _, x := range sl.Items {
			fmt.Fprintf(f, "%s/%s %v %d\n", x.Namespace, x.Name, x.Labels, len(x.Endpoints))
		}
		f.Close()
	}
	for _, n := range s.topo.Nodes() {
		f, _ := os.Create("/tmp/f-dump-" + n.Config.Name + ".txt")
		for _, args := range [][]string{{"iptables-save", "-c"}, {"nft", "list", "ruleset"}, {"ip", "route"}, {"ip", "addr"}, {"conntrack", "-L"}} {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Stdout, cmd.Stderr = f, f
			_ = n.NS.Run(cmd)
		}
		f.Close()
	}
}
