package iptables

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/restore"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// tol is the tolerance on traced probabilities: the kernel quantises each
// rule's probability to 2^-31 and kube-proxy prints 10 decimals, so a
// cascade of up to 20 rules is uniform to about 1e-9.
const tol = 1e-9

func tracePacket(t *testing.T, f *Fake, src netip.Addr, dst string, port int, h trace.History) trace.Result {
	t.Helper()
	res, err := f.Trace(src, "tcp", netip.MustParseAddr(dst), port, h)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, o := range res {
		sum += o.P
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Fatalf("probabilities sum to %v:\n%s", sum, res.Lines())
	}
	return res
}

// targets is "a, b" of the result's targets, with " masq" after those
// masqueraded (kube-proxy's tracePacket format, plus masquerade).
func targets(r trace.Result) string {
	var out []string
	for _, o := range r {
		if o.P <= 0 {
			continue
		}
		s := o.Target
		if o.Masquerade {
			s += " masq"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

func TestTraceSingleEndpoint(t *testing.T) {
	st := newState()
	add(st, clusterIPPort(name("ns1", "svc1", "p80"), "172.30.0.41", 80), ep("10.180.0.1", 80, otherNode, "R"))
	f, _, _ := load(t, testConfig(), st)
	for _, c := range []struct {
		src  netip.Addr
		dst  string
		port int
		want string
	}{
		{podIP, "172.30.0.41", 80, "10.180.0.1:80"},
		{extIP, "172.30.0.41", 80, "10.180.0.1:80 masq"}, // from outside the pod range
		{nodeIP, "172.30.0.41", 80, "10.180.0.1:80 masq"},
		{netip.MustParseAddr("10.180.0.1"), "172.30.0.41", 80, "10.180.0.1:80 masq"}, // hairpin
		{podIP, "172.30.0.41", 81, trace.OutcomeAccept},
		{podIP, "10.0.0.3", 80, trace.OutcomeAccept}, // kube-proxy's "no match"
	} {
		if got := targets(tracePacket(t, f, c.src, c.dst, c.port, nil)); got != c.want {
			t.Errorf("%s -> %s:%d = %q, want %q", c.src, c.dst, c.port, got, c.want)
		}
	}
}

// TestUniformDistribution: the correct cascade gives every endpoint 1/n,
// n = 1..20, within the kernel's quantisation.
func TestUniformDistribution(t *testing.T) {
	for n := 1; n <= 20; n++ {
		st := newState()
		var eps []*cluster.Endpoint
		var want []string
		for i := 0; i < n; i++ {
			e := ep(fmt.Sprintf("10.180.%d.%d", i/200, 1+i%200), 80, otherNode, "R")
			eps = append(eps, e)
			want = append(want, e.String())
		}
		add(st, clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80), eps...)
		f, _, _ := load(t, testConfig(), st)
		res := tracePacket(t, f, podIP, "172.30.0.10", 80, nil)
		if d := trace.Uniform(res, want); d > tol {
			t.Errorf("n=%d: largest deviation from 1/n is %g:\n%s", n, d, res.Lines())
		}
	}
}

func TestNoEndpointsReject(t *testing.T) {
	st := newState()
	n := name("ns6", "svc6", "p80")
	sp := clusterIPPort(n, "172.30.0.46", 80)
	sp.Type, sp.NodePort = corev1.ServiceTypeNodePort, 30006
	add(st, sp)
	f, _, rs := load(t, testConfig(), st)
	for _, c := range []struct {
		src  netip.Addr
		dst  string
		port int
	}{{podIP, "172.30.0.46", 80}, {extIP, "172.30.0.46", 80}, {podIP, nodeIP.String(), 30006}, {extIP, nodeIP.String(), 30006}} {
		if got := targets(tracePacket(t, f, c.src, c.dst, c.port, nil)); got != trace.OutcomeReject {
			t.Errorf("%s -> %s:%d = %q, want REJECT", c.src, c.dst, c.port, got)
		}
	}
	if !strings.Contains(rs.Restore, `"ns6/svc6:p80 has no endpoints"`) {
		t.Errorf("no REJECT comment in:\n%s", rs.Restore)
	}
}

// TestInternalTrafficPolicy is kube-proxy's TestInternalTrafficPolicy
// (reference §4.3).
func TestInternalTrafficPolicy(t *testing.T) {
	for _, c := range []struct {
		name  string
		local bool
		nodes []string // of 10.0.1.1, .2, .3
		want  string
	}{
		{"cluster", false, []string{thisNode, otherNode, otherNode}, "10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80"},
		{"local, one local", true, []string{thisNode, otherNode, otherNode}, "10.0.1.1:80"},
		{"local, two local", true, []string{thisNode, thisNode, otherNode}, "10.0.1.1:80, 10.0.1.2:80"},
		{"local, none local", true, []string{otherNode, otherNode, otherNode}, trace.OutcomeDrop},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := newState()
			sp := clusterIPPort(name("ns1", "svc1", ""), "172.30.1.1", 80)
			sp.InternalLocal = c.local
			var eps []*cluster.Endpoint
			for i, n := range c.nodes {
				eps = append(eps, ep(fmt.Sprintf("10.0.1.%d", i+1), 80, n, "R"))
			}
			add(st, sp, eps...)
			f, _, rs := load(t, testConfig(), st)
			if got := targets(tracePacket(t, f, podIP, "172.30.1.1", 80, nil)); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
			wantNoLocal := 0
			if c.want == trace.OutcomeDrop {
				wantNoLocal = 1
			}
			if rs.NoLocalEndpoints["internal"] != wantNoLocal {
				t.Errorf("NoLocalEndpoints = %v", rs.NoLocalEndpoints)
			}
		})
	}
}

