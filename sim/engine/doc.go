// Package engine reproduces, per node, the mechanism by which each kube-proxy
// mode picks an endpoint for a new connection to a Service, fast enough to
// simulate tens of millions of connections:
//
//	      Conn (src ip, src port, proto, end)
//	            │
//	            ▼
//	Node.Connect ──► Conntrack (one table per node): an entry that is
//	            │    still alive keeps its endpoint (established flow)
//	            │ miss
//	            ▼
//	Engine.Choose (one per service port, per node)
//	   iptables: recent --rcheck per endpoint, then the statistic cascade
//	   nftables: affinity sets, then numgen random mod N vmap
//	   ipvs:     persistence template, then the scheduler (rr … mh)
//	            │
//	            ▼
//	     endpoint ID, or DROP / REJECT
//
// Rules reach a node through Render (the dataplane's endpoint eligibility,
// dataplane/proxy, and each mode's choice of chain or real servers) and
// Node.Program, which a
// discrete-event simulator calls when the node's Syncer says a sync has
// finished (minSyncPeriod, burst and the sync's cost).
//
// Every random source is passed in (a math/rand/v2 PCG wrapped by Rand), so a
// seed fixes a simulation. The engines model the subject, so endpoint
// eligibility is the subject's code (dataplane/proxy, pure; nothing else from
// dataplane/), and nothing here imports sim/oracle: the oracle states what
// must happen, this package what the kernel would do, and the tests hold one
// against the other. See README.md for each engine's
// kernel source and what is and is not modelled.
package engine
