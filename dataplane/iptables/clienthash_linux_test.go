package iptables_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/traffic"
)

// TestClientBucketInKernel checks proxy.ClientBucket, which the tracers
// use to know which clients the affinity-leak and affinity-overstay faults
// affect, against the kernel: one SYN from each of 64 source addresses goes
// out of a node namespace through counting rules, per address, that match
// bucket 0 of 10 and of 2 with the faults' seed, written with iptables'
// cluster match (both iptables backends) and nftables' jhash. Each counter
// must be 1 exactly when ClientBucket says bucket 0.
func TestClientBucketInKernel(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft", "iptables-nft", "iptables-legacy")
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
	ns := topo.Nodes()[0].NS
	var srcs []netip.Addr
	for i := range 64 {
		srcs = append(srcs, netip.AddrFrom4([4]byte{10, 1, byte(i / 7), byte(37*i + 1)}))
	}
	dst := netip.MustParseAddrPort("198.18.0.1:9")
	var ipt, nft strings.Builder
	fmt.Fprintf(&nft, "table ip kpsim-hash {\n chain out {\n  type filter hook output priority 0;\n")
	for _, n := range []int{proxy.LeakBuckets, proxy.OverstayBuckets} {
		for _, s := range srcs {
			fmt.Fprintf(&ipt, "-A OUTPUT -s %s/32 -p tcp --dport 9 -m cluster --cluster-total-nodes %d --cluster-local-node 1 --cluster-hash-seed %#x -m comment --comment \"%s/%d\"\n",
				s, n, proxy.ClientHashSeed, s, n)
			fmt.Fprintf(&nft, "  ip saddr %s tcp dport 9 jhash ip saddr mod %d seed %#x == 0 counter comment \"%s/%d\"\n", s, n, proxy.ClientHashSeed, s, n)
		}
	}
	nft.WriteString(" }\n}\n")
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, v := range []string{iptables.VariantNFT, iptables.VariantLegacy} {
		if out, err := ns.Exec(iptables.Tool(v, "restore"), "--noflush", write(v+".rules", "*filter\n"+ipt.String()+"COMMIT\n")); err != nil {
			t.Fatalf("%s refused the cluster match: %v\n%s", iptables.Tool(v, "restore"), err, out)
		}
	}
	if out, err := ns.Exec("nft", "-f", write("hash.nft", nft.String())); err != nil {
		t.Fatalf("nft refused jhash: %v\n%s", err, out)
	}
	var snd *traffic.Sender
	if err := ns.Do(func() (err error) { snd, err = traffic.OpenSender(); return }); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	bl := traffic.NewBuilder()
	for i, s := range srcs {
		pkt, err := bl.Build(traffic.TCP, netip.AddrPortFrom(s, 40000), dst, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := snd.Send(pkt, dst.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	iptRule := regexp.MustCompile(`^\[(\d+):\d+\] -A OUTPUT .*--comment "?([0-9.]+/\d+)"?`)
	nftRule := regexp.MustCompile(`counter packets (\d+) bytes \d+ comment "([0-9.]+/\d+)"`)
	for _, tool := range []string{iptables.Tool(iptables.VariantNFT, "save"), iptables.Tool(iptables.VariantLegacy, "save"), "nft"} {
		args, re := []string{"-c", "-t", "filter"}, iptRule
		if tool == "nft" {
			args, re = []string{"list", "chain", "ip", "kpsim-hash", "out"}, nftRule
		}
		out, err := ns.Exec(tool, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, out)
		}
		got := map[string]int{}
		for _, l := range strings.Split(string(out), "\n") {
			if m := re.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
				got[m[2]], _ = strconv.Atoi(m[1])
			}
		}
		if len(got) != 2*len(srcs) {
			t.Fatalf("%s: %d counting rules, want %d\n%s", tool, len(got), 2*len(srcs), out)
		}
		hits := 0
		for _, n := range []uint32{proxy.LeakBuckets, proxy.OverstayBuckets} {
			for _, s := range srcs {
				want := 0
				if proxy.ClientBucket(s, n) == 0 {
					want = 1
				}
				if c := got[fmt.Sprintf("%s/%d", s, n)]; c != want {
					t.Errorf("%s: %s in bucket 0 of %d: kernel counted %d, ClientBucket says %d", tool, s, n, c, want)
				}
				hits += want
			}
		}
		t.Logf("%s: %d of %d rules matched, as ClientBucket predicts", tool, hits, 2*len(srcs))
	}
}

// TestMDEFaultsLoadInNamespace: the rules of the faults at the detection
// limit (alone and together) load into a node namespace with both iptables
// backends and both affinity layouts, and iptables-save gives back the
// cluster matches and the skewed probability.
func TestMDEFaultsLoadInNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	faults := []proxy.Fault{proxy.FaultSkewAtMDE, proxy.FaultAffinityLeak, proxy.FaultAffinityOverstay}
	for _, variant := range []string{iptables.VariantNFT, iptables.VariantLegacy} {
		for _, layout := range []iptables.AffinityMode{iptables.AffinityRecent, iptables.AffinityIPSet} {
			t.Run(variant+"/"+string(layout), func(t *testing.T) {
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
				st := calibrate.Synthetic(6, 50)
				for _, n := range st.SortedServicePorts()[:3] {
					st.Services[n].ClientIPAffinity, st.Services[n].AffinityTimeout = true, 600
				}
				// libxt_statistic prints the kernel's probability with %.11f.
				q, err := iptables.QuantizedProbability(iptables.SkewProbability(50))
				if err != nil {
					t.Fatal(err)
				}
				skewSaved := fmt.Sprintf("--probability %.11f -j", q)
				for _, fs := range append(splitFaults(faults), faults) {
					set := proxy.Faults{}
					for _, f := range fs {
						set[f] = true
					}
					b, err := iptables.NewBackend(topo.Nodes()[0].NS, iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-1", Faults: set}, Affinity: layout}, variant)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := b.Sync(st, nil, true); err != nil {
						t.Fatalf("faults %v: %v", fs, err)
					}
					save, err := b.Dump()
					if err != nil {
						t.Fatal(err)
					}
					for _, f := range fs {
						want := map[proxy.Fault]string{
							proxy.FaultSkewAtMDE:        skewSaved,
							proxy.FaultAffinityLeak:     "-m cluster",
							proxy.FaultAffinityOverstay: "-m cluster",
						}[f]
						if !strings.Contains(save, want) {
							t.Errorf("faults %v: iptables-save has no %q:\n%s", fs, want, save)
						}
					}
					if err := b.Cleanup(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

func splitFaults(fs []proxy.Fault) [][]proxy.Fault {
	var out [][]proxy.Fault
	for _, f := range fs {
		out = append(out, []proxy.Fault{f})
	}
	return out
}
