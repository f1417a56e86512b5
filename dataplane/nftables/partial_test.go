package nftables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// sortedDump is a Fake dump with its lines sorted: element order inside a
// map depends on insertion order, which differs between a partial and a
// full sync of the same state.
func sortedDump(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	slices.Sort(l)
	return strings.Join(l, "\n")
}

// ops lists a transaction's operations, one per line, without the table
// prefix ("add chain service-...").
func ops(tx string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(tx), "\n") {
		if l != "" {
			out = append(out, strings.Replace(l, " ip kube-proxy", "", 1))
		}
	}
	return out
}

// TestPartialOneEndpoint: adding one endpoint to one service port sends only
// that service port's chains and elements.
func TestPartialOneEndpoint(t *testing.T) {
	want := map[Layout][]string{
		// The endpoints are inline in the service chain: one chain
		// rewritten, whatever the number of endpoints.
		LayoutKubeProxy: {
			"add chain service-42NFTM6N-ns2/svc2/tcp/p80",
			"flush chain service-42NFTM6N-ns2/svc2/tcp/p80",
			"add rule service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 4 map { 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 , 2 : 10.180.1.7 . 80 , 3 : 10.180.1.8 . 80 }",
		},
		// svc2 was the only service port with 3 endpoints: its shared
		// selection chain goes, the one for 4 comes.
		LayoutFast: {
			"flush chain cluster-ip-tcp-3",
			"delete element service-ips { 172.30.0.42 . tcp . 80 }",
			"add chain cluster-ip-tcp-4",
			"add rule cluster-ip-tcp-4 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
			"add rule cluster-ip-tcp-4 meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 4 map @cluster-ip-endpoints-tcp",
			"add element cluster-ip-endpoints-tcp { 172.30.0.42 . tcp . 80 . 3 : 10.180.1.8 . 80 }",
			"add element service-ips { 172.30.0.42 . tcp . 80 : goto cluster-ip-tcp-4 }",
			"delete chain cluster-ip-tcp-3",
		},
	}
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			st := overallState()
			b, f := load(t, testConfig(layout), st)
			spn := name("ns2", "svc2", "p80")
			st.Endpoints[spn] = append(slices.Clone(st.Endpoints[spn]), ep("10.180.1.8", 80, otherNode, "R"))
			tx, stats := sync(t, b, st, []cluster.ServicePortName{spn}, false)
			if got := ops(tx); !slices.Equal(got, want[layout]) {
				t.Errorf("transaction:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want[layout], "\n"))
			}
			if stats.Full || stats.ServicePorts != 1 || stats.Operations != len(want[layout]) {
				t.Errorf("stats %+v", stats)
			}
			checkSameAsFull(t, layout, f, st)
		})
	}
}

// checkSameAsFull compares f's state with a fresh full sync of st.
func checkSameAsFull(t *testing.T, layout Layout, f interface{ Dump() string }, st *cluster.State) {
	t.Helper()
	_, fresh := load(t, testConfig(layout), st)
	if got, want := sortedDump(withoutStale(f.Dump())), sortedDump(fresh.Dump()); got != want {
		t.Errorf("state after partial syncs differs from a full sync (stale chains aside):\n%s", lineDiff(want, got))
	}
}

// TestPartialNoChange: a changed service port whose rules are the same
// sends nothing.
func TestPartialNoChange(t *testing.T) {
	for _, layout := range layouts {
		st := overallState()
		b, _ := load(t, testConfig(layout), st)
		tx, stats := sync(t, b, st, st.SortedServicePorts(), false)
		if tx != "" || stats.Operations != 0 {
			t.Errorf("%s: no-op partial sync sent:\n%s", layout, tx)
		}
	}
}

