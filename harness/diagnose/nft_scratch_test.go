package diagnose

import (
	"encoding/json"
	"os"
	"testing"
)

func TestScratchNFT(t *testing.T) {
	for _, f := range []string{"testdata/nft/fair.nft", "testdata/nft/fair.json"} {
		data, _ := os.ReadFile(f)
		d, err := ReadNFT(f, data)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range d.Ports {
			p.Evidence = nil
			for _, e := range p.Endpoints {
				e.Evidence = Line{}
			}
			if len(p.Endpoints) > 4 {
				p.Endpoints = p.Endpoints[:4]
			}
		}
		b, _ := json.MarshalIndent(d, "", " ")
		os.WriteFile("/tmp/b-"+f[len("testdata/nft/"):]+".out", b, 0o644)
	}
}
