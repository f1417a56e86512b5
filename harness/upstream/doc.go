// Package upstream runs the real thing: etcd and kube-apiserver in a run's
// control-plane namespace, and the unmodified kube-proxy binary in node
// namespaces, watching that apiserver over the run's fabric, as it runs in
// a cluster. The harness writes Services and EndpointSlices with a real
// clientset (Client) and waits on kube-proxy's own sync metrics (Settle),
// never on the rules under test.
//
// Every process starts inside its namespace (netns.Namespace.Start), in a
// process group of its own, with SIGKILL as its parent-death signal, its
// output in a log file in the run folder. Every HTTP connection the harness
// opens (client-go, /readyz, /metrics) is dialled from inside the target
// namespace. kube-proxy always gets --conntrack-max-per-core=0 (the
// conntrack hash size is global to the machine and writable from a
// namespace) and a private /run (its own mount namespace), so the xtables
// lock is the node's own. See README.md.
package upstream
