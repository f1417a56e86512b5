package differential

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGenerateDeterministic(t *testing.T) {
	cfg := DefaultGenConfig()
	for _, seed := range []uint64{0, 1, 7, 229, 230, 12345} {
		a, b := Generate(seed, cfg), Generate(seed, cfg)
		if d := cmp.Diff(a, b); d != "" {
			t.Errorf("seed %d: two draws differ (-first +second):\n%s", seed, d)
		}
	}
	if cmp.Equal(Generate(1, cfg), Generate(2, cfg)) {
		t.Error("seeds 1 and 2 drew the same scenario")
	}
}

// TestGenerateCoverage draws 500 scenarios, as the differential test does,
// and requires every feature the comparison must see.
func TestGenerateCoverage(t *testing.T) {
	cfg := DefaultGenConfig()
	total := map[string]int{}
	for seed := range uint64(500) {
		sc := Generate(seed, cfg)
		if n := len(sc.Steps); n < 2 || n > 5 {
			t.Errorf("seed %d: %d steps, want 2-5", seed, n)
		}
		if sc.Namespace != fmt.Sprintf("d-%d", seed) {
			t.Errorf("seed %d: namespace %s", seed, sc.Namespace)
		}
		for k, v := range Features(sc) {
			total[k] += v
		}
		checkStepWrites(t, sc)
	}
	want := wantFeatures()
	for _, k := range want {
		if total[k] < 5 {
			t.Errorf("feature %q occurs %d times in 500 scenarios, want at least 5", k, total[k])
		}
	}
	var keys []string
	for k := range total {
		keys = append(keys, fmt.Sprintf("%s=%d", k, total[k]))
	}
	slices.Sort(keys)
	t.Logf("features over 500 scenarios: %s", strings.Join(keys, ", "))
}

// checkStepWrites requires each step to write something, each object at
// most once, and no-service-without-endpoints cases to exist.
func checkStepWrites(t *testing.T, sc *Scenario) {
	t.Helper()
	for i, st := range sc.Steps {
		if st.Writes() == 0 {
			t.Errorf("seed %d step %d (%v): no write", sc.Seed, i, st.What)
		}
		seen := map[string]bool{}
		for _, s := range st.Slices {
			if seen[s.Name] {
				t.Errorf("seed %d step %d: slice %s written twice", sc.Seed, i, s.Name)
			}
			seen[s.Name] = true
			if s.Namespace != sc.Namespace {
				t.Errorf("seed %d: slice %s in namespace %s", sc.Seed, s.Name, s.Namespace)
			}
		}
		for _, d := range st.DeleteSlices {
			if seen[d.Name] {
				t.Errorf("seed %d step %d: slice %s written and deleted", sc.Seed, i, d.Name)
			}
		}
	}
}

// TestGenerateDisjoint checks that scenarios sharing one API (seeds
// distinct modulo MaxSeeds) use disjoint ClusterIPs, endpoint addresses and
// node ports, inside the configured ranges.
// externalRange holds the external and load-balancer IPs (externalAddr).
var externalRange = netip.MustParsePrefix("100.64.0.0/10")

func TestGenerateDisjoint(t *testing.T) {
	cfg := DefaultGenConfig()
	owner := map[string]uint64{}
	for seed := range uint64(MaxSeeds) {
		sc := Generate(seed+1000, cfg)
		for ip := range sc.IPs {
			if !cfg.ServiceCIDR.Contains(ip) && !cfg.PodCIDR.Contains(ip) && !externalRange.Contains(ip) {
				t.Fatalf("seed %d: address %s outside the service, pod and external ranges", sc.Seed, ip)
			}
			k := ip.String()
			if o, ok := owner[k]; ok && o != sc.Seed {
				t.Fatalf("address %s used by seeds %d and %d", k, o, sc.Seed)
			}
			owner[k] = sc.Seed
		}
		for _, st := range sc.Steps {
			for _, s := range st.Services {
				ports := []int32{s.Spec.HealthCheckNodePort}
				for _, p := range s.Spec.Ports {
					ports = append(ports, p.NodePort)
				}
				for _, p := range ports {
					if p == 0 {
						continue
					}
					if p < 30000 || p > 32767 {
						t.Fatalf("seed %d: node port %d outside 30000-32767", sc.Seed, p)
					}
					k := fmt.Sprint("port ", p)
					if o, ok := owner[k]; ok && o != sc.Seed {
						t.Fatalf("node port %d used by seeds %d and %d", p, o, sc.Seed)
					}
					owner[k] = sc.Seed
				}
			}
		}
	}
}

// wantFeatures lists every feature the comparison must see (Features).
func wantFeatures() []string {
	want := []string{
		"type:ClusterIP", "type:NodePort", "type:LoadBalancer", "multi-port",
		"protocol:TCP", "protocol:UDP", "protocol:SCTP", "named target port", "numeric target port",
		"affinity ClientIP", "affinity timeout", "internalTrafficPolicy Local", "externalTrafficPolicy Local", "healthCheckNodePort",
		"trafficDistribution:PreferClose", "trafficDistribution:PreferSameZone", "trafficDistribution:PreferSameNode",
		"empty slice", "several slices", "slice of 100+ endpoints", "slice deleted",
		"ready", "conditions nil", "terminating serving", "terminating not serving", "not ready",
		"endpoint on the node", "endpoint elsewhere", "node hints", "zone hints", "no hints",
		"externalIPs", "externalIPs on ClusterIP", "ingress ipMode VIP", "ingress ipMode Proxy", "ingress hostname",
		"source range", "source range 0.0.0.0/0", "source range holding the node",
	}
	for _, a := range Actions {
		want = append(want, "step:"+a)
	}
	return want
}
