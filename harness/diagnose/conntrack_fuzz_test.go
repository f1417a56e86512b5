package diagnose

import (
	"os"
	"strings"
	"testing"
)

// FuzzReadConntrack: any input either reads or is rejected with
// FieldErrors that name the file and a line of it; every entry read has
// both tuples, and its text alone reads back to the same entry (the count
// line, wherever it cut the entry, is gone from it).
func FuzzReadConntrack(f *testing.F) {
	for _, name := range []string{"overall.conntrack", "overall-extended.conntrack", "forms.conntrack", "forms.proc"} {
		data, err := os.ReadFile("testdata/conntrack/" + name)
		if err != nil {
			f.Fatal(err)
		}
		lines := strings.SplitAfter(string(data), "\n")
		f.Add([]byte(strings.Join(lines[:min(4, len(lines))], "")))
	}
	f.Add([]byte("tcp      6 431996 ESTABLISHED src=10.0.5.2 dst=172.30.0.42 sport=38140 dport=80 src=10.180.0.4 dst=10.0.5.2 sport=80 dport=38140 [ASSURconntrack v1.4.7 (conntrack-tools): 1 flow entries have been shown.\nED] mark=0 use=1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ct, err := ReadConntrack("ct", data)
		if err != nil {
			requireLocated(t, err, "ct", data)
			return
		}
		for _, fl := range ct.Entries {
			if !fl.Orig.Src.IsValid() || !fl.Orig.Dst.IsValid() || !fl.Reply.Src.IsValid() || !fl.Reply.Dst.IsValid() {
				t.Errorf("line %d: a tuple without addresses: %+v", fl.Line.Line, fl)
			}
			again, err := ReadConntrack("ct", []byte(fl.Line.Text))
			if err != nil || len(again.Entries) != 1 || keyOf(again.Entries[0]) != keyOf(fl) || again.Entries[0].Timeout != fl.Timeout {
				t.Errorf("line %d %q does not read back alone (error %v)", fl.Line.Line, fl.Line.Text, err)
			}
		}
	})
}
