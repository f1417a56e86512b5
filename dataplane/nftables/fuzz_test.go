package nftables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// The seed corpora under testdata/fuzz/ are the kernel recordings of this
// package (counters-*.json, counters-*.txt) and the Fake dumps
// (overall-*-dump.golden), each with the layout it was recorded in.

// fuzzRefs renders overallState in a layout and returns its references and
// service ports.
func fuzzRefs(f *testing.F, layout Layout) (Refs, map[cluster.ServicePortName]bool) {
	b, _ := load(f, testConfig(layout), overallState())
	known := map[cluster.ServicePortName]bool{}
	for _, spn := range overallState().SortedServicePorts() {
		known[spn] = true
	}
	return b.Renderer().Refs(), known
}

// checkCounters requires counters to name known service ports and an
// endpoint "ip:port" or a verdict, sorted, without duplicates.
func checkCounters(t *testing.T, got []dataplane.Counter, known map[cluster.ServicePortName]bool) {
	t.Helper()
	for i, c := range got {
		if !known[c.ServicePort] {
			t.Errorf("counter %d names service port %v, not in the state", i, c.ServicePort)
		}
		if c.Endpoint != trace.OutcomeReject && c.Endpoint != trace.OutcomeDrop {
			if ap, err := netip.ParseAddrPort(c.Endpoint); err != nil || ap.String() != c.Endpoint {
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
}

func layoutOf(fast bool) Layout {
	if fast {
		return LayoutFast
	}
	return LayoutKubeProxy
}

// FuzzParseCountersJSON: `nft -j list table` output never panics the parser;
// an error is a wrapped parse error, a success counters as checkCounters
// wants.
func FuzzParseCountersJSON(f *testing.F) {
	refs := map[bool]Refs{}
	var known map[cluster.ServicePortName]bool
	for _, fast := range []bool{false, true} {
		refs[fast], known = fuzzRefs(f, layoutOf(fast))
	}
	f.Add([]byte(`{"nftables": [{"rule": {"chain": "x", "expr": [{"counter": {"packets": 1, "bytes": 60}}]}}]}`), false)
	f.Fuzz(func(t *testing.T, data []byte, fast bool) {
		got, err := ParseCountersJSON(data, refs[fast])
		if err != nil {
			if got != nil {
				t.Errorf("counters %v with error %v", got, err)
			}
			return
		}
		checkCounters(t, got, known)
	})
}

// FuzzParseCountersText: `nft list table` output, the same properties.
func FuzzParseCountersText(f *testing.F) {
	refs := map[bool]Refs{}
	var known map[cluster.ServicePortName]bool
	for _, fast := range []bool{false, true} {
		refs[fast], known = fuzzRefs(f, layoutOf(fast))
	}
	f.Add("table ip kube-proxy {\n}\n", false)
	f.Fuzz(func(t *testing.T, text string, fast bool) {
		got := ParseCountersText(text, refs[fast])
		checkCounters(t, got, known)
		if again := ParseCountersText(text, refs[fast]); !slices.Equal(got, again) {
			t.Errorf("two parses of the same text differ: %v, then %v", got, again)
		}
	})
}

// FuzzParseCountersDump: a Fake dump (`add ...` lines), the same properties,
// and every counter is zero.
func FuzzParseCountersDump(f *testing.F) {
	refs := map[bool]Refs{}
	var known map[cluster.ServicePortName]bool
	for _, fast := range []bool{false, true} {
		refs[fast], known = fuzzRefs(f, layoutOf(fast))
	}
	f.Add("add table ip kube-proxy\n", false)
	f.Fuzz(func(t *testing.T, dump string, fast bool) {
		got := ParseCountersDump(dump, refs[fast])
		checkCounters(t, got, known)
		for _, c := range got {
			if c.Packets != 0 || c.Bytes != 0 {
				t.Errorf("a dump has no counter values, got %v", c)
			}
		}
	})
}
