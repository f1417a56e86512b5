package iptables

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
)

// bigState is services x endpoints ClusterIP Services, spread over two nodes.
func bigState(services, endpoints int) *cluster.State {
	st := newState()
	for i := 0; i < services; i++ {
		sp := clusterIPPort(name(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("svc%d", i), "http"),
			netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)}).String(), 80)
		var eps []*cluster.Endpoint
		for j := 0; j < endpoints; j++ {
			k := i*endpoints + j
			node := thisNode
			if j%2 == 1 {
				node = otherNode
			}
			eps = append(eps, ep(netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}).String(), 8080, node, "R"))
		}
		add(st, sp, eps...)
	}
	return st
}

func BenchmarkRenderFull5000x10(b *testing.B) {
	st := bigState(5000, 10)
	r, _ := NewRenderer(testConfig())
	b.ReportAllocs()
	for b.Loop() {
		rs, err := r.Render(st, nil, true)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rs.Lines), "lines")
	}
}

func BenchmarkRenderPartial5000x10(b *testing.B) {
	st := bigState(5000, 10)
	r, _ := NewRenderer(testConfig())
	rs, _ := r.Render(st, nil, true)
	r.Commit(rs)
	changed := []cluster.ServicePortName{st.SortedServicePorts()[42]}
	b.ReportAllocs()
	for b.Loop() {
		rs, err := r.Render(st, changed, false)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rs.Lines), "lines")
	}
}