// TestPartialStale: removing an endpoint flushes its chain (deleted by the
// next render in the kube-proxy layout, as kube-proxy deletes it in a later
// sync; at once in the fast layout) and deletes its affinity set; removing a
// service port deletes all of its objects and elements (its chains, again,
// in the kube-proxy layout by the next render).
func TestPartialStale(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			st := overallState()
			b, f := load(t, testConfig(layout), st)
			spn := name("ns3", "svc3", "p80") // affinity, two endpoints
			st.Endpoints[spn] = st.Endpoints[spn][:1]
			tx, _ := sync(t, b, st, []cluster.ServicePortName{spn}, false)
			gone := "10.180.2.3/80"
			if !strings.Contains(tx, "delete set ip kube-proxy affinity-FVNDPF47-ns3/svc3/tcp/p80__"+gone) {
				t.Errorf("stale affinity set not deleted:\n%s", tx)
			}
			staleEP := "chain ip kube-proxy endpoint-FVNDPF47-ns3/svc3/tcp/p80__" + gone
			if layout == LayoutKubeProxy {
				if !strings.Contains(tx, "flush "+staleEP) || strings.Contains(tx, "delete "+staleEP) {
					t.Errorf("want the stale endpoint chain flushed, not deleted:\n%s", tx)
				}
			} else if !strings.Contains(tx, "delete element ip kube-proxy hairpin-endpoints { 10.180.2.3 . 10.180.2.3 }") {
				t.Errorf("stale hairpin element not deleted:\n%s", tx)
			}
			checkSameAsFull(t, layout, f, st)

			// Remove a whole Service.
			spn = name("ns2", "svc2", "p80")
			delete(st.Services, spn)
			delete(st.Endpoints, spn)
			tx, _ = sync(t, b, st, []cluster.ServicePortName{spn}, false)
			want := []string{"delete element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 }", "delete element ip kube-proxy cluster-ips { 172.30.0.42 }"}
			if layout == LayoutKubeProxy {
				staleSvc := "chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80"
				want = append(want, "delete "+staleEP, "flush "+staleSvc)
				if strings.Contains(tx, "delete "+staleSvc) {
					t.Errorf("the removed service's chain was deleted at once:\n%s", tx)
				}
				checkSameAsFull(t, layout, f, st)
				next, _ := sync(t, b, st, nil, false)
				if !strings.Contains(next, "delete "+staleSvc) {
					t.Errorf("the next render did not delete the stale chain:\n%s", next)
				}
			} else {
				want = append(want, "delete element ip kube-proxy cluster-ip-endpoints-tcp { 172.30.0.42 . tcp . 80 . 2 }")
			}
			for _, w := range want {
				if !strings.Contains(tx, w) {
					t.Errorf("missing %q:\n%s", w, tx)
				}
			}
			if strings.Contains(f.Dump(), "ns2/svc2") {
				t.Errorf("objects of a removed service remain:\n%s", f.Dump())
			}
			checkSameAsFull(t, layout, f, st)
		})
	}
}

// TestStaleChainTiming: a flushed chain is deleted by the first render more
// than a second after the one that flushed it, and a chain that comes back
// before then is live again (not deleted later).
func TestStaleChainTiming(t *testing.T) {
	st := overallState()
	b, f := load(t, testConfig(LayoutKubeProxy), st)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.r.now = func() time.Time { return now }
	spn := name("ns2", "svc2", "p80")
	sp, eps := st.Services[spn], st.Endpoints[spn]
	chain := "chain ip kube-proxy " + ServiceChain(spn)
	delete(st.Services, spn)
	delete(st.Endpoints, spn)
	if tx, _ := sync(t, b, st, []cluster.ServicePortName{spn}, false); !strings.Contains(tx, "flush "+chain) {
		t.Fatalf("not flushed:\n%s", tx)
	}
	now = now.Add(900 * time.Millisecond)
	if tx, _ := sync(t, b, st, nil, false); strings.Contains(tx, "delete "+chain) {
		t.Errorf("deleted 0.9 s after the flush:\n%s", tx)
	}
	now = now.Add(200 * time.Millisecond)
	if tx, _ := sync(t, b, st, nil, false); !strings.Contains(tx, "delete "+chain) {
		t.Errorf("not deleted 1.1 s after the flush:\n%s", tx)
	}
	checkSameAsFull(t, LayoutKubeProxy, f, st)

	// Removed and back within the second: never deleted.
	delete(st.Services, spn)
	delete(st.Endpoints, spn)
	sync(t, b, st, []cluster.ServicePortName{spn}, false)
	st.Services[spn], st.Endpoints[spn] = sp, eps
	now = now.Add(500 * time.Millisecond)
	sync(t, b, st, []cluster.ServicePortName{spn}, false)
	now = now.Add(5 * time.Second)
	if tx, _ := sync(t, b, st, nil, false); strings.Contains(tx, "delete "+chain) {
		t.Errorf("a live chain was deleted as stale:\n%s", tx)
	}
	if got, want := sortedDump(f.Dump()), sortedDump(func() string { _, fr := load(t, testConfig(LayoutKubeProxy), st); return fr.Dump() }()); got != want {
		t.Errorf("differs from a full sync:\n%s", lineDiff(want, got))
	}
}

