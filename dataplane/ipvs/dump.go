package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Dump returns what the kernel holds for this node as canonical text, in
// four sections: the IPVS table as `ipvsadm -Ln` prints it (services and
// real servers sorted), the addresses on kube-ipvs0, the entries of
// kube-proxy's ipsets (`ipset save`, sorted), and the KUBE- part of
// `iptables-save` (rule order kept, counters and comments dropped).
func (b *Backend) Dump() (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return "", errClosed
	}
	var out strings.Builder
	out.WriteString("# ipvs\n")
	svcs, err := b.h.GetServices()
	if err != nil {
		return "", fmt.Errorf("could not list the virtual servers: %w", err)
	}
	writeHeader(&out)
	for _, s := range svcs {
		ds, err := b.h.GetDestinations(s)
		if err != nil {
			return "", fmt.Errorf("could not list the real servers of %s: %w", KeyOf(s), err)
		}
		writeService(&out, s, ds)
	}
	fmt.Fprintf(&out, "# %s\n", DummyDevice)
	addrs, err := b.sys.Addresses(DummyDevice)
	if err != nil {
		return "", err
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		fmt.Fprintf(&out, "%s/32\n", a)
	}
	out.WriteString("# ipsets\n")
	save, err := b.sys.Run("", "ipset", "save")
	if err != nil {
		return "", fmt.Errorf("could not list the ipsets: %w", err)
	}
	out.WriteString(canonicalSets(save))
	out.WriteString("# iptables\n")
	ipt, err := b.sys.Run("", b.Tool("save"))
	if err != nil {
		return "", fmt.Errorf("could not save the iptables rules: %w", err)
	}
	out.WriteString(kubeRules(ipt))
	return out.String(), nil
}

// canonicalSets keeps kube-proxy's sets from `ipset save` output: each
// set's create line (in kube-proxy's order) followed by its entries sorted.
func canonicalSets(save string) string {
	creates := map[string]string{}
	entries := map[string][]string{}
	for _, line := range strings.Split(save, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || setInfo(f[1]).name == "" {
			continue
		}
		switch f[0] {
		case "create":
			// ipset save prints a set's options in its own order and adds
			// some (bucketsize, initval); keep name and type. A create
			// without a type is not ipset's (FuzzCanonicalSets found it).
			if len(f) < 3 {
				continue
			}
			creates[f[1]] = "create " + f[1] + " " + f[2]
		case "add":
			entries[f[1]] = append(entries[f[1]], line)
		}
	}
	var b strings.Builder
	for _, n := range SetNames() {
		if c, ok := creates[n]; ok {
			b.WriteString(c + "\n")
		}
		e := entries[n]
		slices.Sort(e)
		for _, l := range e {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// kubeRules keeps the lines of iptables-save output that belong to
// kube-proxy: table headers, KUBE- chain declarations (without counters),
// rules in KUBE- chains and jumps into them, and COMMIT; tables without any
// are left out.
func kubeRules(save string) string {
	var b, table strings.Builder
	in, has := false, false
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table.Reset()
			in, has = true, false
			table.WriteString(line + "\n")
		case !in:
			// Outside a table (before its header or after its COMMIT):
			// not iptables-save's; FuzzKubeRules found such lines carried
			// into the next table.
		case strings.HasPrefix(line, ":KUBE-"):
			table.WriteString(":" + strings.Fields(line[1:])[0] + "\n")
			has = true
		case strings.HasPrefix(line, "-A KUBE-"), strings.HasPrefix(line, "-A ") && strings.Contains(line, " -j KUBE-"):
			table.WriteString(line + "\n")
			has = true
		case line == "COMMIT":
			if has {
				b.WriteString(table.String() + "COMMIT\n")
			}
			table.Reset()
			in, has = false, false
		}
	}
	return b.String()
}

// FaultMapping documents what each named fault does in IPVS mode, in
// proxy.AllFaults order.
func FaultMapping() []string {
	m := map[proxy.Fault]string{
		proxy.FaultUniformProbability:  "the last real server of each virtual server gets weight 2 (rr and lc become wrr and wlc so that the weight counts): it gets twice the others' share",
		proxy.FaultKeepNotReady:        "not-ready endpoints stay real servers of the Cluster set",
		proxy.FaultIgnoreLocalPolicy:   "Local policies use the endpoints of every node as if they were local",
		proxy.FaultAffinityNoTimeout:   fmt.Sprintf("ClientIP persistence timeout %d s (180 days) instead of timeoutSeconds", noTimeout),
		proxy.FaultKeepDeletedEndpoint: "endpoints removed from the slices stay real servers (weight 1)",
		proxy.FaultDropLastEndpoint:    "the last endpoint (by address) is never added as a real server; a lone endpoint leaves the virtual server empty (rejects)",
		proxy.FaultSkewAtMDE:           "with k real servers the first (by address) gets weight 11(k-1) and the others 10k-11 (rr and lc become wrr and wlc): wrr gives the first exactly 1.1/k of each rotation, wlc, sed and nq on average; refused with sh, dh and mh",
		proxy.FaultLocalMasquerade:     "the Local ipsets (KUBE-LOAD-BALANCER-LOCAL, KUBE-NODE-PORT-LOCAL-*, KUBE-EXTERNAL-IP-LOCAL) stay empty: external traffic under externalTrafficPolicy Local is masqueraded",
		proxy.FaultLocalIgnored:        "the external virtual servers (node ports, external and load-balancer IPs) of an externalTrafficPolicy Local Service get the cluster's real servers",
		proxy.FaultHealthCheckStale:    "the health check servers answer from the state before the last sync (mode-independent: dataplane.HealthServer)",
		proxy.FaultSourceRangesOpen:    "KUBE-SOURCE-RANGES-FIREWALL has no DROP: sources outside loadBalancerSourceRanges reach the load-balancer IPs",
		proxy.FaultHairpinNoMasquerade: "KUBE-LOOP-BACK stays empty: an endpoint reaching itself through a virtual server is not masqueraded",
		proxy.FaultNoConntrackCleanup:  "stale UDP conntrack entries are not deleted after a sync (mode-independent: dataplane/conntrack); the udp-flow check does not see it in this mode: IPVS deletes a UDP real server at once and net.ipv4.vs.expire_nodest_conn expires its connections, so the flow moves without the cleanup (measured in the microVM)",
	}
	for _, f := range []proxy.Fault{proxy.FaultAffinityLeak, proxy.FaultAffinityOverstay, proxy.FaultConntrackFlushAll} {
		m[f] = "not built (the backend refuses it): " + f.NotBuilt(cluster.ModeIPVS)
	}
	var out []string
	for _, f := range proxy.AllFaults() {
		out = append(out, string(f)+": "+m[f])
	}
	return out
}
