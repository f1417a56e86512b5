package nftables

import (
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/sim/cluster"
)

func TestMergeElements(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"add table ip t\n", "add table ip t\n"},
		{"add element ip t s { 1 }\nadd element ip t s { 2 }\nadd element ip t s { 3 }\n",
			"add element ip t s { 1, 2, 3 }\n"},
		// Another set, another verb or another line closes the command.
		{"add element ip t s { 1 }\nadd element ip t u { 2 : goto c-a/b }\nadd element ip t u { 3 : goto c }\ndelete element ip t s { 1 }\nadd element ip t s { 4 }\nadd rule ip t c ip daddr { 1.1.1.1, 2.2.2.2 } drop\nadd element ip t s { 5 comment \"x, y\" }",
			"add element ip t s { 1 }\nadd element ip t u { 2 : goto c-a/b, 3 : goto c }\ndelete element ip t s { 1 }\nadd element ip t s { 4 }\nadd rule ip t c ip daddr { 1.1.1.1, 2.2.2.2 } drop\nadd element ip t s { 5 comment \"x, y\" }\n"},
	} {
		if got := string(MergeElements([]byte(c.in))); got != c.want {
			t.Errorf("MergeElements(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

// TestMergedTransactionsLoadTheSameTable loads each layout's full sync of
// the overall state (external IPs, load-balancer IPs, source ranges,
// affinity) and a partial sync after it, as written and merged, into two
// namespaces: the kernel's tables must be the same.
func TestMergedTransactionsLoadTheSameTable(t *testing.T) {
	run := nftRunner(t)
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			st := overallState()
			addWide(st, 50)
			b, _ := newFakeBackend(t, testConfig(layout))
			full, _ := sync(t, b, st, nil, true)
			spn := st.SortedServicePorts()[0]
			st.Endpoints[spn] = st.Endpoints[spn][1:]
			partial, _ := sync(t, b, st, []cluster.ServicePortName{spn}, false)
			if !strings.Contains(partial, "element") {
				t.Fatalf("the partial sync changes no element:\n%s", partial)
			}
			list := "nft list table ip kube-proxy\n"
			plain, err := run([]string{full, partial}, list)
			if err != nil {
				t.Fatalf("nft refused the transactions as written: %v\n%s", err, plain)
			}
			merged, err := run([]string{string(MergeElements([]byte(full))), string(MergeElements([]byte(partial)))}, list)
			if err != nil {
				t.Fatalf("nft refused the merged transactions: %v\n%s", err, merged)
			}
			if plain != merged {
				t.Errorf("the merged transactions load another table:\n%s", dataplanetest.Diff(plain, merged))
			}
			if n := len(MergeElements([]byte(full))); n >= len(full) {
				t.Errorf("merging did not shorten the full sync (%d bytes, merged %d)", len(full), n)
			}
		})
	}
}
