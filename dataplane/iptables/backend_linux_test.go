package iptables_test

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/cluster"
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
	ctx := context.Background()
	m, err := cluster.Open(ctx, "../../scenarios/conformance/distribution.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	id, _ := netns.NewRunID()
	cfg, err := netns.ConfigFromModel(m, id)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := netns.Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	backends := map[string]*iptables.Backend{}
	for _, n := range topo.Nodes() {
		b, err := iptables.NewBackend(n.NS, iptables.Config{NodeName: n.Config.Name, ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16")}, variant)
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
	counts := map[netip.AddrPort]int{}
	total := 0
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
	cs, err := backends["node-a"].Counters()
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
	var _ dataplane.Backend = backends["node-a"]
}
