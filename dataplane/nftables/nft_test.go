package nftables

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/testenv"
)

// The real-nft tier: the transactions this package writes are loaded with
// the nft binary into the kernel, each sequence inside a network namespace
// of its own (`unshare --net`, which disappears with the process). It needs
// root, nft and unshare, and skips without them; nothing is written outside
// the namespace.

// nftRunner returns a function that runs transaction texts in order in one
// fresh network namespace, then a script of shell commands, and returns the
// combined output.
func nftRunner(t *testing.T) func(txs []string, after string) (string, error) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "nft", "unshare")
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Fatal(err)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal(err)
	}
	return func(txs []string, after string) (string, error) {
		dir := t.TempDir()
		var script strings.Builder
		script.WriteString("set -e\n")
		for i, tx := range txs {
			p := filepath.Join(dir, fmt.Sprintf("tx%d.nft", i))
			if err := os.WriteFile(p, []byte(tx), 0o600); err != nil {
				return "", err
			}
			fmt.Fprintf(&script, "%s -f %s || { echo 'transaction %d failed'; exit 1; }\n", nft, p, i)
		}
		script.WriteString(strings.ReplaceAll(after, "nft ", nft+" "))
		cmd := exec.Command(unshare, "--net", "sh", "-c", script.String())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
}

func TestNFTAcceptsFullSync(t *testing.T) {
	run := nftRunner(t)
	for _, layout := range layouts {
		for _, faults := range [][]string{nil, {"uniform-probability"}, {"affinity-no-timeout"}, {"drop-last-endpoint"},
			{"skew-at-mde"}, {"affinity-leak"}, {"affinity-overstay"}, {"skew-at-mde", "affinity-leak", "affinity-overstay"}} {
			t.Run(fmt.Sprintf("%s/%v", layout, faults), func(t *testing.T) {
				cfg := testConfig(layout)
				for _, f := range faults {
					cfg.Faults[faultNamed(f)] = true
				}
				st := overallState()
				addWide(st, 12)
				addWide(st, 50)
				b, _ := newFakeBackend(t, cfg)
				tx, _ := sync(t, b, st, nil, true)
				out, err := run([]string{tx}, "nft list table ip kube-proxy > /dev/null\n")
				if err != nil {
					t.Fatalf("nft refused the full sync: %v\n%s\n%s", err, out, numbered(tx))
				}
			})
		}
	}
}

func numbered(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		fmt.Fprintf(&b, "%4d %s\n", i+1, l)
	}
	return b.String()
}

// TestNFTAcceptsPartialSyncs runs a random walk of partial syncs (and a
// full sync now and then) through the kernel, in order, in one namespace:
// every transaction must be accepted against the state the previous ones
// left, which checks the operation order (flush before delete, elements
// before chains).
func TestNFTAcceptsPartialSyncs(t *testing.T) {
	run := nftRunner(t)
	for _, c := range []struct {
		layout Layout
		faults []proxy.Fault
	}{
		{LayoutKubeProxy, nil},
		{LayoutFast, nil},
		{LayoutKubeProxy, []proxy.Fault{proxy.FaultUniformProbability, proxy.FaultAffinityNoTimeout}},
		{LayoutFast, []proxy.Fault{proxy.FaultUniformProbability, proxy.FaultAffinityNoTimeout, proxy.FaultDropLastEndpoint}},
	} {
		layout := c.layout
		t.Run(fmt.Sprintf("%s/%v", layout, c.faults), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(len(layout)+len(c.faults))))
			st := overallState()
			b, _ := newFakeBackend(t, testConfig(layout, c.faults...))
			tx, _ := sync(t, b, st, nil, true)
			txs := []string{tx}
			for step := range 80 {
				changed := mutate(rng, st)
				tx, _ := sync(t, b, st, changed, step%40 == 39)
				if tx != "" {
					txs = append(txs, tx)
				}
			}
			out, err := run(txs, "nft list table ip kube-proxy > /dev/null\n")
			if err != nil {
				t.Fatalf("nft refused a transaction: %v\n%s", err, out)
			}
		})
	}
}

// TestNFTCountersLive loads the overall state, sends connections from the
// namespace itself to each cluster IP, and checks that both counter parsers
// read back what was sent. With -update it stores the listings as the
// fixtures of TestParseCounters*.
func TestNFTCountersLive(t *testing.T) {
	run := nftRunner(t)
	const n = 6
	for _, layout := range countedLayouts {
		t.Run(string(layout), func(t *testing.T) {
			st := overallState()
			b, _ := newFakeBackend(t, testConfig(layout))
			tx, _ := sync(t, b, st, nil, true)
			var script strings.Builder
			// Cluster IPs routed to lo; endpoints are local addresses,
			// so a DNATed SYN is answered at once (RST).
			dir := t.TempDir()
			script.WriteString("ip link set lo up\nip route add 172.30.0.0/16 dev lo\nip route add local 10.0.0.0/8 dev lo\n")
			for _, spn := range st.SortedServicePorts() {
				sp := st.Services[spn]
				proto := strings.ToLower(string(spn.Protocol))
				fmt.Fprintf(&script, "for i in $(seq %d); do timeout 1 bash -c 'echo x > /dev/%s/%s/%d' 2>/dev/null & done\n", n, proto, sp.ClusterIP, sp.Port)
			}
			fmt.Fprintf(&script, "wait\nnft list table ip kube-proxy > %s/text\nnft -j list table ip kube-proxy > %s/json\n", dir, dir)
			out, err := run([]string{tx}, script.String())
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			text, err1 := os.ReadFile(filepath.Join(dir, "text"))
			js, err2 := os.ReadFile(filepath.Join(dir, "json"))
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			refs := b.r.Refs()
			fromJSON, err := ParseCountersJSON(js, refs)
			if err != nil {
				t.Fatal(err)
			}
			fromText := ParseCountersText(string(text), refs)
			if !slices.Equal(fromJSON, fromText) {
				t.Errorf("json and text counters differ:\n%v\n%v", fromJSON, fromText)
			}
			sum := map[string]uint64{}
			for _, c := range fromJSON {
				sum[c.ServicePort.String()] += c.Packets
			}
			for _, spn := range st.SortedServicePorts() {
				got := sum[spn.String()]
				switch spn.Name {
				case "svc5", "svc6":
					// DROP and REJECT (ICMP): a SYN retransmitted
					// before the client gives up counts again.
					if got < n {
						t.Errorf("%s: %d packets counted, want at least %d", spn, got, n)
					}
				default:
					if got != n {
						t.Errorf("%s: %d connections counted, want %d (%v)", spn, got, n, fromJSON)
					}
				}
			}
			if dataplanetest.Updating() {
				for ext, b := range map[string][]byte{".txt": text, ".json": js} {
					if err := os.WriteFile(filepath.Join("testdata", "counters-"+string(layout)+ext), b, 0o644); err != nil {
						t.Fatalf("could not update the golden: %v", err)
					}
				}
			}
		})
	}
}