// TestTerminatingEndpoints runs the reference vectors with traffic outcomes
// (harness/testenv/testdata/vectors.yaml: kube-proxy's
// TestTerminatingEndpointsTrafficPolicyLocal/Cluster, reference §4.3, and
// the internalTrafficPolicy cases), with the node port standing in for the
// load-balancer IP.
func TestTerminatingEndpoints(t *testing.T) {
	for _, c := range testenv.TrafficVectors(t) {
		t.Run(c.Name, func(t *testing.T) {
			st, sp := dataplanetest.VectorState(c)
			internal, extern := dataplanetest.VectorTargets(c, "iptables")
			np := int(sp.NodePort)
			f, b, _ := load(t, testConfig(), st)
			if got := targets(tracePacket(t, f, podIP, "172.30.1.1", 80, nil)); got != internal {
				t.Errorf("pod -> cluster IP = %q, want %q", got, internal)
			}
			if extern != "" {
				if got := targets(tracePacket(t, f, extIP, nodeIP.String(), np, nil)); got != extern {
					t.Errorf("external -> node port = %q, want %q", got, extern)
				}
			}
			// After the endpoints are deleted: REJECT for both.
			delete(st.Endpoints, sp.Name)
			apply(t, b, st, []cluster.ServicePortName{sp.Name}, false)
			if got := targets(tracePacket(t, f, podIP, "172.30.1.1", 80, nil)); got != trace.OutcomeReject {
				t.Errorf("after delete: pod -> cluster IP = %q, want REJECT", got)
			}
			if extern == "" {
				return
			}
			if got := targets(tracePacket(t, f, extIP, nodeIP.String(), np, nil)); got != trace.OutcomeReject {
				t.Errorf("after delete: external -> node port = %q, want REJECT", got)
			}
		})
	}
}

// TestNodePortShortCircuit: with externalTrafficPolicy Local, pod and host
// traffic to the node port is short-circuited to the Cluster chain
// (host traffic masqueraded), external traffic goes to local endpoints only.
func TestNodePortShortCircuit(t *testing.T) {
	st := newState()
	sp := clusterIPPort(name("ns2", "svc2", "p80"), "172.30.0.42", 80)
	sp.Type, sp.NodePort, sp.ExternalLocal = corev1.ServiceTypeNodePort, 30002, true
	add(st, sp, ep("10.180.0.2", 80, otherNode, "R"), ep("10.180.0.3", 80, thisNode, "R"))
	f, _, _ := load(t, testConfig(), st)
	for _, c := range []struct {
		src  netip.Addr
		want string
	}{
		{extIP, "10.180.0.3:80"},
		{podIP, "10.180.0.2:80, 10.180.0.3:80"},
		{nodeIP, "10.180.0.2:80 masq, 10.180.0.3:80 masq"},
	} {
		if got := targets(tracePacket(t, f, c.src, nodeIP.String(), 30002, nil)); got != c.want {
			t.Errorf("%s -> node port = %q, want %q", c.src, got, c.want)
		}
	}
}

func affinityState(timeout int32) (*cluster.State, *cluster.ServicePort, []string) {
	st := newState()
	sp := clusterIPPort(name("ns5", "svc5", "p80"), "172.30.0.45", 80)
	sp.ClientIPAffinity, sp.AffinityTimeout = true, timeout
	var eps []*cluster.Endpoint
	var keys []string
	for i := 1; i <= 3; i++ {
		e := ep(fmt.Sprintf("10.180.0.%d", i), 80, otherNode, "R")
		eps = append(eps, e)
		keys = append(keys, e.String())
	}
	add(st, sp, eps...)
	return st, sp, keys
}

