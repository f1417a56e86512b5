// Package differential compares, rule for rule, what upstream kube-proxy and
// our dataplane program on a node for the same API objects.
//
// Both sides watch one real kube-apiserver (harness/upstream's control plane
// in the run's control-plane namespace). Upstream is the unmodified
// kube-proxy binary in a node namespace; ours is dataplane/backends.New
// synced from a tracker over the same API (sim/apiserver.Connect), in a
// scratch node namespace of the same run, configured with the upstream
// node's name. Each side is read back from its namespace with the same
// command (iptables mode: iptables-save, every IPv4 table; nftables mode:
// nft list table ip kube-proxy), normalized (Normalize) and diffed (Diff).
//
// Generate draws seeded random scenarios (Services and EndpointSlices with
// 2-5 steps of changes) so that many of them run at once in one API, each
// in its own Kubernetes namespace d-<seed>; the test in this package runs
// them and every file of scenarios/ in both modes. `sim rules --subject
// kube-proxy|--listed|--diff` uses the same engine for one scenario file.
package differential
