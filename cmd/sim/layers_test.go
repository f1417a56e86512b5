package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is this module's path; the tables below name packages relative to it.
const module = "github.com/kpsim/kpsim"

// layers places every package of the module, lowest first (issue 12's
// target layout). A package may import, outside its test files, only
// packages of a lower layer plus the siblings listed in siblings; test files
// may import anything that makes no cycle. A new package must be placed here
// (the test fails otherwise), and an entry whose package is gone fails too.
var layers = map[string]int{
	// L0 leaves: no module-internal imports.
	"sim/cluster": 0, "sim/scenario": 0,
	"harness/stats": 0, "harness/testenv": 0, "harness/traffic": 0, "harness/report": 0,
	"dataplane/restore": 0, "dataplane/trace": 0,
	// L0 too: unpacking the dump archives diagnose's tests read.
	"harness/diagnose/archive": 0,
	// L1: the model's readers that need nothing else.
	"sim/oracle": 1, "sim/cost": 1, "sim/apiserver": 1, "dataplane/proxy": 1, "dataplane/netns": 1,
	// L1 too: a scenario placed on a cluster through its API (sim conform
	// --kubeconfig): namespaces, agent pods, Services, EndpointSlices.
	"harness/remote": 1,
	// L2: the dataplane's contract, the simulator's engines, upstream's
	// processes (etcd, kube-apiserver, kube-proxy) in a run's namespaces.
	"dataplane": 2, "sim/engine": 2, "harness/upstream": 2,
	// L2 too: the conntrack cleanup a Syncer drives (through an interface
	// of package dataplane) in a node namespace.
	"dataplane/conntrack": 2,
	// L3: the calibration loop the backends feed; sim capacity's sweep
	// (the engines' sync runner and the cost model, no traffic).
	"dataplane/calibrate": 3, "sim/capacity": 3,
	// L0 and L3: a real local cluster (issue 32): the pause image's
	// program; the cluster on netns and upstream's processes.
	"harness/cluster/pause": 0, "harness/cluster": 3,
	// L1: the in-cluster agent (issue 32): probes and counts in pods,
	// on traffic's packets and raw sockets, driven over pods/proxy.
	"harness/agent": 1,
	// L4: the backends.
	"dataplane/iptables": 4, "dataplane/nftables": 4, "dataplane/ipvs": 4,
	// L5: what builds on the backends or on the whole simulator.
	"dataplane/backends": 5, "dataplane/dataplanetest": 5, "sim/report": 5, "sim/simulate": 5, "harness/topology": 5, "harness/diagnose": 5,
	// L6: the harness's runs.
	"harness/conform": 6, "harness/soak": 6, "harness/differential": 6,
	// L6 too: the diagnose round trip that tests of harness/diagnose and
	// harness/conform share (test support, no command links it).
	"harness/internal/diagnosetest": 6,
	// L7: the microVM.
	"harness/vm": 7,
	// L8-9: the command.
	"cmd/sim/app": 8, "cmd/sim": 9,
	// L8 too: the local cluster's command (up, a pod per node, down).
	"harness/cluster/cmd/kpsim-cluster": 8,
	// L8 too: the agent's command (echo or probe mode, in a pod).
	"harness/agent/cmd/kpsim-agent": 8,
}

// siblings are the imports allowed inside one layer.
var siblings = map[string][]string{
	// sim/scenario validates the typed mode.
	"sim/scenario": {"sim/cluster"},
	// IPVS mode programs iptables too, as kube-proxy's ipvs proxier does.
	"dataplane/ipvs": {"dataplane/iptables"},
	// sim run writes the report it builds.
	"sim/simulate": {"sim/report"},
}

// unreachable lists, per package prefix, what no package under it may reach
// through its non-test imports, directly or not.
var unreachable = []struct {
	under string
	never []string
	why   string
}{
	{"dataplane", []string{"k8s.io/client-go/kubernetes/fake", module + "/sim/scenario", module + "/sim/apiserver"},
		"the dataplane programs a kernel from the cluster model; scenarios and the fake API server are the simulator's"},
	{"sim/oracle", []string{module + "/dataplane"},
		"the oracle reads the documentation, independently of the dataplane it judges"},
}

