package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// BenchmarkRenderFull renders a first full sync of n service ports x 10
// endpoints into a transaction (no apply).
func BenchmarkRenderFull(b *testing.B) {
	for _, layout := range layouts {
		for _, n := range []int{1000, 5000} {
			b.Run(fmt.Sprintf("%s/%d", layout, n), func(b *testing.B) {
				st := bigState(n, 10)
				ops := 0
				for b.Loop() {
					r, err := NewRenderer(testConfig(layout))
					if err != nil {
						b.Fatal(err)
					}
					tx, _, err := r.Render(st, nil, true)
					if err != nil {
						b.Fatal(err)
					}
					ops = tx.NumOperations()
				}
				b.ReportMetric(float64(ops), "ops")
			})
		}
	}
}

// BenchmarkFullSyncFake renders a first full sync and runs it into a
// knftables.Fake. The Fake's own cost dominates: it looks each new element
// up linearly in its map, so that filling a map of m elements costs O(m^2)
// (service-ips: m = n; the fast layout's cluster-ip-endpoints-tcp: m = 10 n,
// about half a minute at 1000 and over ten at 5000, so the fast layout runs
// at 1000 only). BenchmarkRenderFull is the renderer alone.
func BenchmarkFullSyncFake(b *testing.B) {
	for _, layout := range layouts {
		for _, n := range []int{1000, 5000} {
			if layout == LayoutFast && n > 1000 {
				continue
			}
			b.Run(fmt.Sprintf("%s/%d", layout, n), func(b *testing.B) {
				st := bigState(n, 10)
				ops := 0
				for b.Loop() {
					f := knftables.NewFake(knftables.IPv4Family, DefaultTable)
					be, err := NewBackend(testConfig(layout), f, BackendOptions{})
					if err != nil {
						b.Fatal(err)
					}
					res, err := be.Sync(st, nil, true)
					if err != nil {
						b.Fatal(err)
					}
					ops = res.Lines
				}
				b.ReportMetric(float64(ops), "ops")
			})
		}
	}
}

// BenchmarkPartialOneEndpoint changes one endpoint of one service port at
// n service ports x 10 endpoints: the render alone at 1000 and 5000, and
// the render plus the Fake's run at 1000 (the Fake copies the whole table on
// every transaction, and loading 5000 x 10 into it for the fast layout's
// 50 000-element map takes minutes: see BenchmarkFullSyncFake).
func BenchmarkPartialOneEndpoint(b *testing.B) {
	for _, layout := range layouts {
		for _, c := range []struct {
			n     int
			apply bool
		}{{1000, false}, {5000, false}, {1000, true}} {
			mode := "render"
			if c.apply {
				mode = "render+fake"
			}
			b.Run(fmt.Sprintf("%s/%s/%d", layout, mode, c.n), func(b *testing.B) {
				st := bigState(c.n, 10)
				f := knftables.NewFake(knftables.IPv4Family, DefaultTable)
				be, err := NewBackend(testConfig(layout), f, BackendOptions{})
				if err != nil {
					b.Fatal(err)
				}
				tx, _, err := be.r.Render(st, nil, true)
				if err != nil {
					b.Fatal(err)
				}
				if c.apply {
					if err := f.Run(context.Background(), tx); err != nil {
						b.Fatal(err)
					}
				}
				be.r.Commit()
				i := c.n / 2
				spn := name(fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc%d", i), "http")
				ips := []netip.Addr{netip.MustParseAddr("10.200.0.1"), netip.MustParseAddr("10.200.0.2")}
				ops, k := 0, 0
				for b.Loop() {
					eps := slices.Clone(st.Endpoints[spn])
					e := *eps[0]
					e.IP = ips[k%2]
					k++
					eps[0] = &e
					st.Endpoints[spn] = eps
					tx, stats, err := be.r.Render(st, []cluster.ServicePortName{spn}, false)
					if err != nil {
						b.Fatal(err)
					}
					if c.apply {
						if err := f.Run(context.Background(), tx); err != nil {
							b.Fatal(err)
						}
					}
					be.r.Commit()
					ops = stats.Operations
				}
				b.ReportMetric(float64(ops), "ops")
			})
		}
	}
}

// BenchmarkNFTLoad times `nft -f` of a first full sync into a fresh network
// namespace (root and nft needed; it skips otherwise). Run it with
// -bench NFTLoad -benchtime 1x: the kube-proxy layout takes tens of seconds
// at 5000.
func BenchmarkNFTLoad(b *testing.B) {
	testenv.RequireRoot(b)
	testenv.RequireCommands(b, "nft")
	nft, err := exec.LookPath("nft")
	if err != nil {
		b.Fatal(err)
	}
	for _, layout := range layouts {
		for _, n := range []int{1000, 3000, 5000} {
			b.Run(fmt.Sprintf("%s/%d", layout, n), func(b *testing.B) {
				r, err := NewRenderer(testConfig(layout))
				if err != nil {
					b.Fatal(err)
				}
				tx, _, err := r.Render(bigState(n, 10), nil, true)
				if err != nil {
					b.Fatal(err)
				}
				p := filepath.Join(b.TempDir(), "full.nft")
				if err := os.WriteFile(p, []byte(tx.String()), 0o600); err != nil {
					b.Fatal(err)
				}
				var total time.Duration
				for b.Loop() {
					start := time.Now()
					out, err := exec.Command("unshare", "--net", nft, "-f", p).CombinedOutput()
					total += time.Since(start)
					if err != nil {
						b.Fatalf("%v: %s", err, out)
					}
				}
				b.ReportMetric(float64(tx.NumOperations()), "ops")
				b.ReportMetric(total.Seconds()/float64(b.N), "s/load")
			})
		}
	}
}
