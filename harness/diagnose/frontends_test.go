package diagnose

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// frontendWords is a port's Frontends in one line each: what, where,
// Local, the endpoints reached, the evidence's line number.
func frontendWords(sp *ServicePort) []string {
	var out []string
	for _, f := range sp.Frontends {
		where := fmt.Sprintf("*:%d", f.Port)
		if f.Addr.IsValid() {
			where = netip.AddrPortFrom(f.Addr, uint16(f.Port)).String()
		}
		var eps []string
		for _, e := range f.Endpoints {
			eps = append(eps, e.String())
		}
		local := ""
		if f.Local {
			local = " Local"
		}
		out = append(out, fmt.Sprintf("%s %s%s -> %s", f.What, where, local, strings.Join(eps, ",")))
	}
	return out
}

// The iptables read-backs of dataplanetest's overall state: external IPs,
// load-balancer IPs (one behind a KUBE-FW chain) and node ports find their
// port by the chains' hash; the 127.0.0.0/8 copy of a node port rule is
// the same node port, and the rule for every address is its evidence.
func TestIPTablesFrontends(t *testing.T) {
	want := map[string][]string{
		"ns8/svc8:dns":   {"node port *:30053 Local -> 10.180.0.13:53,10.180.0.14:53"},
		"ns9/svc9":       {"node port *:30080 -> 10.180.0.15:8080"},
		"ns10/svc10:p80": {"external IP 192.168.99.10:80 Local -> 10.180.0.16:80,10.180.0.17:80", "load-balancer IP 1.2.3.10:80 Local -> 10.180.0.16:80,10.180.0.17:80", "node port *:30010 Local -> 10.180.0.16:80,10.180.0.17:80"},
		"ns11/svc11:p80": {"load-balancer IP 5.6.7.11:80 -> 10.180.0.18:80,10.180.0.19:80", "node port *:30012 -> 10.180.0.18:80,10.180.0.19:80"},
		// externalTrafficPolicy Local without a local endpoint: only pod
		// traffic is translated, to the cluster endpoints.
		"ns12/svc12:p80": {"external IP 192.168.99.12:80 -> 10.180.0.20:80"},
	}
	for _, variant := range []string{"nft", "legacy"} {
		d := readFile(t, "overall."+variant)
		for _, sp := range d.Ports {
			if diff := cmp.Diff(want[sp.Name], frontendWords(sp)); diff != "" {
				t.Errorf("%s %s frontends (-want +got):\n%s", variant, sp.Name, diff)
			}
			for _, f := range sp.Frontends {
				if f.What == "node port" && strings.Contains(f.Evidence.Text, "127.0.0.0/8") {
					t.Errorf("%s %s: node port evidence is the localhost rule: %s", variant, sp.Name, f.Evidence.Text)
				}
			}
		}
	}
}

// The nftables read-back of the same state (testdata/nft/overall.nft):
// service-nodeports elements become node port frontends of the port with
// the same chain base; external and load-balancer IPs stay ports of their
// own, as the reader has always made them.
func TestNFTFrontends(t *testing.T) {
	d := nftReadBack(t, "overall.nft")
	want := map[string][]string{
		"ns8/svc8:dns":   {"node port *:30053 Local -> 10.180.0.13:53,10.180.0.14:53"},
		"ns9/svc9":       {"node port *:30080 -> 10.180.0.15:8080"},
		"ns10/svc10:p80": {"node port *:30010 Local -> 10.180.0.16:80,10.180.0.17:80"},
		"ns11/svc11:p80": {"node port *:30012 -> 10.180.0.18:80,10.180.0.19:80"},
		"ns13/svc13:p80": {"node port *:30013 -> 10.180.0.21:80"},
	}
	seen := map[string]bool{}
	for _, sp := range d.Ports {
		if strings.HasPrefix(sp.Chain, "external-") {
			if len(sp.Frontends) != 0 {
				t.Errorf("external IP port %s %s has frontends %v", sp.Name, sp.ClusterIP, frontendWords(sp))
			}
			continue
		}
		seen[sp.Name] = true
		if diff := cmp.Diff(want[sp.Name], frontendWords(sp)); diff != "" {
			t.Errorf("%s frontends (-want +got):\n%s", sp.Name, diff)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no port %s in the read-back", name)
		}
	}
}
