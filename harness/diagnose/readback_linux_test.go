package diagnose

// The iptables-save test inputs are read-backs from a real kernel: our
// iptables backend loads a scenario's rules into a scratch node namespace
// (both iptables backends), a client pod of that node opens new
// connections to every service port (a SYN each, from a fresh source port:
// nothing answers, but nat PREROUTING has made its decision and counted
// it), and iptables-<variant>-save -c prints the result. As root,
// TestIPTablesReadBack regenerates every case, requires the reader to count
// every connection it made exactly once (an endpoint's DNAT rule or the
// port's REJECT/DROP rule) and to understand the live text as it
// understands the committed file, counters and the header's date aside;
// with -update it rewrites the files (make diagnose-testdata). Review the
// diff.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"golang.org/x/sys/unix"
)

// readBackCase is one generated dump: a scenario's rules for node-a.
type readBackCase struct {
	name     string // file stem
	scenario string // a scenario file, or "" for dataplanetest.OverallState
	cfg      iptables.Config
	svcCIDR  string // the cluster IPs' range, routed out of the node ("": 10.96.0.0/12)
}

func readBackCases() []readBackCase {
	cidr := netip.MustParsePrefix("10.244.0.0/16")
	node := dataplane.NodeConfig{NodeName: "node-a", ClusterCIDR: cidr}
	faulty := node
	faulty.Faults = proxy.Faults{proxy.FaultUniformProbability: true}
	conf := "../../scenarios/conformance/"
	return []readBackCase{
		{"distribution", conf + "distribution.yaml", iptables.Config{NodeConfig: node}, ""},
		{"affinity", conf + "affinity.yaml", iptables.Config{NodeConfig: node}, ""},
		{"internal-traffic-local", conf + "internal-traffic-local.yaml", iptables.Config{NodeConfig: node}, ""},
		{"no-endpoints", conf + "no-endpoints.yaml", iptables.Config{NodeConfig: node}, ""},
		{"many-endpoints", conf + "many-endpoints.yaml", iptables.Config{NodeConfig: node}, ""},
		// kube-proxy drops the per-endpoint comments above 1,000
		// endpoints; a threshold of 10 gives the same layout here.
		{"many-endpoints-large", conf + "many-endpoints.yaml", iptables.Config{NodeConfig: node, LargeClusterThreshold: 10}, ""},
		{"many-endpoints-uniform-fault", conf + "many-endpoints.yaml", iptables.Config{NodeConfig: faulty}, ""},
		// One Service of each kind (NodePort, LoadBalancer-less ETP Local,
		// affinity, Local without local endpoints, no endpoints, UDP, an
		// unnamed port, terminating endpoints), as the backends' goldens.
		{"overall", "", iptables.Config{NodeConfig: dataplane.NodeConfig{NodeName: dataplanetest.ThisNode, ClusterCIDR: dataplanetest.PodCIDR}}, "172.30.0.0/16"},
	}
}

var readBackVariants = []string{iptables.VariantNFT, iptables.VariantLegacy}

func readBackFile(c readBackCase, variant string) string {
	return filepath.Join("testdata", "iptables", c.name+"."+variant+".save")
}

