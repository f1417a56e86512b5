package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// Image is a one-layer image of static files, written as an OCI archive
// (WriteImage) that `ctr -n k8s.io images import` loads into a node's
// containerd: the local cluster's nodes never pull from a registry.
type Image struct {
	// Name is the full reference the node's containerd records
	// (kpsim.local/pause:3.10.2): the index annotation
	// io.containerd.image.name, which ctr import takes as the image's name.
	Name string
	// Files are the layer's regular files (absolute paths in the image).
	Files []ImageFile
	// Entrypoint is the image's ENTRYPOINT.
	Entrypoint []string
}

// ImageFile is one file of an Image's layer.
type ImageFile struct {
	Path string // absolute, e.g. /pause
	Mode int64  // e.g. 0o755
	Data []byte
}

// PauseImage is the sandbox image name every node's containerd pins
// (the kubeadm constant's tag: kubelet 1.37 has no flag for it any more).
const PauseImage = "kpsim.local/pause:3.10.2"

// The agent's images (harness/agent's kpsim-agent, one binary): the echo
// server the Services' backends run, and the prober that sends to them.
// Neither is pulled: both are imported on every node (AgentImages), and
// their tag is not "latest", so a pod's default pull policy is
// IfNotPresent.
const (
	EchoImage   = "kpsim.local/echo:dev"
	ProberImage = "kpsim.local/prober:dev"
)

// agentPath is the agent's path in its images.
const agentPath = "/" + AgentName

// AgentImages are the echo and prober images of the agent binary, by
// archive file name: one layer holding /kpsim-agent, entrypoints
// ["/kpsim-agent","echo"] and ["/kpsim-agent","probe"].
func AgentImages(agent []byte) map[string]Image {
	files := []ImageFile{{Path: agentPath, Mode: 0o755, Data: agent}}
	return map[string]Image{
		"echo.tar":   {Name: EchoImage, Files: files, Entrypoint: []string{agentPath, "echo"}},
		"prober.tar": {Name: ProberImage, Files: files, Entrypoint: []string{agentPath, "probe"}},
	}
}

// OCI media types and annotations WriteImage uses.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	annotImage    = "io.containerd.image.name"
	annotRefName  = "org.opencontainers.image.ref.name"
)

// imageEpoch is every timestamp in the archive, so the same files give the
// same bytes (and digests).
var imageEpoch = time.Unix(0, 0).UTC()

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// WriteImage writes img to w as an OCI image layout in a tar archive
// (oci-layout, index.json, blobs/sha256/...): an uncompressed layer, the
// image config (linux/amd64, the entrypoint, the layer's diff ID), the
// manifest, and an index naming it img.Name. Deterministic: the same image
// gives the same bytes.
func WriteImage(w io.Writer, img Image) error {
	if !strings.Contains(img.Name, ":") || strings.ContainsAny(img.Name, " \t\n") {
		return fmt.Errorf("could not write image %q: the name needs a tag (name:tag)", img.Name)
	}
	layer, err := layerTar(img.Files)
	if err != nil {
		return fmt.Errorf("could not write image %s: %w", img.Name, err)
	}
	layerDesc := blobDesc(mediaLayer, layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      imageEpoch.Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": img.Entrypoint},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
		"history":      []map[string]any{{"created": imageEpoch.Format(time.RFC3339), "created_by": "kpsim harness/cluster.WriteImage"}},
	})
	if err != nil {
		return err
	}
	configDesc := blobDesc(mediaConfig, config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := blobDesc(mediaManifest, manifest)
	manifestDesc.Platform = &platform{Architecture: "amd64", OS: "linux"}
	_, tag, _ := strings.Cut(img.Name[strings.LastIndex(img.Name, "/")+1:], ":")
	manifestDesc.Annotations = map[string]string{annotImage: img.Name, annotRefName: tag}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layerDesc), layer},
		{blobPath(configDesc), config},
		{blobPath(manifestDesc), manifest},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: imageEpoch}); err != nil {
			return fmt.Errorf("could not write image %s: %w", img.Name, err)
		}
	}
	for _, e := range entries {
		if err := writeTarFile(tw, e.name, 0o644, e.data); err != nil {
			return fmt.Errorf("could not write image %s: %w", img.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("could not write image %s: %w", img.Name, err)
	}
	return nil
}

// WriteImageFile writes img to the file at p (WriteImage).
func WriteImageFile(p string, img Image) error {
	var b bytes.Buffer
	if err := WriteImage(&b, img); err != nil {
		return err
	}
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("could not write image %s: %w", img.Name, err)
	}
	return nil
}

// layerTar is the layer: each file's parent folders, then the file.
func layerTar(files []ImageFile) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	dirs := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("file path %q is not a clean absolute path", f.Path)
		}
		rel := strings.TrimPrefix(f.Path, "/")
		var parents []string
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: imageEpoch}); err != nil {
				return nil, err
			}
		}
		if err := writeTarFile(tw, rel, f.Mode, f.Data); err != nil {
			return nil, err
		}
	}
	if len(files) == 0 {
		return nil, errors.New("no file in the layer")
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeTarFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: imageEpoch}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func blobDesc(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

func blobPath(d descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }
