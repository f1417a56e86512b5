package cluster

import (
	"fmt"
	"iter"
	"slices"
	"strings"
)

// ResolvePort finds the service port that a reference by Service
// ("namespace/name") and port name means among ports (any order), by the
// rule scenario validation enforces before anything runs: port names the
// port; "" means the Service's only port, whatever it is named. A check on
// a generated single-port Service thus holds for every seed, although the
// seed decides whether the generator names that port (p80) or not. The
// simulator (sim run) and the harness (sim conform) both resolve checks
// here.
func ResolvePort(service, port string, ports iter.Seq[ServicePortName]) (ServicePortName, error) {
	ns, name, _ := strings.Cut(service, "/")
	var found []ServicePortName
	for n := range ports {
		if n.Namespace != ns || n.Name != name {
			continue
		}
		if port != "" && n.Port == port {
			return n, nil
		}
		found = append(found, n)
	}
	if len(found) == 0 {
		return ServicePortName{}, fmt.Errorf("service %s has no service port in the cluster (headless, or not defined)", service)
	}
	if port == "" && len(found) == 1 {
		return found[0], nil
	}
	names := make([]string, len(found))
	for i, n := range found {
		names[i] = n.Port
		if n.Port == "" {
			names[i] = `""`
		}
	}
	slices.Sort(names)
	if port == "" {
		return ServicePortName{}, fmt.Errorf("service %s has ports %s: name one with the port field", service, strings.Join(names, ", "))
	}
	return ServicePortName{}, fmt.Errorf("service %s has no port named %q (it has %s)", service, port, strings.Join(names, ", "))
}
