package diagnose

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The external-path fixtures (testdata/external, gen-external.sh): one
// sim conform --dump run of testdata/external/external.yaml per archive,
// SUBJECT-MODE-CASE.tar.gz, on a real kernel: traffic from the harness's
// outside client to web (LoadBalancer, externalTrafficPolicy Local, 1, 2
// and 3 pods on node-a, node-b and node-c, spread over the nodes by an
// even balancer), then shop's node port on node-a, its load-balancer IP
// on node-b and its external IP on node-c (Cluster, 4 pods), guarded's
// source ranges (allowed and denied) and gone's node port (no endpoints)
// on node-a.
const externalDir = "testdata/external"

// nodeDumps are a run's last dump of each node and the API beside it.
type nodeDumps struct {
	mode  string
	api   *API
	dumps map[string]*Dump // node -> its last "after" dump
}

// readExternal unpacks an archive and reads each node's last dump after
// the traffic (the checks run in the manifest's order).
func readExternal(t *testing.T, name string) nodeDumps {
	t.Helper()
	dir := extractDumps(t, filepath.Join(externalDir, name+".tar.gz"))
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	nd := nodeDumps{mode: m.Mode, dumps: map[string]*Dump{}}
	for _, dc := range m.Checks {
		if dc.Node == "" || len(dc.After) == 0 {
			continue
		}
		f, files := FormatIPTablesSave, []string{dc.After["iptables-save"]}
		switch m.Mode {
		case "nftables":
			f, files = FormatNFT, []string{dc.After["nft"]}
		case "ipvs":
			f, files = FormatIPVSAdm, []string{dc.After["ipvsadm"], dc.After["ipvsadm-stats"], dc.After["ipvsadm-conns"]}
		}
		var data []byte
		for _, fn := range files {
			b, err := os.ReadFile(filepath.Join(dir, dc.Dir, fn))
			if err != nil {
				t.Fatal(err)
			}
			data = append(data, b...)
		}
		d, err := Read(f, filepath.Join(dc.Dir, files[0]), data)
		if err != nil {
			t.Fatal(err)
		}
		nd.dumps[dc.Node] = d
		if nd.api, err = LoadAPI(filepath.Join(dir, dc.Dir, dc.API)); err != nil {
			t.Fatal(err)
		}
	}
	if len(nd.dumps) != 3 {
		t.Fatalf("%s: dumps of %d nodes, want node-a, node-b, node-c", name, len(nd.dumps))
	}
	return nd
}

// analyzeNodes analyses node's dump with the other two as peers.
func (nd nodeDumps) analyze(node string, peers bool) *Report {
	opt := Options{API: nd.api, Node: node}
	if peers {
		for _, n := range []string{"node-a", "node-b", "node-c"} {
			if n != node {
				opt.Peers = append(opt.Peers, Peer{Node: n, Dump: nd.dumps[n]})
			}
		}
	}
	return Analyze(nd.dumps[node], opt)
}

func externalOf(t *testing.T, r *Report, port string) *ExternalReport {
	t.Helper()
	for _, xr := range r.External {
		if xr.Port == port {
			return xr
		}
	}
	t.Fatalf("%s: no external report of %s", r.File, port)
	return nil
}

func entryOfKind(t *testing.T, xr *ExternalReport, what string) *EntryReport {
	t.Helper()
	for _, e := range xr.Entries {
		if e.What == what {
			return e
		}
	}
	t.Fatalf("%s: no %s entry in %+v", xr.Port, what, xr.Entries)
	return nil
}

func findingKinds(r *Report, l Level) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Level == l {
			out = append(out, f.Kind+" "+f.Port)
		}
	}
	return out
}

