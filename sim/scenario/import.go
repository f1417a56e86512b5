package scenario

import (
	"bytes"
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Import turns a cluster dump (what kubectl get -o yaml prints) into the
// text of a runnable scenario: the inferred cluster section, default proxy
// settings, a traffic section and the default checks, then the dump's
// documents under objects (each document one item, written from its parsed
// tree, so values, styles, anchors and comments survive and no text
// re-indentation can change what a document means). file names the dump in errors; out names the scenario
// being written, in the errors of the check that it loads again. Bad input
// (not a dump, or a dump that does not load) is an ErrorList.
func Import(file string, data []byte, out string) ([]byte, *Loaded, error) {
	docs, _, err := readDocuments(data)
	if err != nil {
		return nil, nil, ErrorList{yamlSyntaxError(file, err)}
	}
	if len(docs) == 0 || !isDump(docs[0]) {
		return nil, nil, ErrorList{{File: file, Pos: Pos{1, 1}, Message: "not a cluster dump: expected what kubectl get -o yaml prints (a v1 List or Kubernetes objects); a Scenario needs no import"}}
	}
	l, err := Load(file, data)
	if err != nil {
		return nil, nil, err
	}
	sc := l.Scenario
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Written by sim import from %s: the cluster, proxy, traffic and checks\n", sc.Metadata.Description[len("imported from "):])
	b.WriteString("# sections are inferred (see the warnings sim validate prints for the dump);\n")
	b.WriteString("# the objects are the dump's documents, unchanged. Edit freely.\n")
	head := []struct {
		key string
		val any
	}{
		{"apiVersion", APIVersion},
		{"kind", Kind},
		{"metadata", sc.Metadata},
		{"cluster", importedCluster(sc.Cluster)},
		{"proxy", map[string]any{"modes": []string{"iptables"}}},
		{"traffic", Traffic{Clients: []Client{{Name: "probe"}}, Connections: sc.Traffic.Connections}},
		{"checks", importedChecks(sc.Checks)},
	}
	for _, h := range head {
		if err := writeYAMLKey(&b, h.key, h.val); err != nil {
			return nil, nil, fmt.Errorf("could not write the scenario's %s section: %w", h.key, err)
		}
	}
	objects := &yaml.Node{Kind: yaml.SequenceNode}
	objects.Content = docs
	if err := writeYAMLKey(&b, "objects", objects); err != nil {
		return nil, nil, fmt.Errorf("could not write the scenario's objects: %w", err)
	}
	text := b.Bytes()
	again, err := Load(out, text)
	if err != nil {
		return nil, nil, fmt.Errorf("the imported scenario does not load again (a bug of sim import): %v", err)
	}
	if len(again.Scenario.Objects) != len(sc.Objects) {
		return nil, nil, fmt.Errorf("the imported scenario holds %d objects, the dump %d (a bug of sim import)", len(again.Scenario.Objects), len(sc.Objects))
	}
	return text, l, nil
}

// importedCluster is the cluster section as sim import writes it.
func importedCluster(c Cluster) map[string]any {
	m := map[string]any{
		"serviceCIDR":      c.ServiceCIDR,
		"podCIDR":          c.PodCIDR,
		"nodeNetwork":      c.NodeNetwork,
		"nodeCIDRMaskSize": c.NodeCIDRMaskSize,
	}
	if len(c.Nodes) > 0 {
		m["nodes"] = c.Nodes
	}
	return m
}

// importedChecks leaves out the fields validation defaults.
func importedChecks(cs []Check) []Check {
	out := make([]Check, len(cs))
	for i, c := range cs {
		out[i] = Check{Type: c.Type, Service: c.Service, Port: c.Port}
	}
	return out
}

// writeYAMLKey writes "key: value" as block YAML, the value converted
// through its JSON form (the scenario types carry JSON tags).
func writeYAMLKey(b *bytes.Buffer, key string, val any) error {
	v := val
	if _, node := val.(*yaml.Node); !node {
		j, err := json.Marshal(val)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(j, &v); err != nil {
			return err
		}
	}
	enc := yaml.NewEncoder(b)
	enc.SetIndent(2)
	if err := enc.Encode(map[string]any{key: v}); err != nil {
		return err
	}
	return enc.Close()
}
