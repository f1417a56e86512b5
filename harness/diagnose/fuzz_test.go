package diagnose

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/scenario"
)

// The seed corpus of FuzzReadIPTablesSave (testdata/fuzz/) is the
// read-backs of testdata/iptables (the smaller ones whole, the larger ones
// cut to their nat table) and the malformed lines of the unit tests.

// FuzzReadIPTablesSave: any input either reads or is rejected with
// FieldErrors that name the file and a line of it; a dump read gives
// probabilities in [0, 1] that sum to at most 1, ports in order, and the
// same result read twice.
func FuzzReadIPTablesSave(f *testing.F) {
	f.Add([]byte("*nat\n:KUBE-SERVICES - [0:0]\n[1:60] -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j ACCEPT\nCOMMIT\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ReadIPTablesSave("dump", data)
		if err != nil {
			requireLocated(t, err, "dump", data)
			return
		}
		for i, sp := range d.Ports {
			if i > 0 {
				p := d.Ports[i-1]
				if c := p.ClusterIP.Compare(sp.ClusterIP); c > 0 || c == 0 && (p.Port > sp.Port || p.Port == sp.Port && p.Protocol >= sp.Protocol) {
					t.Errorf("ports out of order or repeated: %s:%d/%s then %s:%d/%s", p.ClusterIP, p.Port, p.Protocol, sp.ClusterIP, sp.Port, sp.Protocol)
				}
			}
			sum := 0.0
			for _, ep := range sp.Endpoints {
				if ep.P < 0 || ep.P > 1+1e-9 || math.IsNaN(ep.P) {
					t.Errorf("%s:%d endpoint %s: p = %v", sp.ClusterIP, sp.Port, ep.Addr, ep.P)
				}
				sum += ep.P
			}
			if sum > 1+1e-9 {
				t.Errorf("%s:%d: the endpoints' probabilities sum to %v", sp.ClusterIP, sp.Port, sum)
			}
		}
		again, err := ReadIPTablesSave("dump", data)
		if err != nil || !reflect.DeepEqual(d, again) {
			t.Errorf("a second read differs (error %v)", err)
		}
	})
}

// requireLocated fails unless err is a scenario.ErrorList whose every
// error names file and a line and column of data.
func requireLocated(t *testing.T, err error, file string, data []byte) {
	t.Helper()
	var l scenario.ErrorList
	if !errors.As(err, &l) || len(l) == 0 {
		t.Fatalf("error %v is not a scenario.ErrorList", err)
	}
	lines := strings.Count(string(data), "\n") + 1
	for _, e := range l {
		if e.File != file || e.Pos.Line < 1 || e.Pos.Line > lines || e.Pos.Column < 1 || e.Message == "" {
			t.Errorf("error %q does not locate a line of the input (%d lines)", e, lines)
		}
	}
}