// TestPartialSharedClusterIP: two ports of one Service share the cluster IP
// element; removing one port keeps it.
func TestPartialSharedClusterIP(t *testing.T) {
	for _, layout := range layouts {
		st := newTestState()
		a, c := name("ns", "svc", "a"), name("ns", "svc", "b")
		add(st, clusterIPPort(a, "172.30.0.10", 80), ep("10.180.0.1", 80, otherNode, "R"))
		add(st, clusterIPPort(c, "172.30.0.10", 81), ep("10.180.0.1", 81, otherNode, "R"))
		b, f := load(t, testConfig(layout), st)
		delete(st.Services, c)
		delete(st.Endpoints, c)
		tx, _ := sync(t, b, st, []cluster.ServicePortName{c}, false)
		if strings.Contains(tx, "cluster-ips") {
			t.Errorf("%s: the shared cluster IP element was touched:\n%s", layout, tx)
		}
		checkSameAsFull(t, layout, f, st)
	}
}

// TestPartialRandomWalk applies random changes with partial syncs (and a
// full sync now and then) and checks after each step that the table equals a
// fresh full sync of the same state.
func TestPartialRandomWalk(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(layout))))
			st := overallState()
			b, f := load(t, testConfig(layout), st)
			for step := range 150 {
				changed := mutate(rng, st)
				full := step%37 == 36
				sync(t, b, st, changed, full)
				_, fresh := load(t, testConfig(layout), st)
				if got, want := sortedDump(withoutStale(f.Dump())), sortedDump(fresh.Dump()); got != want {
					t.Fatalf("step %d (changed %v, full %v): state differs from a full sync:\n%s", step, changed, full, lineDiff(want, got))
				}
			}
			// One more render deletes the last stale chains: then the
			// table is exactly a fresh full sync's.
			sync(t, b, st, nil, false)
			_, fresh := load(t, testConfig(layout), st)
			if got, want := sortedDump(f.Dump()), sortedDump(fresh.Dump()); got != want {
				t.Errorf("after a last no-op render: state differs from a full sync:\n%s", lineDiff(want, got))
			}
		})
	}
}

