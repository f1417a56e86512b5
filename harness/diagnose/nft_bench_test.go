package diagnose

import (
	"fmt"
	"strings"
	"testing"
)

// bigListing is a kube-proxy v1.37 listing of n ClusterIP Services with 10
// endpoints each (half of them on this node, for the hairpin set), in the
// form nft prints.
func bigListing(n int) []byte {
	var b, svcIPs, clusterIPs, hairpin, chains strings.Builder
	for i := range n {
		ip := fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)
		name := fmt.Sprintf("service-%08d-ns/svc%d/tcp/http", i, i)
		if i > 0 {
			svcIPs.WriteString(",\n\t\t\t     ")
			clusterIPs.WriteString(",\n\t\t\t     ")
		}
		fmt.Fprintf(&svcIPs, "%s . tcp . 80 : goto %s", ip, name)
		clusterIPs.WriteString(ip)
		var items []string
		for e := range 10 {
			ep := fmt.Sprintf("10.%d.%d.%d", 100+e, i/250, i%250+1)
			items = append(items, fmt.Sprintf("%d : %s . 8080", e, ep))
			if e%2 == 0 {
				if hairpin.Len() > 0 {
					hairpin.WriteString(",\n\t\t\t     ")
				}
				fmt.Fprintf(&hairpin, "%s . %s . tcp . 8080", ep, ep)
			}
		}
		fmt.Fprintf(&chains, "\tchain %s {\n\t\tmeta l4proto tcp dnat ip to numgen random mod 10 map { %s }\n\t}\n\n", name, strings.Join(items, ", "))
	}
	fmt.Fprintf(&b, `table ip kube-proxy {
	set cluster-ips {
		type ipv4_addr
		elements = { %s }
	}

	set hairpin-connections {
		type ipv4_addr . ipv4_addr . inet_proto . inet_service
		elements = { %s }
	}

	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { %s }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
	}

	chain services {
		ip daddr @cluster-ips ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000
		ip daddr . meta l4proto . th dport vmap @service-ips
	}

%s}
`, clusterIPs.String(), hairpin.String(), svcIPs.String(), chains.String())
	return []byte(b.String())
}

func TestReadNFTBigListing(t *testing.T) {
	d, err := ReadNFT("big.nft", bigListing(300))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Ports) != 300 || len(d.Skipped) != 0 {
		t.Fatalf("%d ports, skipped %v", len(d.Ports), d.Skipped)
	}
	for _, sp := range d.Ports {
		if len(sp.Endpoints) != 10 || sp.Endpoints[9].P != 0.1 {
			t.Fatalf("%s: %d endpoints", sp.Name, len(sp.Endpoints))
		}
	}
}

// go test -run X -bench ReadNFT ./harness/diagnose/
func BenchmarkReadNFT(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		data := bigListing(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := ReadNFT("big.nft", data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
