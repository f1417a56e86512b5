package iptables

import (
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// The seed corpora under testdata/fuzz/ are the goldens of this package
// (restore texts, dumps, jumps) and, for FuzzParseCounters, the same texts
// with iptables-save -c counters in front of every rule.

// overallChains renders overallState once; the fuzz targets share it.
var overallChains = sync.OnceValues(func() (*ChainMap, map[cluster.ServicePortName]bool) {
	r, err := NewRenderer(testConfig())
	if err != nil {
		panic(err)
	}
	st := overallState()
	rs, err := r.Render(st, nil, true)
	if err != nil {
		panic(err)
	}
	known := map[cluster.ServicePortName]bool{}
	for _, spn := range st.SortedServicePorts() {
		known[spn] = true
	}
	return rs.Chains, known
})

// FuzzParseCounters: iptables-save -c output never panics the parser, and
// every counter it returns names a service port of the rendered state and an
// endpoint "ip:port" or a verdict, sorted, with no duplicate.
func FuzzParseCounters(f *testing.F) {
	f.Add("*nat\n[1:60] -A KUBE-SEP-X -p tcp -j DNAT --to-destination 10.180.0.1:80\nCOMMIT\n")
	f.Fuzz(func(t *testing.T, save string) {
		m, known := overallChains()
		got := ParseCounters(save, m)
		for i, c := range got {
			if !known[c.ServicePort] {
				t.Errorf("counter %d names service port %v, not in the state", i, c.ServicePort)
			}
			if c.Endpoint != "REJECT" && c.Endpoint != "DROP" {
				if _, err := netip.ParseAddrPort(c.Endpoint); err != nil {
					t.Errorf("counter %d: endpoint %q is neither ip:port nor a verdict", i, c.Endpoint)
				}
			}
			if i > 0 {
				p := got[i-1]
				if d := cluster.CompareNames(p.ServicePort, c.ServicePort); d > 0 || d == 0 && trace.CompareTarget(p.Endpoint, c.Endpoint) >= 0 {
					t.Errorf("counters out of order or repeated: %v then %v", p, c)
				}
			}
		}
		if again := ParseCounters(save, m); !slices.Equal(got, again) {
			t.Errorf("two parses of the same text differ: %v, then %v", got, again)
		}
	})
}

// FuzzFakeRestore: the fake's iptables-restore never panics; a rejected
// input changes nothing (restore is atomic); an accepted one dumps text
// that a fresh fake restores to the same dump.
func FuzzFakeRestore(f *testing.F) {
	f.Add("*filter\n:KUBE-X - [0:0]\n-A KUBE-X -j ACCEPT\nCOMMIT\n")
	f.Fuzz(func(t *testing.T, text string) {
		fk := NewFake(nodeIP)
		before := fk.Dump()
		if err := fk.Restore(text); err != nil {
			if after := fk.Dump(); after != before {
				t.Fatalf("a rejected restore (%v) changed the tables:\n%s", err, lineDiff(before, after))
			}
			return
		}
		dump := fk.Dump()
		again := NewFake(nodeIP)
		if err := again.Restore(dump); err != nil {
			t.Fatalf("the fake's own dump does not restore: %v\n%s", err, numbered(dump))
		}
		if d := again.Dump(); d != dump {
			t.Fatalf("dump, restore, dump differs:\n%s", lineDiff(dump, d))
		}
	})
}
