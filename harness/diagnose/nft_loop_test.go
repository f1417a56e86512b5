package diagnose

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A service chain whose numgen map goes back into itself branches without
// end; the kernel refuses loops, but a dump is user input. The tracer's
// step limit ends the trace, and the port's shares are reported unknown.
func TestReadNFTBranchingWithoutEnd(t *testing.T) {
	in := `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.2 . tcp . 80 : goto service-TAZRFJ6F-demo/two/tcp/http }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr . meta l4proto . th dport vmap @service-ips
	}

	chain service-TAZRFJ6F-demo/two/tcp/http {
		numgen random mod 3 vmap { 0 : jump service-TAZRFJ6F-demo/two/tcp/http, 1 : jump service-TAZRFJ6F-demo/two/tcp/http, 2 : goto service-TAZRFJ6F-demo/two/tcp/http }
		meta l4proto tcp dnat to 10.244.0.2:8080
	}
}
`
	start := time.Now()
	d, err := ReadNFT("loop.nft", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Skipped) != 1 || !strings.Contains(d.Skipped[0].Reason, "could not trace") || d.Ports[0].Exact {
		t.Errorf("skipped %+v, exact %v: want the trace given up and the shares unknown", d.Skipped, d.Ports[0].Exact)
	}
	t.Logf("read in %v", time.Since(start)) // not asserted: timing
}

// Chains that each split ten ways into the next: 10^12 paths without a
// loop, as the kernel would accept. The step limit ends the trace.
func TestReadNFTBranchingDAG(t *testing.T) {
	var b strings.Builder
	b.WriteString(`table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.2 . tcp . 80 : goto service-TAZRFJ6F-demo/two/tcp/http }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr . meta l4proto . th dport vmap @service-ips
	}

	chain service-TAZRFJ6F-demo/two/tcp/http {
		jump c0
	}
`)
	for i := range 12 {
		var items []string
		for k := range 10 {
			items = append(items, fmt.Sprintf("%d : jump c%d", k, i+1))
		}
		fmt.Fprintf(&b, "\tchain c%d {\n\t\tnumgen random mod 10 vmap { %s }\n\t}\n", i, strings.Join(items, ", "))
	}
	b.WriteString("\tchain c12 {\n\t\tmeta l4proto tcp dnat to 10.244.0.2:8080\n\t}\n}\n")
	start := time.Now()
	d, err := ReadNFT("dag.nft", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Skipped) != 1 || !strings.Contains(d.Skipped[0].Reason, "steps") || d.Ports[0].Exact {
		t.Errorf("skipped %+v, exact %v: want the trace given up after its step limit and the shares unknown", d.Skipped, d.Ports[0].Exact)
	}
	t.Logf("read in %v", time.Since(start)) // not asserted: timing
}
