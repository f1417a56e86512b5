package nftables

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
)

func countersText(cs []dataplane.Counter) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%s %s packets=%d bytes=%d\n", c.ServicePort, c.Endpoint, c.Packets, c.Bytes)
	}
	return b.String()
}

// TestParseCounters reads `nft list table` and `nft -j list table` output
// recorded from the kernel (TestNFTCountersLive -update: six connections to
// each cluster IP of overallState) and maps it to service ports and
// endpoints.
func TestParseCounters(t *testing.T) {
	for _, layout := range countedLayouts {
		t.Run(string(layout), func(t *testing.T) {
			b, _ := load(t, testConfig(layout), overallState())
			refs := b.Renderer().Refs()
			text, err := os.ReadFile(filepath.Join("testdata", "counters-"+string(layout)+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			js, err := os.ReadFile(filepath.Join("testdata", "counters-"+string(layout)+".json"))
			if err != nil {
				t.Fatal(err)
			}
			fromJSON, err := ParseCountersJSON(js, refs)
			if err != nil {
				t.Fatal(err)
			}
			fromText := ParseCountersText(string(text), refs)
			if !slices.Equal(fromJSON, fromText) {
				t.Errorf("json:\n%s\ntext:\n%s", countersText(fromJSON), countersText(fromText))
			}
			golden(t, "counters-"+string(layout)+"-parsed", countersText(fromJSON))
			sum := map[string]uint64{}
			for _, c := range fromJSON {
				sum[c.ServicePort.String()] += c.Packets
			}
			for _, spn := range overallState().SortedServicePorts() {
				if sum[spn.String()] < 6 {
					t.Errorf("%s: %d connections, want 6", spn, sum[spn.String()])
				}
			}
		})
	}
}

// countedLayouts are the layouts with counters: the fast one (kube-proxy's
// table has none).
var countedLayouts = []Layout{LayoutFast}

// TestCountersKubeProxyNone: the kube-proxy layout writes no counter, and
// Counters reports them unavailable (nil).
func TestCountersKubeProxyNone(t *testing.T) {
	b, f := load(t, testConfig(LayoutKubeProxy), overallState())
	if strings.Contains(f.Dump(), "counter") {
		t.Errorf("counters in the kube-proxy layout:\n%s", f.Dump())
	}
	if cs, err := b.Counters(); cs != nil || err != nil {
		t.Errorf("counters %v, %v; want nil, nil", cs, err)
	}
}

// TestCountersFake: with a Fake, Counters lists every endpoint and verdict
// element with zero counts.
func TestCountersFake(t *testing.T) {
	for _, layout := range countedLayouts {
		b, _ := load(t, testConfig(layout), overallState())
		cs, err := b.Counters()
		if err != nil {
			t.Fatal(err)
		}
		got := countersText(cs)
		for _, want := range []string{
			"ns1/svc1:p80 10.180.0.1:80 packets=0",
			"ns2/svc2:p80 10.180.1.7:80 packets=0",
			"ns3/svc3:p80 10.180.2.3:80 packets=0",
			"ns5/svc5:p80 DROP packets=0",
			"ns6/svc6:p80 REJECT packets=0",
			"ns13/svc13:p80 DROP packets=0",
			"ns12/svc12:p80 DROP packets=0",
			"ns8/svc8:dns 10.180.0.14:53 packets=0",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("%s: missing %q in\n%s", layout, want, got)
			}
		}
		if strings.Contains(got, "10.180.0.6:80") {
			t.Errorf("%s: a not-ready endpoint has a counter:\n%s", layout, got)
		}
	}
}

// TestCountersNone: without counters, nothing is counted.
func TestCountersNone(t *testing.T) {
	for _, layout := range layouts {
		cfg := testConfig(layout)
		cfg.NoCounters = true
		b, f := load(t, cfg, overallState())
		if strings.Contains(f.Dump(), "counter") {
			t.Errorf("%s: counters with NoCounters:\n%s", layout, f.Dump())
		}
		if cs, _ := b.Counters(); len(cs) != 0 {
			t.Errorf("%s: counters %v", layout, cs)
		}
	}
}
