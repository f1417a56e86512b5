package diagnose

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"
)

// TestIPVSDumpsReachTheRunsVerdict holds ReadIPVSAdm to the IPVS round-trip
// dumps (make diagnose-dumps-ipvs: sim conform --dump in the microVM, the
// real ipvsadm -Ln, -Ln --stats --exact and -Lnc of the client node before
// and after each check). Until the analysis (Analyze) is merged, it decides
// from the Dump itself what the rules say about the check's port, against
// the API objects of that moment (api.yaml):
//
//   - the real servers of positive weight are the Service's ready endpoints
//     (this node's, for internalTrafficPolicy Local);
//   - the split is fair: rr or wrr (Exact) with equal shares;
//   - persistence is on exactly when sessionAffinity is ClientIP, with its
//     timeoutSeconds;
//
// and requires: on the correct dataplane every check's dump is fair by all
// three; in a fault run every check the run failed has a dump that breaks
// the one the fault breaks (uniform-probability, skew-at-mde: the split;
// drop-last-endpoint: a ready endpoint is missing; keep-not-ready,
// keep-deleted-endpoint: a real server the API does not have ready;
// ignore-local-policy: another node's endpoint under Local;
// affinity-no-timeout: the timeout). And the counters: the Conns of the
// port's real servers grow over a check by at least the connections the
// run counted at the backends (n), on every distribution check.
func TestIPVSDumpsReachTheRunsVerdict(t *testing.T) {
	var archives []string
	for _, a := range dumpArchives(t) {
		if config, _ := caseOf(t, a); config == "ipvs" {
			archives = append(archives, a)
		}
	}
	if len(archives) == 0 {
		t.Fatalf("no ipvs-*.tar.gz in %s: make diagnose-dumps-ipvs writes them", dumpsDir)
	}
	breaks := map[string]string{
		"uniform-probability":   "split",
		"skew-at-mde":           "split",
		"drop-last-endpoint":    "missing",
		"keep-not-ready":        "extra",
		"keep-deleted-endpoint": "extra",
		"ignore-local-policy":   "extra",
		"affinity-no-timeout":   "timeout",
	}
	for _, archive := range archives {
		_, name := caseOf(t, archive)
		t.Run(name, func(t *testing.T) {
			dir := extractDumps(t, archive)
			m, err := ReadManifest(dir)
			if err != nil {
				t.Fatal(err)
			}
			caught := 0
			for _, dc := range m.Checks {
				failed, decided := false, len(dc.Verdicts) > 0
				n := 0
				for _, v := range dc.Verdicts {
					switch v.Verdict {
					case "fail":
						failed = true
					case "pass":
					default:
						decided = false
					}
					n = max(n, v.N)
				}
				if !decided {
					continue
				}
				before := readIPVSDumped(t, dir, dc, dc.Before)
				after := readIPVSDumped(t, dir, dc, dc.After)
				pb, pa := ipvsPortOf(t, before, dc), ipvsPortOf(t, after, dc)
				faults := ipvsRuleFaults(t, filepath.Join(dir, dc.Dir, dc.API), dc, pb)
				switch {
				case name == "correct" && len(faults) > 0:
					t.Errorf("%s: the correct dataplane passed, but its rules say %v", dc.Dir, faults)
				case name != "correct" && failed:
					want := breaks[name]
					if want == "" {
						t.Fatalf("no rule fault named for %s", name)
					}
					if !slices.Contains(faults, want) {
						t.Errorf("%s: the run caught %s; the dump shows %v, want %s", dc.Dir, name, faults, want)
					} else {
						caught++
					}
				}
				if dc.Type == "distribution" && n > 0 && before.Counters && after.Counters {
					var grew uint64
					for _, e := range pa.Endpoints {
						var was uint64
						for _, b := range pb.Endpoints {
							if b.Addr == e.Addr {
								was = b.Observed
							}
						}
						grew += e.Observed - was
					}
					if grew < uint64(n) {
						t.Errorf("%s: the real servers' Conns grew by %d over the check, the run counted %d connections", dc.Dir, grew, n)
					}
				}
			}
			if name != "correct" && caught == 0 {
				t.Errorf("fault %s: no failed check whose dump shows it", name)
			}
		})
	}
}