// mutate changes one or two random service ports of st and names them.
func mutate(rng *rand.Rand, st *cluster.State) []cluster.ServicePortName {
	var changed []cluster.ServicePortName
	for range 1 + rng.IntN(2) {
		names := st.SortedServicePorts()
		if len(names) == 0 {
			break
		}
		spn := names[rng.IntN(len(names))]
		sp := *st.Services[spn]
		eps := slices.Clone(st.Endpoints[spn])
		switch rng.IntN(9) {
		case 0: // add an endpoint
			node := []string{thisNode, otherNode}[rng.IntN(2)]
			eps = append(eps, ep(fmt.Sprintf("10.182.%d.%d", rng.IntN(4), 1+rng.IntN(20)), sp.Port, node, "R"))
			eps = dedupe(eps)
		case 1: // remove an endpoint
			if len(eps) > 0 {
				i := rng.IntN(len(eps))
				eps = append(eps[:i], eps[i+1:]...)
			}
		case 2: // flip readiness of one
			if len(eps) > 0 {
				i := rng.IntN(len(eps))
				e := *eps[i]
				e.Ready = !e.Ready
				e.Serving = e.Ready || rng.IntN(2) == 0
				e.Terminating = !e.Ready
				eps[i] = &e
			}
		case 3:
			sp.ClientIPAffinity = !sp.ClientIPAffinity
			sp.AffinityTimeout = 10800
		case 4:
			sp.AffinityTimeout = int32(60 * (1 + rng.IntN(3)))
		case 5:
			sp.InternalLocal = !sp.InternalLocal
		case 6:
			if sp.NodePort == 0 {
				sp.Type, sp.NodePort = corev1.ServiceTypeNodePort, int32(31000+rng.IntN(100))
			} else {
				sp.ExternalLocal = !sp.ExternalLocal
			}
		case 7: // remove the service port
			delete(st.Services, spn)
			delete(st.Endpoints, spn)
			changed = append(changed, spn)
			continue
		case 8: // add a new service port
			n := name("rnd", fmt.Sprintf("s%d", rng.IntN(1000)), "p")
			if _, ok := st.Services[n]; !ok {
				add(st, clusterIPPort(n, fmt.Sprintf("172.30.2.%d", 1+rng.IntN(250)), 80), ep("10.183.0.1", 80, thisNode, "R"))
				changed = append(changed, n)
			}
			continue
		}
		st.Services[spn] = &sp
		if len(eps) > 0 {
			st.Endpoints[spn] = eps
		} else {
			delete(st.Endpoints, spn)
		}
		changed = append(changed, spn)
	}
	return changed
}

func dedupe(eps []*cluster.Endpoint) []*cluster.Endpoint {
	seen := map[netip.AddrPort]bool{}
	var out []*cluster.Endpoint
	for _, e := range eps {
		k := netip.AddrPortFrom(e.IP, uint16(e.Port))
		if !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *cluster.Endpoint) int { return a.IP.Compare(b.IP) })
	return out
}

// TestPartialOperationsConstant: one endpoint change costs the same number
// of operations at 10 and at 5000 service ports. (Render only: the Fake
// fills a map of m elements in O(m^2), which says nothing about us.)
func TestPartialOperationsConstant(t *testing.T) {
	testenv.SkipIfShort(t, "large state (5000 service ports)")
	for _, layout := range layouts {
		var counts []int
		for _, n := range []int{10, 5000} {
			st := bigState(n, 10)
			r, err := NewRenderer(testConfig(layout))
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := r.Render(st, nil, true); err != nil {
				t.Fatal(err)
			}
			r.Commit()
			spn := changeOneEndpoint(st, n/2)
			_, stats, err := r.Render(st, []cluster.ServicePortName{spn}, false)
			if err != nil {
				t.Fatal(err)
			}
			counts = append(counts, stats.Operations)
		}
		if counts[0] != counts[1] || counts[0] == 0 {
			t.Errorf("%s: one endpoint change costs %d operations at 10 service ports and %d at 5000", layout, counts[0], counts[1])
		}
	}
}

// bigState has n ClusterIP service ports with eps ready endpoints each,
// spread over 100 nodes.
func bigState(n, eps int) *cluster.State {
	st := newTestState()
	for i := range n {
		spn := name(fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc%d", i), "http")
		ip := netip.AddrFrom4([4]byte{172, 30, byte(i / 250), byte(1 + i%250)})
		sp := &cluster.ServicePort{Name: spn, Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, Port: 80, TargetPort: "8080"}
		list := make([]*cluster.Endpoint, eps)
		for j := range eps {
			k := i*eps + j
			list[j] = &cluster.Endpoint{IP: netip.AddrFrom4([4]byte{10, byte(64 + k/65536), byte(k / 256 % 256), byte(k % 256)}),
				Port: 8080, Ready: true, Serving: true, NodeName: fmt.Sprintf("node%d", k%100)}
		}
		add(st, sp, list...)
	}
	return st
}

// changeOneEndpoint replaces the first endpoint of the i-th service port.
func changeOneEndpoint(st *cluster.State, i int) cluster.ServicePortName {
	spn := name(fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc%d", i), "http")
	eps := slices.Clone(st.Endpoints[spn])
	e := *eps[0]
	e.IP = netip.MustParseAddr("10.200.0.1")
	eps[0] = &e
	st.Endpoints[spn] = eps
	return spn
}
