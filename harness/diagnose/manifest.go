package diagnose

// The manifest of a dump folder written by `sim conform --dump DIR`: the run
// (mode, backend or layout, faults, seed) and, per check on one client node,
// the folder holding the node's dumps before and after the check, the API
// objects at that moment and the verdicts the run reached. The round-trip
// tests (roundtrip_test.go) read it and hold the analysis of each dump
// against those verdicts.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// ManifestFile is the manifest's name in a dump folder.
const ManifestFile = "manifest.json"

// Manifest describes a dump folder: the run and every dumped check, with
// the final verdicts (after Holm).
type Manifest struct {
	Mode            string   `json:"mode"`
	Subject         string   `json:"subject"`
	IPTablesBackend string   `json:"iptablesBackend,omitempty"` // iptables mode: nft or legacy
	Affinity        string   `json:"affinity,omitempty"`        // iptables mode: recent or ipset
	Layout          string   `json:"layout,omitempty"`          // nftables mode: kube-proxy or fast
	Faults          []string `json:"faults,omitempty"`
	Seed            uint64   `json:"seed"`
	Kernel          string   `json:"kernel"`
	FamilyAlpha     float64  `json:"familyAlpha"`
	// Checks lists the dumped checks in the order they ran.
	Checks []*DumpedCheck `json:"checks"`
}

// DumpedCheck is one check on one client node (and phase), the folder its
// files are in, and the verdicts it produced (an affinity check makes
// three: first choice, stickiness, expiry).
type DumpedCheck struct {
	Scenario string `json:"scenario"`
	// File is the scenario file.
	File string `json:"file"`
	// Check is the scenario's check name, Type its type.
	Check string `json:"check"`
	Type  string `json:"type"`
	// ServicePort is "namespace/service:port" as resolved in the run,
	// ClusterIP, Port and Protocol the address it is reached at.
	ServicePort string `json:"servicePort"`
	ClusterIP   string `json:"clusterIP"`
	Port        int    `json:"port"`
	Protocol    string `json:"protocol"`
	// Node is the node whose rules were dumped: the client's.
	Node  string `json:"node"`
	Phase string `json:"phase,omitempty"`
	// Dir is the check's folder, relative to the manifest.
	Dir string `json:"dir"`
	// Before and After map a format (diagnose's names: "iptables-save",
	// "nft", "nft-json", "ipvsadm", "ipvsadm-stats", "ipvsadm-conns") to
	// a file name in Dir; API is api.yaml.
	Before map[string]string `json:"before"`
	After  map[string]string `json:"after"`
	API    string            `json:"api"`
	// Verdicts are the check's verdicts as the run decided them.
	Verdicts []DumpedVerdict `json:"verdicts"`
	// Errors are commands that failed (the file is then missing).
	Errors []string `json:"errors,omitempty"`
}

// DumpedVerdict is one verdict of a dumped check.
type DumpedVerdict struct {
	Name    string  `json:"name"`
	Phase   string  `json:"phase,omitempty"`
	Verdict string  `json:"verdict"` // pass, fail, error, not-run
	Test    string  `json:"test,omitempty"`
	P       float64 `json:"p"`
	N       int     `json:"n"`
	Message string  `json:"message,omitempty"`
}

// ReadManifest reads DIR/manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("could not read %s: %w", filepath.Join(dir, ManifestFile), err)
	}
	return &m, nil
}
