package proxy

// IPSetMaxElem is how many client addresses one ClientIP-affinity set of the
// iptables backend's ipset layout (iptables.AffinityIPSet) holds: the sets
// are created without a maxelem (dataplane/iptables ipsetCreateLines), so
// ipset's default for hash:ip applies, and past it the kernel adds no more
// clients. The simulator (sim run) and the harness's oracle both size the
// set from here; it lives in this pure package so that the simulator does
// not link the iptables backend for one number.
const IPSetMaxElem = 65536