// TestAffinity: a client remembered within the timeout by an endpoint's list
// goes there; an older entry, or none, gives the uniform cascade. Both the
// recent layout and the ipset option.
func TestAffinity(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		t.Run(string(mode), func(t *testing.T) {
			st, sp, keys := affinityState(600)
			cfg := testConfig()
			cfg.Affinity = mode
			f, _, _ := load(t, cfg, st)
			list := func(ep string) string { return AffinityList(mode, sp.Name, ep, 600) }
			res := tracePacket(t, f, podIP, "172.30.0.45", 80, trace.History{list(keys[1]): 599 * time.Second})
			if got := targets(res); got != keys[1] {
				t.Errorf("fresh entry: %q, want %s", got, keys[1])
			}
			res = tracePacket(t, f, podIP, "172.30.0.45", 80, trace.History{list(keys[1]): 601 * time.Second})
			if d := trace.Uniform(res, keys); d > tol {
				t.Errorf("expired entry: not uniform:\n%s", res.Lines())
			}
			if d := trace.Uniform(tracePacket(t, f, podIP, "172.30.0.45", 80, nil), keys); d > tol {
				t.Errorf("no entry: not uniform")
			}
			// The first list checked wins when two hold the client.
			res = tracePacket(t, f, podIP, "172.30.0.45", 80, trace.History{list(keys[2]): time.Second, list(keys[0]): time.Second})
			if got := targets(res); got != keys[0] {
				t.Errorf("two entries: %q, want %s", got, keys[0])
			}
		})
	}
}

// TestTraceBudget: chains that fan out without a loop (each jumps twice to
// the next) stop the tracer with an error instead of an exponential walk.
func TestTraceBudget(t *testing.T) {
	f := NewFake()
	text := "*nat\n"
	for i := range 40 {
		text += fmt.Sprintf(":KUBE-SVC-%02d - [0:0]\n", i)
	}
	text += "-A PREROUTING -j KUBE-SVC-00\n"
	for i := range 39 {
		text += fmt.Sprintf("-A KUBE-SVC-%02d -j KUBE-SVC-%02d\n-A KUBE-SVC-%02d -j KUBE-SVC-%02d\n", i, i+1, i, i+1)
	}
	text += "COMMIT\n"
	if err := f.Restore(text); err != nil {
		t.Fatal(err)
	}
	_, err := f.Trace(netip.MustParseAddr("10.0.0.2"), "tcp", netip.MustParseAddr("172.30.0.1"), 80, nil)
	if err == nil || !strings.Contains(err.Error(), "rule evaluations") {
		t.Errorf("trace error %v, want the budget's", err)
	}
}

// TestIPTablesSaveSpelling: the rules as iptables-save prints them load
// (AppendRule) and trace as kube-proxy's input does: MARK --set-xmark
// (--or-mark 0x4000 printed as 0x4000/0x4000, --xor-mark as 0x4000/0x0),
// recent with --mask and --rsource, sctp.
func TestIPTablesSaveSpelling(t *testing.T) {
	f := NewFake()
	nat := f.Tables["nat"]
	for _, c := range []string{"KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-SVC-A", "KUBE-SEP-A"} {
		nat.Chains[c] = &Chain{Name: c}
	}
	for _, r := range []struct{ chain, rule string }{
		{"PREROUTING", "-j KUBE-SERVICES"},
		{"POSTROUTING", "-j KUBE-POSTROUTING"},
		{"KUBE-MARK-MASQ", "-j MARK --set-xmark 0x4000/0x4000"},
		{"KUBE-POSTROUTING", "-m mark ! --mark 0x4000/0x4000 -j RETURN"},
		{"KUBE-POSTROUTING", "-j MARK --set-xmark 0x4000/0x0"},
		{"KUBE-POSTROUTING", "-m mark --mark 0x4000/0x4000 -j ACCEPT"},
		{"KUBE-POSTROUTING", "-j MASQUERADE --random-fully"},
		{"KUBE-SERVICES", "-d 172.30.0.1/32 -p sctp -m sctp --dport 80 -j KUBE-SVC-A"},
		{"KUBE-SVC-A", "! -s 10.0.0.0/8 -d 172.30.0.1/32 -p sctp -m sctp --dport 80 -j KUBE-MARK-MASQ"},
		{"KUBE-SVC-A", "-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A"},
		{"KUBE-SVC-A", "-j KUBE-SEP-A"},
		{"KUBE-SEP-A", "-p sctp -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m sctp -j DNAT --to-destination 10.180.0.1:80"},
	} {
		args, err := restore.Tokenize(r.rule)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.AppendRule("nat", r.chain, args); err != nil {
			t.Fatalf("%s %s: %v", r.chain, r.rule, err)
		}
	}
	// From outside the pod range: marked, so the xor clears the mark and
	// the connection is masqueraded (ACCEPT would skip MASQUERADE had the
	// xor not cleared it).
	res, err := f.Trace(netip.MustParseAddr("203.0.113.2"), "sctp", netip.MustParseAddr("172.30.0.1"), 80, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.String(); got != "10.180.0.1:80 masq 1.000000" {
		t.Errorf("external client: %s", got)
	}
	res, err = f.Trace(netip.MustParseAddr("10.0.0.2"), "sctp", netip.MustParseAddr("172.30.0.1"), 80, trace.History{"KUBE-SEP-A": time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.String(); got != "10.180.0.1:80 1.000000" {
		t.Errorf("pod client with affinity: %s", got)
	}
	if err := f.AppendRule("nat", "KUBE-SVC-A", []string{"-m", "recent", "--rcheck", "--name", "X", "--mask", "255.255.0.0"}); err == nil {
		t.Error("a recent --mask other than /32 loaded")
	}
}