// readIPVSDumped reads a check's three ipvsadm files as one input.
func readIPVSDumped(t *testing.T, dir string, dc *DumpedCheck, files map[string]string) *Dump {
	t.Helper()
	var data []byte
	for _, f := range []string{"ipvsadm", "ipvsadm-stats", "ipvsadm-conns"} {
		if files[f] == "" {
			t.Fatalf("%s: no %s dump", dc.Dir, f)
		}
		b, err := os.ReadFile(filepath.Join(dir, dc.Dir, files[f]))
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b...)
	}
	d, err := ReadIPVSAdm(filepath.Join(dc.Dir, files["ipvsadm"]), data)
	if err != nil {
		t.Fatalf("%s: %v", dc.Dir, err)
	}
	if !d.Counters {
		t.Errorf("%s: no counters in ipvsadm --stats", dc.Dir)
	}
	for _, s := range d.Skipped {
		t.Errorf("%s: skipped %s: %s", dc.Dir, s.Line.Text, s.Reason)
	}
	return d
}

func ipvsPortOf(t *testing.T, d *Dump, dc *DumpedCheck) *ServicePort {
	t.Helper()
	chain := strings.ToUpper(dc.Protocol) + " " + netip.AddrPortFrom(netip.MustParseAddr(dc.ClusterIP), uint16(dc.Port)).String()
	for _, p := range d.Ports {
		if p.Chain == chain {
			return p
		}
	}
	t.Fatalf("%s: %s has no virtual server %s", dc.Dir, d.File, chain)
	return nil
}

// ipvsRuleFaults compares the port's real servers, split and persistence
// with the API objects of api.yaml.
func ipvsRuleFaults(t *testing.T, api string, dc *DumpedCheck, p *ServicePort) []string {
	t.Helper()
	svc, slices_ := readAPIForService(t, api, dc.ServicePort)
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == int32(dc.Port) {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		t.Fatalf("%s: service %s has no port %d", dc.Dir, dc.ServicePort, dc.Port)
	}
	local := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	// kube-proxy's CategorizeEndpoints: the ready endpoints, or when there
	// are none the serving terminating ones (KEP-1669).
	want := map[netip.AddrPort]bool{}
	serving := map[netip.AddrPort]bool{}
	for _, s := range slices_ {
		var port int32
		for _, q := range s.Ports {
			if q.Name != nil && *q.Name == sp.Name && q.Port != nil {
				port = *q.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if local && (e.NodeName == nil || *e.NodeName != dc.Node) {
				continue
			}
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			term := e.Conditions.Terminating != nil && *e.Conditions.Terminating
			srv := e.Conditions.Serving == nil && ready || e.Conditions.Serving != nil && *e.Conditions.Serving
			for _, a := range e.Addresses {
				ap := netip.AddrPortFrom(netip.MustParseAddr(a), uint16(port))
				if ready {
					want[ap] = true
				} else if srv && term {
					serving[ap] = true
				}
			}
		}
	}
	if len(want) == 0 {
		want = serving
	}
	have := map[netip.AddrPort]bool{}
	var shares []float64
	for _, e := range p.Endpoints {
		if e.Weight > 0 {
			have[e.Addr] = true
			shares = append(shares, e.P)
		}
	}
	var out []string
	for a := range want {
		if !have[a] {
			out = append(out, "missing")
			break
		}
	}
	for a := range have {
		if !want[a] {
			out = append(out, "extra")
			break
		}
	}
	if !p.Exact || slices.ContainsFunc(shares, func(s float64) bool { return !near(s, shares[0]) }) {
		out = append(out, "split")
	}
	clientIP := svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP
	switch {
	case clientIP != (p.Affinity != nil):
		out = append(out, "timeout")
	case clientIP:
		want := 10800 * time.Second
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			want = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
		if p.Affinity.Timeout != want {
			out = append(out, "timeout")
		}
	}
	return out
}

// readAPIForService reads the Service "namespace/name[:port]" and its
// EndpointSlices from a kubectl -o yaml List.
func readAPIForService(t *testing.T, file, servicePort string) (*corev1.Service, []discoveryv1.EndpointSlice) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := yaml.Unmarshal(b, &list); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	nsName, _, _ := strings.Cut(servicePort, ":")
	ns, name, _ := strings.Cut(nsName, "/")
	var svc *corev1.Service
	var out []discoveryv1.EndpointSlice
	for _, raw := range list.Items {
		var tm struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(raw, &tm); err != nil {
			t.Fatal(err)
		}
		switch tm.Kind {
		case "Service":
			var s corev1.Service
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			if s.Namespace == ns && s.Name == name {
				svc = &s
			}
		case "EndpointSlice":
			var s discoveryv1.EndpointSlice
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			if s.Namespace == ns && s.Labels[discoveryv1.LabelServiceName] == name {
				out = append(out, s)
			}
		}
	}
	if svc == nil {
		t.Fatalf("%s: no Service %s", file, nsName)
	}
	return svc, out
}
