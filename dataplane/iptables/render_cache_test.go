package iptables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// TestRenderCacheMatchesFreshRenderer: a renderer that reuses its previous
// outputs (chain-name hashes, unchanged service ports, the sorted order)
// renders exactly what a new renderer renders, through random changes of
// Services, endpoints, policies and affinity, for both affinity modes.
func TestRenderCacheMatchesFreshRenderer(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := testConfig()
			cfg.Affinity = mode
			cfg.LargeClusterThreshold = -1
			rng := rand.New(rand.NewPCG(7, uint64(len(mode))))
			st := cacheTestState(rng, 40)
			r := mustRenderer(t, cfg)
			for step := 0; step < 30; step++ {
				changed := cacheTestMutate(rng, st)
				// Alternately a partial render told about every change,
				// and a full one.
				rs, err := r.Render(st, changed, step%2 == 0)
				if err != nil {
					t.Fatal(err)
				}
				r.Commit(rs)
				// Nothing is stale now: the text must be a fresh renderer's.
				again, _ := r.Render(st, nil, true)
				r.Commit(again)
				want, _ := mustRenderer(t, cfg).Render(st, nil, true)
				if again.Restore != want.Restore || again.IPSetRestore != want.IPSetRestore {
					t.Fatalf("step %d: cached render differs from a fresh one:\n%s", step, lineDiff(want.Restore+want.IPSetRestore, again.Restore+again.IPSetRestore))
				}
				if len(again.Stale)+len(again.StaleSets) != 0 {
					t.Fatalf("step %d: stale after a committed render: %v %v", step, again.Stale, again.StaleSets)
				}
				if again.NATRules != want.NATRules || again.NATChains != want.NATChains || again.Lines != want.Lines {
					t.Fatalf("step %d: counts differ", step)
				}
				for _, m := range []*ChainMap{rs.Chains, again.Chains} {
					if m.Len() != want.Chains.Len() {
						t.Fatalf("step %d: chain map has %d names, want %d", step, m.Len(), want.Chains.Len())
					}
					for _, f := range strings.Fields(want.Restore + " " + want.IPSetRestore) {
						f = strings.TrimPrefix(f, ":")
						if w, ok := want.Chains.Chain(f); ok {
							if g, _ := m.Chain(f); g != w {
								t.Fatalf("step %d: Chain(%s) = %v, want %v", step, f, g, w)
							}
						}
					}
				}
			}
		})
	}
}

func cacheTestState(rng *rand.Rand, n int) *cluster.State {
	st := newState()
	for i := 0; i < n; i++ {
		cacheTestAdd(rng, st, i)
	}
	return st
}

func cacheTestAdd(rng *rand.Rand, st *cluster.State, i int) cluster.ServicePortName {
	n := name(fmt.Sprintf("ns%d", rng.IntN(4)), fmt.Sprintf("svc%d", i), []string{"http", "", "dns"}[rng.IntN(3)])
	if rng.IntN(4) == 0 {
		n.Protocol = corev1.ProtocolUDP
	}
	sp := clusterIPPort(n, netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)}).String(), 80)
	if rng.IntN(3) == 0 {
		sp.Type, sp.NodePort, sp.ExternalLocal = corev1.ServiceTypeNodePort, int32(30000+i), rng.IntN(2) == 0
	}
	sp.InternalLocal = rng.IntN(4) == 0
	sp.ClientIPAffinity, sp.AffinityTimeout = rng.IntN(3) == 0, 10800
	var eps []*cluster.Endpoint
	for j := range rng.IntN(25) {
		node, flags := thisNode, []string{"R", "R", "ST", "T", ""}[rng.IntN(5)]
		if rng.IntN(2) == 0 {
			node = otherNode
		}
		eps = append(eps, ep(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(j + 1)}).String(), 8080, node, flags))
	}
	if rng.IntN(3) == 0 {
		rng.Shuffle(len(eps), func(a, b int) { eps[a], eps[b] = eps[b], eps[a] })
	}
	add(st, sp, eps...)
	return n
}

// cacheTestMutate changes a few service ports and returns their names.
func cacheTestMutate(rng *rand.Rand, st *cluster.State) []cluster.ServicePortName {
	var changed []cluster.ServicePortName
	names := st.SortedServicePorts()
	for range 1 + rng.IntN(5) {
		n := names[rng.IntN(len(names))]
		if st.Services[n] == nil { // deleted a moment ago
			continue
		}
		c := *st.Services[n]
		eps := slices.Clone(st.Endpoints[n])
		switch rng.IntN(8) {
		case 0:
			delete(st.Services, n)
			delete(st.Endpoints, n)
			changed = append(changed, n)
			continue
		case 1:
			n = cacheTestAdd(rng, st, 1000+rng.IntN(1000))
			changed = append(changed, n)
			continue
		case 2:
			if len(eps) > 0 {
				eps = eps[1:]
			}
		case 3:
			if len(eps) > 0 {
				e := *eps[len(eps)-1]
				e.Ready, e.Serving = !e.Ready, !e.Ready
				eps[len(eps)-1] = &e
			}
		case 4:
			c.AffinityTimeout += 10
		case 5:
			c.InternalLocal = !c.InternalLocal
		case 6:
			c.Headless = !c.Headless
		case 7:
			eps = append(eps, ep(netip.AddrFrom4([4]byte{10, 250, byte(rng.IntN(256)), byte(rng.IntN(256))}).String(), 8080, thisNode, "R"))
		}
		st.Services[n] = &c
		st.Endpoints[n] = eps
		changed = append(changed, n)
	}
	return changed
}
