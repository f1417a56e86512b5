package diagnose

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/scenario"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/fuzz/FuzzReadNFT* from the read-backs in testdata/nft")

// checkNFTDump is what every input must give: a Dump whose shares are
// probabilities, or bad input (scenario.FieldError, exit 2).
func checkNFTDump(t *testing.T, d *Dump, err error) {
	t.Helper()
	if err != nil {
		if !scenario.IsInvalid(err) {
			t.Fatalf("error is not bad input (exit 2): %v", err)
		}
		if d != nil {
			t.Fatal("a Dump and an error")
		}
		return
	}
	for _, sp := range d.Ports {
		sum := 0.0
		for _, ep := range sp.Endpoints {
			if ep.P < 0 || ep.P > 1+1e-9 {
				t.Fatalf("%s: endpoint %s has P = %v", sp.Name, ep.Addr, ep.P)
			}
			sum += ep.P
		}
		if sum > 1+1e-9 {
			t.Fatalf("%s: the shares sum to %v", sp.Name, sum)
		}
	}
}

func FuzzReadNFT(f *testing.F) {
	f.Add([]byte("table ip kube-proxy {\n\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ReadNFT("f.nft", data)
		checkNFTDump(t, d, err)
	})
}

func FuzzReadNFTJSON(f *testing.F) {
	f.Add([]byte(`{"nftables": [{"table": {"family": "ip", "name": "kube-proxy"}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ReadNFTJSON("f.json", data)
		checkNFTDump(t, d, err)
	})
}

// TestWriteNFTCorpus checks that the fuzz seed corpora are what the
// read-backs give, and rewrites them with -update-corpus (go test
// ./harness/diagnose/ -run TestWriteNFTCorpus -update-corpus): each listing
// whole, each of its tables alone, and the kube-proxy table without the
// large Services (quicker to mutate).
func TestWriteNFTCorpus(t *testing.T) {
	var text, js [][]byte
	for _, v := range []string{"fair", "uniform-probability", "skew-at-mde"} {
		data, err := os.ReadFile(filepath.Join("testdata/nft", v+".nft"))
		if err != nil {
			t.Fatal(err)
		}
		text = append(text, data)
		for _, tb := range bytes.SplitAfter(data, []byte("\n}\n")) {
			if len(bytes.TrimSpace(tb)) > 0 {
				text = append(text, tb)
			}
		}
		var small bytes.Buffer
		for _, l := range strings.SplitAfter(string(data), "\n") {
			if tl := strings.TrimSpace(l); !strings.Contains(l, "web") && !(strings.HasPrefix(tl, "10.244.") && strings.Contains(tl, " . tcp . ")) {
				small.WriteString(l)
			}
		}
		text = append(text, small.Bytes())
		jdata, err := os.ReadFile(filepath.Join("testdata/nft", v+".json"))
		if err != nil {
			t.Fatal(err)
		}
		js = append(js, jdata)
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal(jdata, &doc); err != nil {
			t.Fatal(err)
		}
		var keep []map[string]json.RawMessage
		for _, o := range doc.Nftables {
			if raw, ok := o["rule"]; ok && bytes.Contains(raw, []byte("web")) {
				continue
			}
			keep = append(keep, o)
		}
		b, err := json.Marshal(map[string]any{"nftables": keep})
		if err != nil {
			t.Fatal(err)
		}
		js = append(js, b)
	}
	write := func(dir string, seeds [][]byte) {
		if !*updateCorpus {
			for i, s := range seeds {
				p := filepath.Join(dir, fmt.Sprintf("readback-%02d", i))
				got, err := os.ReadFile(p)
				if err != nil || string(got) != fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s) {
					t.Errorf("%s is not the seed the read-backs give (run with -update-corpus): %v", p, err)
				}
			}
			return
		}
		// Only the read-back seeds are rewritten; inputs the fuzzer
		// found stay.
		old, err := filepath.Glob(filepath.Join(dir, "readback-*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("readback-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("testdata/fuzz/FuzzReadNFT", text)
	write("testdata/fuzz/FuzzReadNFTJSON", js)
}