// wantPlacement holds a Local placement to 1, 2 and 3 pods on node-a,
// node-b and node-c: expected shares 1/3, 1/6, 1/9, and with counts every
// pod's interval covering its share and an even balancer.
func wantPlacement(t *testing.T, r *Report, cause string, counted bool) {
	t.Helper()
	if len(r.Placement) != 1 {
		t.Fatalf("placements: %d, want 1 (web)", len(r.Placement))
	}
	pl := r.Placement[0]
	if pl.Cause != cause || pl.Counted != counted || math.Abs(float64(pl.ExpectedRatio)-3) > 1e-9 {
		t.Fatalf("placement: cause %q counted %t ratio %v, want %q %t 3: %s", pl.Cause, pl.Counted, pl.ExpectedRatio, cause, counted, pl.Message)
	}
	want := map[string]float64{"node-a": 1.0 / 3, "node-b": 1.0 / 6, "node-c": 1.0 / 9}
	if len(pl.Pods) != 6 {
		t.Fatalf("pods: %d, want 6", len(pl.Pods))
	}
	for _, ps := range pl.Pods {
		if math.Abs(ps.Expected-want[ps.Node]) > 1e-9 {
			t.Errorf("%s on %s: expected %.4f, want %.4f", ps.Addr, ps.Node, ps.Expected, want[ps.Node])
		}
		if counted && cause == "placement" && ps.Share.Valid() && !(float64(ps.Lo) <= ps.ExpectedHere && ps.ExpectedHere <= float64(ps.Hi)) {
			t.Errorf("%s: share %.4f [%.4f, %.4f] misses %.4f", ps.Addr, float64(ps.Share), float64(ps.Lo), float64(ps.Hi), ps.ExpectedHere)
		}
	}
	dumped := 0
	for _, ns := range pl.Nodes {
		dumped += boolInt(ns.Dumped)
	}
	if counted && cause == "placement" && dumped > 1 && pl.Balancer != "even" {
		t.Errorf("balancer %q (p %v), want even", pl.Balancer, pl.EvenP)
	}
}

// TestExternalFixturesFair: on the real dumps of our dataplane and of
// kube-proxy v1.37.2, with the other nodes' dumps as peers, every node's
// external splits are fair (nothing wrong found) and web's Local imbalance
// (1/3 against 1/9) is explained by placement; each entry kind carries
// the connections sent through it.
func TestExternalFixturesFair(t *testing.T) {
	for _, name := range []string{"kpsim-iptables-correct", "kube-proxy-iptables-correct", "kpsim-nftables-correct", "kube-proxy-nftables-correct", "kpsim-ipvs-correct"} {
		t.Run(name, func(t *testing.T) {
			nd := readExternal(t, name)
			counted := nd.mode != "nftables"
			for _, node := range []string{"node-a", "node-b", "node-c"} {
				r := nd.analyze(node, true)
				if got := findingKinds(r, LevelFinding); len(got) > 0 {
					t.Fatalf("%s: findings %v", node, got)
				}
				if got := findingKinds(r, LevelExplanation); !slices.Contains(got, KindLocalPlacement+" demo/web:http (external, Local)") {
					t.Errorf("%s: explanations %v, want local-placement", node, got)
				}
				wantPlacement(t, r, "placement", counted)
			}
			// Each entry kind on the node it was probed on.
			for node, what := range map[string]string{"node-a": "node port", "node-b": "load-balancer IP", "node-c": "external IP"} {
				r := nd.analyze(node, false)
				xr := externalOf(t, r, "demo/shop:http")
				e := entryOfKind(t, xr, what)
				if xr.Policy != "Cluster" || xr.Verdict != map[bool]string{true: "fair", false: "no counters"}[counted] {
					t.Errorf("%s shop: policy %s verdict %q", node, xr.Policy, xr.Verdict)
				}
				if counted && e.Connections < 1000 {
					t.Errorf("%s shop %s: %d connections counted", node, what, e.Connections)
				}
			}
		})
	}
}

