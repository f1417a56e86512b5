package diagnose

import (
	"bytes"
	"encoding/binary"
	"math"
	"net/netip"
	"testing"
	"time"
)

// dumpFromBytes builds a Dump whatever the bytes: the shapes a reader may
// hand over from user input (huge or zero counters, odd probabilities,
// weights, affinity without clients, duplicate endpoints), so that the
// analysis and its outputs never crash on them.
func dumpFromBytes(data []byte) (*Dump, *Dump) {
	r := bytes.NewReader(data)
	u8 := func() byte { b, _ := r.ReadByte(); return b }
	u64 := func() uint64 {
		var b [8]byte
		_, _ = r.Read(b[:])
		return binary.LittleEndian.Uint64(b[:])
	}
	mk := func() *Dump {
		d := &Dump{File: "fuzz", Format: FormatIPTablesSave, Mode: "iptables", Counters: u8()&1 == 1}
		if u8()&1 == 1 {
			d.Captured = time.Unix(int64(u8())*60, 0)
		}
		for range int(u8() % 4) {
			sp := &ServicePort{ClusterIP: netip.AddrFrom4([4]byte{10, 96, 0, u8() % 4}), Port: int(u8() % 3), Protocol: "tcp",
				Exact: u8()&1 == 1, Scheduler: []string{"cascade", "numgen", "rr", "lc"}[u8()%4], LocalOnly: u8()&1 == 1, SplitKnown: u8()&1 == 1}
			if f := u8(); f&1 == 1 {
				sp.Affinity = &Affinity{Timeout: time.Duration(u8()) * time.Minute, Mechanism: []string{"recent", "set", "persistence"}[f/2%3], ClientsKnown: f&2 == 2}
			}
			for range int(u8() % 6) {
				e := &Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, u8() % 8}), 80), Weight: int(int8(u8()))}
				switch u8() % 4 {
				case 0:
					e.P = float64(u8()) / 255
				case 1:
					e.P = math.Float64frombits(u64())
				default:
					e.P = 1 / float64(1+u8()%5)
				}
				switch u8() % 3 {
				case 0:
					e.Observed = uint64(u8())
				case 1:
					e.Observed = u64()
				default:
					e.Observed = uint64(u8()) * 1000
				}
				e.Fresh, e.Sticky = uint64(u8()), uint64(u8())*10
				for range int(u8() % 3) {
					e.Clients = append(e.Clients, Client{Addr: netip.AddrFrom4([4]byte{10, 1, 0, u8()})})
				}
				sp.Endpoints = append(sp.Endpoints, e)
			}
			d.Ports = append(d.Ports, sp)
		}
		if u8()&1 == 1 {
			d.Skipped = append(d.Skipped, Skipped{Line: Line{Text: "-A KUBE-SVC-X 10.96.0.1"}, Reason: "fuzz"})
		}
		return d
	}
	d := mk()
	if u8()&1 == 1 {
		return d, mk()
	}
	return d, nil
}

func FuzzAnalyze(f *testing.F) {
	f.Add([]byte{1, 0, 1, 0, 80, 0, 1, 0, 0, 0, 0, 3, 1, 0, 2, 2, 200, 0, 0, 1, 0, 2, 2, 200, 0, 0, 1, 0, 2, 2, 200, 0, 0})
	f.Add(bytes.Repeat([]byte{0xff, 0x01, 0x7f}, 40))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, before := dumpFromBytes(data)
		opt := Options{Before: before}
		rep := Analyze(d, opt)
		var b bytes.Buffer
		if err := rep.WriteJSON(&b); err != nil {
			t.Fatalf("json: %v", err)
		}
		if err := rep.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteMarkdown(&b); err != nil {
			t.Fatal(err)
		}
	})
}
