package iptables_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/apiserver"
)

// TestBackendInNamespaces programs kube-proxy's rules in real node
// namespaces and sends real SYNs from a client pod namespace to a ClusterIP:
// every probe reaches one of the three endpoints, the split passes a
// chi-square test against uniform, and the rule counters agree with what the
// backends counted. It runs for both iptables backends.
func TestBackendInNamespaces(t *testing.T) {
	testenv.RequireRoot(t)
	for _, variant := range []string{iptables.VariantNFT, iptables.VariantLegacy} {
		t.Run(variant, func(t *testing.T) {
			testenv.RequireCommands(t, iptables.Tool(variant, "restore"), iptables.Tool(variant, "save"), "ip")
			runBackend(t, variant)
		})
	}
}

func runBackend(t *testing.T, variant string) {
	topo, backends := syncedDistribution(t, variant)
	counts, total, n := probeDistribution(t, variant, topo)
	checkDistribution(t, backends["node-a"], counts, total, n)
	var _ dataplane.Backend = backends["node-a"]
}

// syncedDistribution builds the topology of the distribution scenario and
// syncs an iptables Backend of the variant into each node, checking that
// iptables-save shows the rules and the jumps as written.
func syncedDistribution(t *testing.T, variant string) (*netns.Topology, map[string]*iptables.Backend) {
	ctx := context.Background()
	m, err := apiserver.Open(ctx, "../../scenarios/conformance/distribution.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	id, _ := netns.NewRunID()
	cfg, err := topology.FromModel(m, id)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := netns.Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Close() })
	backends := map[string]*iptables.Backend{}
	for _, n := range topo.Nodes() {
		b, err := iptables.NewBackend(n.NS, iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: n.Config.Name, ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16")}}, variant)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Sync(m.State, nil, true); err != nil {
			t.Fatal(err)
		}
		backends[n.Config.Name] = b
	}
	save, err := backends["node-a"].Dump()
	if err != nil || !strings.Contains(save, "KUBE-SVC-") {
		t.Fatalf("iptables-save in the node namespace: %v\n%s", err, save)
	}
	// After a failed sync the Backend looks for its jump rules in
	// iptables-save's output: this variant must print them as written.
	if missing := iptables.MissingJumps(backends["node-a"].LastRuleset.Jumps, save); strings.Contains(missing, "-A ") {
		t.Errorf("iptables-save does not print the jump rules as the Backend writes them; missing:\n%s", missing)
	}
	return topo, backends
}