// TestExternalFixturesEntries: node-a's iptables dump counts guarded's
// load-balancer IP by source range (100 allowed, 100 denied by
// KUBE-PROXY-FIREWALL) and gone's node port refused (KUBE-EXTERNAL-SERVICES
// REJECT), ours and kube-proxy's alike; nftables has the same entries
// without counts.
func TestExternalFixturesEntries(t *testing.T) {
	for _, name := range []string{"kpsim-iptables-correct", "kube-proxy-iptables-correct", "kpsim-nftables-correct", "kube-proxy-nftables-correct"} {
		t.Run(name, func(t *testing.T) {
			nd := readExternal(t, name)
			r := nd.analyze("node-a", false)
			g := entryOfKind(t, externalOf(t, r, "demo/guarded:http"), "load-balancer IP")
			gone := entryOfKind(t, externalOf(t, r, "demo/gone:http"), "node port")
			if !g.Ranges || gone.Refused != "REJECT" {
				t.Fatalf("guarded %+v gone %+v", g, gone)
			}
			if nd.mode == "iptables" && (g.Allowed != 100 || g.Denied != 100 || gone.RefusedN != 100) {
				t.Errorf("guarded allowed %d denied %d; gone refused %d; want 100 each", g.Allowed, g.Denied, gone.RefusedN)
			}
			web := externalOf(t, r, "demo/web:http")
			if web.Policy != "Local" || len(web.Entries) < 2 {
				t.Errorf("web: %s %+v", web.Policy, web.Entries)
			}
		})
	}
}

// TestExternalFixturesSkewed: our dataplane with the uniform-probability
// fault. The rules give node-c's three pods 1/3, 2/9, 4/9 (and shop's
// four 1/4, 3/16, 9/64, 27/64): unequal rule shares on the Local split and
// the Cluster one, confirmed by the counts in iptables; the placement
// names the rules, not placement.
func TestExternalFixturesSkewed(t *testing.T) {
	for _, name := range []string{"kpsim-iptables-uniform-probability", "kpsim-nftables-uniform-probability"} {
		t.Run(name, func(t *testing.T) {
			nd := readExternal(t, name)
			r := nd.analyze("node-c", true)
			got := findingKinds(r, LevelFinding)
			local := KindUnequalRules + " demo/web:http (external, Local, node-c)"
			if nd.mode == "nftables" {
				local = KindUnequalRules + " demo/web:http via load-balancer IP 192.0.2.130:80"
			}
			if !slices.Contains(got, local) || !slices.Contains(got, KindUnequalRules+" demo/shop:http") {
				t.Fatalf("findings %v, want %q and shop's", got, local)
			}
			wantPlacement(t, r, "rules", nd.mode == "iptables")
			if pl := r.Placement[0]; !strings.Contains(pl.Message, "node-c (rules unequal)") {
				t.Errorf("placement message: %s", pl.Message)
			}
		})
	}
}

