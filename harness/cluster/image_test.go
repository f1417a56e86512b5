package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"testing"
)

// TestWriteImage reads back an image archive the way an OCI importer does:
// index → manifest → config and layer, each blob matching its digest.
func TestWriteImage(t *testing.T) {
	img := Image{Name: "kpsim.local/pause:3.10.2", Entrypoint: []string{"/pause"},
		Files: []ImageFile{{Path: "/pause", Mode: 0o755, Data: []byte("binary")}, {Path: "/etc/kpsim/x", Mode: 0o644, Data: []byte("x")}}}
	var a, b bytes.Buffer
	if err := WriteImage(&a, img); err != nil {
		t.Fatal(err)
	}
	if err := WriteImage(&b, img); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two writes of one image differ")
	}
	files := untar(t, a.Bytes())
	if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", got)
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	mustJSON(t, files["index.json"], &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.Annotations[annotImage] != img.Name || m.Annotations[annotRefName] != "3.10.2" || m.Platform == nil || m.Platform.OS != "linux" || m.Platform.Architecture != "amd64" {
		t.Errorf("index entry = %+v", m)
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		data, ok := files[blobPath(d)]
		if !ok {
			t.Fatalf("no blob %s", d.Digest)
		}
		sum := sha256.Sum256(data)
		if "sha256:"+hex.EncodeToString(sum[:]) != d.Digest || int64(len(data)) != d.Size {
			t.Fatalf("blob %s does not match its descriptor", d.Digest)
		}
		return data
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	mustJSON(t, blob(m), &manifest)
	var config struct {
		OS, Architecture string
		Config           struct{ Entrypoint []string }
		RootFS           struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	mustJSON(t, blob(manifest.Config), &config)
	if config.OS != "linux" || config.Architecture != "amd64" || len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "/pause" {
		t.Errorf("config = %+v", config)
	}
	if len(manifest.Layers) != 1 || len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Fatalf("layers %v, diff IDs %v: one uncompressed layer whose digest is its diff ID", manifest.Layers, config.RootFS.DiffIDs)
	}
	layer := untar(t, blob(manifest.Layers[0]))
	if string(layer["pause"]) != "binary" || string(layer["etc/kpsim/x"]) != "x" {
		t.Errorf("layer files: %v", keys(layer))
	}
	if _, ok := layer["etc/kpsim/"]; !ok {
		t.Errorf("layer has no parent folder entries: %v", keys(layer))
	}
}

func TestWriteImageRejects(t *testing.T) {
	for _, img := range []Image{
		{Name: "kpsim.local/pause", Files: []ImageFile{{Path: "/pause"}}},
		{Name: "kpsim.local/pause:1", Files: []ImageFile{{Path: "pause"}}},
		{Name: "kpsim.local/pause:1", Files: []ImageFile{{Path: "/a/../pause"}}},
		{Name: "kpsim.local/pause:1"},
	} {
		if err := WriteImage(io.Discard, img); err == nil {
			t.Errorf("WriteImage(%+v) gave no error", img)
		}
	}
}

// untar maps each entry's name to its content (folders to nil).
func untar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

func mustJSON(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