// depGraph is every package of the module and its non-test dependencies,
// standard library included, with its direct imports, as go list sees them
// for this GOOS.
type depGraph struct {
	imports map[string][]string
	linked  map[string]int // len(.Deps)+1: go list -deps p | wc -l
	own     []string       // the module's packages, relative to module
}

func loadGraph(t *testing.T) *depGraph {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}} {{len .Deps}} {{join .Imports \" \"}}", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	g := &depGraph{imports: map[string][]string{}, linked: map[string]int{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			t.Fatalf("go list -deps: unexpected line %q", sc.Text())
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("go list -deps: unexpected line %q", sc.Text())
		}
		g.imports[f[0]], g.linked[f[0]] = f[2:], n+1
		if rel, ok := relative(f[0]); ok {
			g.own = append(g.own, rel)
		}
	}
	slices.Sort(g.own)
	return g
}

// relative is p inside the module, or false for a package outside it.
func relative(p string) (string, bool) {
	if p == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(p, module+"/")
	return rel, ok
}

// chain is the shortest import chain from one package to another, or nil.
func (g *depGraph) chain(from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var c []string
			for ; p != ""; p = prev[p] {
				c = append(c, p)
			}
			slices.Reverse(c)
			return c
		}
		for _, q := range g.imports[p] {
			if _, seen := prev[q]; !seen && g.imports[q] != nil {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

func show(chain []string) string {
	for i, p := range chain {
		if rel, ok := relative(p); ok {
			chain[i] = rel
		}
	}
	return strings.Join(chain, " -> ")
}

func full(rel string) string {
	if rel == "" {
		return module
	}
	return module + "/" + rel
}

// TestLayers enforces the package layering: every module package is placed,
// imports only lower layers (and listed siblings), and the dataplane and the
// oracle stay clear of what they must never link.
func TestLayers(t *testing.T) {
	g := loadGraph(t)
	for _, p := range g.own {
		layer, ok := layers[p]
		if !ok {
			t.Errorf("package %s is not placed in a layer: add it to layers in cmd/sim/layers_test.go (and to the target layout)", p)
			continue
		}
		t.Logf("L%d %-24s %4d packages linked", layer, p, g.linked[full(p)])
		for _, imp := range g.imports[full(p)] {
			dep, ok := relative(imp)
			if !ok {
				continue
			}
			dl, placed := layers[dep]
			if !placed || dl < layer || slices.Contains(siblings[p], dep) {
				continue // an unplaced package is reported as such
			}
			t.Errorf("%s (L%d) imports %s (L%d): a package may import only lower layers and its listed siblings",
				p, layer, dep, dl)
		}
	}
	for name := range layers {
		if !slices.Contains(g.own, name) {
			t.Errorf("layers names %s, which is not a package of the module: remove it or create it", name)
		}
	}
	for _, u := range unreachable {
		for _, p := range g.own {
			if p != u.under && !strings.HasPrefix(p, u.under+"/") {
				continue
			}
			for _, never := range u.never {
				for target := range g.imports {
					if target != never && !strings.HasPrefix(target, never+"/") {
						continue
					}
					if c := g.chain(full(p), target); c != nil {
						t.Errorf("%s reaches %s (%s): %s", p, target, u.why, show(c))
						break
					}
				}
			}
		}
	}
}

// TestLayersChain checks the chain finder on a graph of its own.
func TestLayersChain(t *testing.T) {
	g := &depGraph{imports: map[string][]string{
		"a": {"b", "c"}, "b": {"d"}, "c": {"d", "e"}, "d": {"e"}, "e": {},
	}}
	if got := fmt.Sprint(g.chain("a", "e")); got != "[a c e]" {
		t.Errorf("chain a -> e = %s, want [a c e]", got)
	}
	if c := g.chain("e", "a"); c != nil {
		t.Errorf("chain e -> a = %v, want none", c)
	}
}