// probeDistribution sends n new connections to the Service from a client
// pod on node-a and counts their arrivals at each endpoint address.
func probeDistribution(t *testing.T, variant string, topo *netns.Topology) (counts map[netip.AddrPort]int, total, sent int) {
	ctx := context.Background()
	var client *netns.Client
	for _, c := range topo.Clients() {
		if c.Node == "node-a" {
			client = c
		}
	}
	var snd *traffic.Sender
	if err := client.NS.Do(func() (err error) { snd, err = traffic.OpenSender(); return }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	var mu sync.Mutex
	counts = map[netip.AddrPort]int{}
	ctx2, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, n := range topo.Nodes() {
		var o *traffic.Observer
		if err := n.Backends.Do(func() (err error) { o, err = traffic.OpenObserver(unix.IPPROTO_TCP); return }); err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = o.Run(ctx2, func(pkt []byte) {
				if a, err := traffic.ParseArrival(pkt); err == nil {
					mu.Lock()
					counts[a.Dst]++
					total++
					mu.Unlock()
				}
			})
		}()
	}
	const n = 30000
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	bl := traffic.NewBuilder()
	src := client.Config.Addrs[0]
	start := time.Now()
	for i := 0; i < n; i++ {
		pkt, err := bl.Build(traffic.TCP, netip.AddrPortFrom(src, uint16(16384+i)), vip, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := snd.Send(pkt, vip.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		done := total >= n
		mu.Unlock()
		if done {
			break
		}
	}
	cancel()
	wg.Wait()
	t.Logf("%s: %d new connections through DNAT in %s (%.0f/s, one sender)", variant, n, elapsed, n/elapsed.Seconds())
	return counts, total, n
}

// checkDistribution checks that every probe arrived, that the split over
// the three endpoints is uniform, and that node-a's DNAT counters witness
// the arrivals.
func checkDistribution(t *testing.T, b *iptables.Backend, counts map[netip.AddrPort]int, total, n int) {
	eps := []netip.AddrPort{netip.MustParseAddrPort("10.244.0.10:8080"), netip.MustParseAddrPort("10.244.0.11:8080"), netip.MustParseAddrPort("10.244.1.10:8080")}
	obs := make([]float64, len(eps))
	sum := 0
	for i, e := range eps {
		obs[i] = float64(counts[e])
		sum += counts[e]
	}
	if sum != n || total != n {
		t.Fatalf("%d probes sent, %d arrived at the endpoints (%d in all): %v", n, sum, total, counts)
	}
	res, err := stats.ChiSquareGOF(obs, stats.Uniform(3))
	if err != nil {
		t.Fatal(err)
	}
	if res.P < 0.001 {
		t.Errorf("split %v is not uniform: p = %g", obs, res.P)
	}
	// The witness: the SEP chains' DNAT counters on node-a equal the arrivals.
	cs, err := b.Counters()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, c := range cs {
		if c.ServicePort.String() == "demo/web:http" && c.Endpoint != "" {
			got[c.Endpoint] += c.Packets
		}
	}
	for i, e := range eps {
		if got[e.String()] != uint64(obs[i]) {
			t.Errorf("rule counter for %s = %d, backends counted %.0f (all counters %+v)", e, got[e.String()], obs[i], cs)
		}
	}
}

// breakingCommands are the real commands, but an armed restore gets a rule
// jumping to a missing chain at the end of its nat section, so that the
// kernel refuses nat (iptables-legacy-restore has committed filter by then).
type breakingCommands struct {
	iptables.Commands
	armed bool
}

func (c *breakingCommands) Restore(input string, counters bool) error {
	if c.armed {
		c.armed = false
		i := strings.LastIndex(input, "COMMIT\n")
		input = input[:i] + "-A KUBE-SERVICES -j KUBE-NO-SUCH-CHAIN\n" + input[i:]
	}
	return c.Commands.Restore(input, counters)
}

// TestBackendRecoversInNamespace: in a real node namespace, a sync that
// deletes Services and endpoints and adds others fails in nat; the next
// sync leaves the kernel with the chains (and rule counts), affinity sets
// and jump rules of a fresh sync, for both iptables backends.
func TestBackendRecoversInNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	for _, variant := range []string{iptables.VariantNFT, iptables.VariantLegacy} {
		t.Run(variant, func(t *testing.T) {
			testenv.RequireCommands(t, iptables.Tool(variant, "restore"), iptables.Tool(variant, "save"), "ipset", "ip")
			id, err := netns.NewRunID()
			if err != nil {
				t.Fatal(err)
			}
			topo, err := netns.Build(context.Background(), &netns.Config{RunID: id, Nodes: []netns.NodeConfig{{Name: "node-1",
				Addr: netip.MustParsePrefix("198.18.0.1/16"), PodCIDR: netip.MustParsePrefix("10.128.0.0/24"), Gateway: netip.MustParseAddr("10.128.0.1")}}})
			if err != nil {
				t.Fatal(err)
			}
			defer topo.Close()
			cfg := iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-1", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}, Affinity: iptables.AffinityIPSet}
			cmds := &breakingCommands{Commands: iptables.NamespaceCommands(topo.Nodes()[0].NS, variant)}
			b, err := iptables.NewBackendWithCommands(cmds, cfg)
			if err != nil {
				t.Fatal(err)
			}
			st := calibrate.Synthetic(12, 3)
			names := st.SortedServicePorts()
			for _, n := range names[:6] {
				st.Services[n].ClientIPAffinity, st.Services[n].AffinityTimeout = true, 10800
			}
			if _, err := b.Sync(st, nil, true); err != nil {
				t.Fatal(err)
			}
			// B: three Services gone (two with affinity), an endpoint
			// gone, two new Services.
			for _, n := range names[4:7] {
				delete(st.Services, n)
				delete(st.Endpoints, n)
			}
			st.Endpoints[names[8]] = st.Endpoints[names[8]][1:]
			more := calibrate.Synthetic(14, 2)
			for _, n := range more.SortedServicePorts()[12:] {
				st.Services[n], st.Endpoints[n] = more.Services[n], more.Endpoints[n]
				st.Services[n].ClientIPAffinity, st.Services[n].AffinityTimeout = true, 60
			}
			cmds.armed = true
			if _, err := b.Sync(st, st.SortedServicePorts(), false); err == nil {
				t.Fatal("the broken restore did not fail")
			}
			if _, err := b.Sync(st, nil, true); err != nil {
				t.Fatalf("sync after the failure: %v", err)
			}
			save, err := b.Dump()
			if err != nil {
				t.Fatal(err)
			}
			sets, err := cmds.IPSetNames()
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(sets)
			fc := iptables.NewFakeCommands()
			fresh, err := iptables.NewBackendWithCommands(fc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fresh.Sync(st, nil, true); err != nil {
				t.Fatal(err)
			}
			if got, want := chainSummary(save), chainSummary(fc.Fake.Dump()); got != want {
				t.Errorf("kernel chains after recovery (-fresh +kernel):\n%s", dataplanetest.Diff(want, got))
			}
			wantSets, _ := fc.IPSetNames()
			if got, want := strings.Join(sets, " "), strings.Join(wantSets, " "); got != want {
				t.Errorf("kernel ipsets after recovery %q, want %q", got, want)
			}
		})
	}
}

// chainSummary lists, per table, every chain with its rule count and every
// rule of a built-in chain (the jumps), of filter and nat, sorted:
// iptables-save and the fake
// print rules differently (the kernel quantises probabilities), not these.
func chainSummary(save string) string {
	count := map[string]int{}
	var lines []string
	table := ""
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case table != "filter" && table != "nat":
		case strings.HasPrefix(l, ":"):
			count[table+" "+strings.Fields(l[1:])[0]] += 0
		case strings.HasPrefix(l, "-A "):
			chain := strings.Fields(l)[1]
			count[table+" "+chain]++
			if !strings.HasPrefix(chain, "KUBE-") {
				lines = append(lines, table+" "+l)
			}
		}
	}
	for k, n := range count {
		lines = append(lines, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
