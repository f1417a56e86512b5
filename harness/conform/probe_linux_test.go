package conform

import (
	"context"
	"io"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// TestProbeBlocksIndependent sends 70,000 probes (three blocks) to the
// 20-endpoint ClusterIP of scenarios/conformance/many-endpoints.yaml from one
// client address, in namespaces of its own, with each mode the host can
// program, and finds one new conntrack entry per probe in every block: no
// probe followed a live entry of an earlier one. Every probe arrives, the
// observers drop nothing and the rule counters agree.
func TestProbeBlocksIndependent(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "conntrack", "iptables-nft-restore", "iptables-legacy-restore", "nft")
	l, err := scenario.LoadFile(conformanceDir + "/many-endpoints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		mode    cluster.Mode
		backend string
	}{
		{"iptables-nft", "iptables", "nft"}, {"iptables-legacy", "iptables", "legacy"}, {"nftables", "nftables", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &suite{o: Options{Mode: c.mode, IPTablesBackend: c.backend, Log: io.Discard}, l: l, out: &report.Suite{Scenario: "many-endpoints"}}
			if err := s.setup(context.Background(), proxy.Faults{}, &report.Run{}); err != nil {
				s.teardown()
				t.Fatal(err)
			}
			defer s.teardown()
			client := s.clientOn("node-a")
			prober := s.mc.(*kernelMachine).prober
			s.mc.flush()
			prober.Phase()
			const n = 70_000
			vip := netip.MustParseAddrPort("10.96.0.20:80")
			before := s.mc.counters("node-a")
			sent, err := prober.Send(context.Background(), Probe{Client: client, Src: client.Config.Addrs[0], VIP: vip, Proto: traffic.TCP, N: n}, rand.New(rand.NewPCG(1, 2)))
			if err != nil {
				t.Fatal(err)
			}
			counts := prober.Collect(sent)
			after := s.mc.counters("node-a")
			ind := counts.Independence
			t.Logf("%s: %s; observer drops %d, send errors %d; buffers %v", c.name, ind.String(),
				counts.ObserverDrops, counts.SendErrors, prober.ObserverBuffers()[:1])
			if sent != n || ind.Blocks != 3 || ind.Probes != n || ind.Entries != n || !ind.Holds() {
				t.Errorf("sent %d, proof %+v: want %d probes in 3 blocks with %d new entries", sent, ind, n, n)
			}
			arrived := 0
			for _, v := range counts.PerEndpoint() {
				arrived += v
			}
			if arrived != n || counts.ObserverDrops != 0 {
				t.Errorf("arrived %d of %d, observer drops %d", arrived, n, counts.ObserverDrops)
			}
			decided := Decided(spnWeb20, before, after)
			if l := ClassifyLoss(sent, arrived, counts.Rejected(), counts.OtherICMP, decided, counts.ObserverDrops); l.Lost != 0 || l.Environment() {
				t.Errorf("loss: %s", l.Text)
			} else {
				t.Logf("%s: rule counters decided %d: %s", c.name, decided, l.Text)
			}
			// The control: without the flush between blocks, later blocks
			// meet the live entries of earlier ones, and the count says so.
			s.mc.flush()
			prober.Phase()
			prober.Flush = func() error { return nil }
			_, err = prober.Send(context.Background(), Probe{Client: client, Src: client.Config.Addrs[0], VIP: vip, Proto: traffic.TCP, N: n}, rand.New(rand.NewPCG(1, 2)))
			ind = prober.Collect(n).Independence
			if err == nil || ind.Holds() {
				t.Errorf("without a flush between blocks the proof still holds (%v): %s", err, ind.String())
			} else {
				t.Logf("%s: control without flush: %s", c.name, ind.String())
			}
		})
	}
}