// TestIPTablesReadBack: see the file comment.
func TestIPTablesReadBack(t *testing.T) {
	testenv.RequireRoot(t)
	for _, variant := range readBackVariants {
		testenv.RequireCommands(t, iptables.Tool(variant, "restore"), iptables.Tool(variant, "save"), "ip")
	}
	for _, c := range readBackCases() {
		for _, variant := range readBackVariants {
			t.Run(c.name+"/"+variant, func(t *testing.T) {
				live, attempts := readBack(t, c, variant)
				file := readBackFile(c, variant)
				got, err := ReadIPTablesSave(file, live)
				if err != nil {
					t.Fatalf("the live read-back does not read: %v\n%s", err, live)
				}
				if !checkCounted(t, got, attempts) {
					t.Fatalf("live read-back:\n%s", live)
				}
				if dataplanetest.Updating() {
					if err := os.WriteFile(file, live, 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				committed, err := os.ReadFile(file)
				if err != nil {
					t.Fatalf("%v (generate with make diagnose-testdata, as root)", err)
				}
				want, err := ReadIPTablesSave(file, committed)
				if err != nil {
					t.Fatal(err)
				}
				zeroCounters(want)
				zeroCounters(got)
				if !reflect.DeepEqual(got, want) {
					w, _ := json.MarshalIndent(want, "", " ")
					g, _ := json.MarshalIndent(got, "", " ")
					t.Errorf("the live read-back reads differently from %s (regenerate with -update and review the diff):\n%s", file, lineDiff(string(w), string(g)))
				}
			})
		}
	}
}

// readBack loads c's rules with variant's iptables into a scratch namespace,
// opens connections to each service port from a client pod and returns
// iptables-<variant>-save -c of it, with the connections made per port.
func readBack(t *testing.T, c readBackCase, variant string) ([]byte, map[portKey]int) {
	t.Helper()
	ctx := context.Background()
	st := dataplanetest.OverallState()
	if c.scenario != "" {
		m, err := apiserver.Open(ctx, c.scenario, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		st = m.State
	}
	id, err := netns.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	pc := netip.MustParsePrefix("10.244.0.0/24")
	client := netip.MustParseAddr("10.244.0.250")
	topo, err := netns.Build(ctx, &netns.Config{RunID: id, ServiceCIDR: netip.MustParsePrefix(cmp.Or(c.svcCIDR, "10.96.0.0/12")), Nodes: []netns.NodeConfig{{
		Name: "node-a", Addr: netip.MustParsePrefix("100.65.0.1/16"), PodCIDR: pc, Gateway: pc.Addr().Next(),
		Clients: []netns.ClientConfig{{Group: "diag", Addrs: []netip.Addr{client}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	}()
	n, _ := topo.Node("node-a")
	b, err := iptables.NewBackend(n.NS, c.cfg, variant)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(st, nil, true); err != nil {
		t.Fatal(err)
	}
	cl := topo.Clients()[0].NS
	waitGateway(t, cl, pc.Addr().Next())
	attempts := connect(t, cl, st)
	out, err := n.NS.Exec(iptables.Tool(variant, "save"), "-c")
	if err != nil {
		t.Fatalf("%s -c: %v", iptables.Tool(variant, "save"), err)
	}
	return out, attempts
}

// waitGateway waits until the client's link is up and its gateway answers:
// a burst sent before is dropped before the node sees it.
func waitGateway(t *testing.T, ns *netns.Namespace, gw netip.Addr) {
	t.Helper()
	var neigh []byte
	for range 50 {
		err := ns.Do(func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			// Any answer will do: a datagram to the discard port makes
			// the kernel resolve the gateway.
			_ = unix.Sendto(fd, []byte{0}, 0, &unix.SockaddrInet4{Port: 9, Addr: gw.As4()})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if neigh, err = ns.Exec("ip", "neigh", "show", gw.String()); err == nil && strings.Contains(string(neigh), "lladdr") {
			return
		}
	}
	t.Fatalf("the client pod does not resolve its gateway %s: ip neigh: %s", gw, neigh)
}

// connect opens new connections from the client namespace to every
// service port's cluster IP (30 per endpoint, at least 30, at most 600),
// each from its own source port, and keeps the sockets open until all are
// made so that no source port is reused (a reused tuple would find its
// conntrack entry and skip nat). TCP: a non-blocking connect sends the SYN;
// UDP: one datagram.
func connect(t *testing.T, ns *netns.Namespace, st *cluster.State) map[portKey]int {
	t.Helper()
	made := map[portKey]int{}
	err := ns.Do(func() error {
		var fds []int
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()

		for _, spn := range st.SortedServicePorts() {
			sp := st.Services[spn]
			if !sp.ClusterIP.Is4() {
				continue
			}
			proto := strings.ToLower(string(spn.Protocol))
			typ := unix.SOCK_STREAM
			if proto == "udp" {
				typ = unix.SOCK_DGRAM
			} else if proto != "tcp" {
				continue
			}
			n := min(max(30*len(st.Endpoints[spn]), 30), 600)
			k := portKey{sp.ClusterIP, int(sp.Port), proto}
			for range n {
				fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					return err
				}
				fds = append(fds, fd)
				err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(sp.Port), Addr: sp.ClusterIP.As4()})
				if err != nil && !errors.Is(err, unix.EINPROGRESS) {
					return fmt.Errorf("connect to %s: %w", k.ip, err)
				}
				if typ == unix.SOCK_DGRAM {
					if _, err := unix.Write(fd, []byte{0}); err != nil {
						return fmt.Errorf("send to %s: %w", k.ip, err)
					}
				}
				made[k]++
			}
		}
		// Let the last packets cross the veth into the node's hooks.
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return made
}

// checkCounted requires each port's counters to add up to the connections
// made to it: every new connection is one NAT decision (an endpoint's DNAT
// rule) or one refusal.
func checkCounted(t *testing.T, d *Dump, made map[portKey]int) bool {
	t.Helper()
	ok := true
	for _, sp := range d.Ports {
		k := portKey{sp.ClusterIP, sp.Port, sp.Protocol}
		sum := sp.Refused
		for _, ep := range sp.Endpoints {
			sum += ep.Observed
			if sp.SplitKnown && ep.Fresh+ep.Sticky != ep.Observed {
				t.Errorf("%s %s: fresh %d + sticky %d != observed %d", sp.Name, ep.Addr, ep.Fresh, ep.Sticky, ep.Observed)
			}
		}
		if sum != uint64(made[k]) {
			t.Errorf("%s (%s:%d/%s): the counters add up to %d, %d connections were made", sp.Name, k.ip, k.port, k.proto, sum, made[k])
			ok = false
		}
	}
	return ok
}

// zeroCounters clears what changes from one read-back to the next: the
// date, the counters, and the counters in the evidence lines.
func zeroCounters(d *Dump) {
	d.Captured = time.Time{}
	for _, sp := range d.Ports {
		sp.Refused = 0
		for i := range sp.Evidence {
			zeroLines(&sp.Evidence[i])
		}
		if sp.Affinity != nil {
			zeroLines(&sp.Affinity.Evidence)
		}
		for _, ep := range sp.Endpoints {
			ep.Observed, ep.Fresh, ep.Sticky = 0, 0, 0
			zeroLines(&ep.Evidence)
		}
		for i := range sp.Frontends {
			f := &sp.Frontends[i]
			f.Packets, f.Allowed, f.Denied = 0, 0, 0
			zeroLines(&f.Evidence)
		}
		if xp := sp.External; xp != nil {
			xp.Outside = 0
			for i := range xp.Evidence {
				zeroLines(&xp.Evidence[i])
			}
			for _, ep := range xp.Endpoints {
				ep.Observed, ep.Fresh, ep.Sticky = 0, 0, 0
				zeroLines(&ep.Evidence)
			}
			for i := range xp.Refused {
				xp.Refused[i].Packets = 0
				zeroLines(&xp.Refused[i].Evidence)
			}
		}
	}
	for i := range d.Skipped {
		zeroLines(&d.Skipped[i].Line)
	}
	for i := range d.Ignored {
		zeroLines(&d.Ignored[i].First)
	}
}

func zeroLines(ls ...*Line) {
	for _, l := range ls {
		if strings.HasPrefix(l.Text, "[") {
			if _, rest, ok := strings.Cut(l.Text, "] "); ok {
				l.Text = "[0:0] " + rest
			}
		}
	}
}

// lineDiff lists the lines of b that a lacks (+) and the reverse (-).
func lineDiff(a, b string) string {
	in := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if mb[l] == 0 {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if ma[l] == 0 {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