// TestExternalFixturesOneNode: one node's dump and the API's placement:
// the other nodes' pods are predicted, not counted; the node's own split
// is tested; the imbalance is still placement's.
func TestExternalFixturesOneNode(t *testing.T) {
	nd := readExternal(t, "kpsim-iptables-correct")
	r := nd.analyze("node-c", false)
	if r.Problems() {
		t.Fatalf("findings %v", findingKinds(r, LevelFinding))
	}
	wantPlacement(t, r, "placement", true)
	pl := r.Placement[0]
	if pl.Balancer != "" || !pl.ObservedRatio.Valid() || math.Abs(float64(pl.ObservedRatio)-1) > 0.2 {
		t.Errorf("one node: balancer %q, observed ratio %v (node-c's three pods)", pl.Balancer, pl.ObservedRatio)
	}
	for _, ns := range pl.Nodes {
		if ns.Dumped != (ns.Node == "node-c") {
			t.Errorf("%s dumped %t", ns.Node, ns.Dumped)
		}
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"EXTERNAL", "PLACEMENT demo/web:http", "cause placement", "load-balancer IP 192.0.2.130:80"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestExternalFixturesRead: what the readers make of node-c's real
// iptables dump (ours and kube-proxy's). web's KUBE-SEP chains count the
// Local connections from outside, so its cluster IP port counts its own
// KUBE-SVC jumps (none) instead of reading them as a skew; its external
// path is KUBE-SVL's three endpoints, counted apart, traced from outside
// at 1/3 each; shop's outside connections are its KUBE-SVC counts;
// guarded's path is traced from inside its source ranges.
func TestExternalFixturesRead(t *testing.T) {
	for _, name := range []string{"kpsim-iptables-correct", "kube-proxy-iptables-correct"} {
		t.Run(name, func(t *testing.T) {
			d := readExternal(t, name).dumps["node-c"]
			byName := map[string]*ServicePort{}
			for _, sp := range d.Ports {
				byName[sp.Name] = sp
			}
			web, shop, guarded := byName["demo/web:http"], byName["demo/shop:http"], byName["demo/guarded:http"]
			var sepCounted uint64
			for _, e := range web.Endpoints {
				if e.Observed != 0 {
					t.Errorf("web cluster IP endpoint %s observed %d, want 0 (no cluster IP traffic)", e.Addr, e.Observed)
				}
				sepCounted += parseCounter(e.Evidence.Text)
			}
			xp := web.External
			if sepCounted == 0 || xp == nil || !xp.Local || xp.Counted != CountedApart || len(xp.Endpoints) != 3 || xp.Outside != sepCounted {
				t.Fatalf("web: SEP DNAT %d, external %+v", sepCounted, xp)
			}
			for _, e := range xp.Endpoints {
				if math.Abs(e.P-1.0/3) > quantTol(3) || !strings.HasPrefix(e.Addr.String(), "10.244.2.") {
					t.Errorf("web external %s P %v", e.Addr, e.P)
				}
			}
			if shop.External == nil || shop.External.Counted != CountedWithPort || shop.External.Local {
				t.Errorf("shop external %+v", shop.External)
			}
			if gx := guarded.External; gx == nil || len(gx.Endpoints) != 2 || math.Abs(gx.Endpoints[0].P+gx.Endpoints[1].P-1) > 1e-6 {
				t.Errorf("guarded external %+v", gx)
			}
		})
	}
}

// parseCounter reads the packets of an iptables-save rule line.
func parseCounter(text string) uint64 {
	pk, _, _ := parseCounterPair(strings.SplitN(text, " ", 2)[0])
	return pk
}

// TestExternalFixturesBefore: node-c's dumps before and after the check
// that probed shop's external IP there: the entry counts exactly the
// check's connections, web's Local split nothing new.
func TestExternalFixturesBefore(t *testing.T) {
	dir := extractDumps(t, filepath.Join(externalDir, "kpsim-iptables-correct.tar.gz"))
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(m.Checks, func(dc *DumpedCheck) bool { return dc.Check == "shop-external-ip" })
	if i < 0 || len(m.Checks[i].Verdicts) != 1 {
		t.Fatal("no shop-external-ip check with one verdict")
	}
	dc := m.Checks[i]
	read := func(name string) *Dump {
		d, err := ReadFile(FormatIPTablesSave, filepath.Join(dir, dc.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	r := Analyze(read(dc.After["iptables-save"]), Options{Before: read(dc.Before["iptables-save"]), Node: "node-c"})
	e := entryOfKind(t, externalOf(t, r, "demo/shop:http"), "external IP")
	if want := uint64(dc.Verdicts[0].N); e.Connections != want {
		t.Errorf("external IP: %d connections since the earlier dump, the check sent %d", e.Connections, want)
	}
	if web := externalOf(t, r, "demo/web:http"); web.Split == nil || web.Split.N != 0 || web.Outside != 0 || web.Verdict != "no traffic" {
		t.Errorf("web: %+v", web)
	}
}
