package ipvs

import (
	"strings"
	"testing"
)

// The seed corpora under testdata/fuzz/ are real-shaped inputs: a
// /proc/net/ip_vs_stats_percpu recording, ipset save and iptables-save
// texts made of the goldens of this package and of dataplane/iptables.

// FuzzParseStatsPerCPU: /proc/net/ip_vs_stats_percpu text never panics the
// parser; not ok means zero sums, and the text twice over parses to twice
// the sums.
func FuzzParseStatsPerCPU(f *testing.F) {
	f.Fuzz(func(t *testing.T, text string) {
		conns, pkts, ok := ParseStatsPerCPU(text)
		if !ok && (conns != 0 || pkts != 0) {
			t.Fatalf("not ok but %d connections, %d packets", conns, pkts)
		}
		c2, p2, ok2 := ParseStatsPerCPU(text + "\n" + text)
		if ok2 != ok {
			t.Fatalf("doubled text: ok %v, want %v", ok2, ok)
		}
		if c2 != 2*conns || p2 != 2*pkts { // uint64 sums wrap alike
			t.Fatalf("doubled text sums %d, %d; want %d, %d", c2, p2, 2*conns, 2*pkts)
		}
	})
}

// FuzzCanonicalSets: `ipset save` output never panics; the canonical form is
// a fixed point and holds only kube-proxy's sets.
func FuzzCanonicalSets(f *testing.F) {
	f.Fuzz(func(t *testing.T, save string) {
		c := canonicalSets(save)
		if again := canonicalSets(c); again != c {
			t.Fatalf("canonicalSets is not idempotent:\n%s\nthen\n%s", c, again)
		}
		for _, line := range strings.Split(strings.TrimSuffix(c, "\n"), "\n") {
			if line == "" {
				continue
			}
			if f := strings.Fields(line); len(f) < 2 || setInfo(f[1]).name == "" {
				t.Fatalf("canonical line %q is not about a kube-proxy set", line)
			}
		}
	})
}

// FuzzKubeRules: iptables-save output never panics; the kube-proxy subset
// is a fixed point, and every table it keeps ends with COMMIT.
func FuzzKubeRules(f *testing.F) {
	f.Fuzz(func(t *testing.T, save string) {
		k := kubeRules(save)
		if again := kubeRules(k); again != k {
			t.Fatalf("kubeRules is not idempotent:\n%s\nthen\n%s", k, again)
		}
		if k != "" && !strings.HasSuffix(k, "COMMIT\n") {
			t.Fatalf("kube rules do not end with COMMIT:\n%s", k)
		}
	})
}
