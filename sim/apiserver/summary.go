package apiserver

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Summary describes the cluster a scenario expands to, as seen through the
// informers: what `sim run` prints before it simulates.
type Summary struct {
	Scenario       string                    `json:"scenario"`
	File           string                    `json:"file"`
	Seed           uint64                    `json:"seed"`
	Nodes          []NodeSummary             `json:"nodes"`
	Services       int                       `json:"services"`
	ServicePorts   int                       `json:"servicePorts"`
	Headless       int                       `json:"headlessServices"`
	EndpointSlices int                       `json:"endpointSlices"`
	Protocols      map[string]int            `json:"servicePortsByProtocol"`
	Types          map[string]int            `json:"servicePortsByType"`
	Policies       PolicySummary             `json:"policies"`
	Endpoints      EndpointCounts            `json:"endpoints"`
	PerService     Quantiles                 `json:"endpointsPerServicePort"`
	Generated      *scenario.GeneratedCounts `json:"generated,omitempty"`
	Proxy          scenario.Proxy            `json:"proxy"`
	Traffic        *TrafficSummary           `json:"traffic,omitempty"`
	Events         map[string]int            `json:"events"`
	Checks         []string                  `json:"checks"`
}

// NodeSummary is one node and the endpoints placed on it.
type NodeSummary struct {
	Name      string         `json:"name"`
	Zone      string         `json:"zone,omitempty"`
	IP        string         `json:"ip"`
	PodCIDR   string         `json:"podCIDR"`
	Endpoints EndpointCounts `json:"endpoints"`
}

// EndpointCounts counts endpoints (per service port) by condition.
type EndpointCounts struct {
	Total                 int `json:"total"`
	Ready                 int `json:"ready"`
	ServingTerminating    int `json:"servingTerminating"`
	NotServingTerminating int `json:"notServingTerminating"`
	NotReady              int `json:"notReady"`
}

func (c *EndpointCounts) add(e *cluster.Endpoint) {
	c.Total++
	switch {
	case e.Ready:
		c.Ready++
	case e.Serving && e.Terminating:
		c.ServingTerminating++
	case e.Terminating:
		c.NotServingTerminating++
	default:
		c.NotReady++
	}
}

// PolicySummary counts service ports by the settings kube-proxy programs.
type PolicySummary struct {
	ClientIPAffinity           int `json:"clientIPAffinity"`
	InternalTrafficPolicyLocal int `json:"internalTrafficPolicyLocal"`
	ExternalTrafficPolicyLocal int `json:"externalTrafficPolicyLocal"`
	WithoutEndpoints           int `json:"withoutEndpoints"`
	WithoutReadyEndpoints      int `json:"withoutReadyEndpoints"`
}

// Quantiles of a count distribution.
type Quantiles struct {
	Min int `json:"min"`
	P50 int `json:"p50"`
	P90 int `json:"p90"`
	P99 int `json:"p99"`
	Max int `json:"max"`
}

// TrafficSummary is the traffic section in numbers.
type TrafficSummary struct {
	Clients    int `json:"clients"`
	ClientPods int `json:"clientPods"`
	// ExternalClients are the client groups outside the cluster (their
	// addresses are in SourceIPs, once each).
	ExternalClients int   `json:"externalClients,omitempty"`
	SourceIPs       int   `json:"sourceIPs"`
	Connections     int64 `json:"connections"`
}

// Summarize describes the state a tracker holds for an expanded scenario.
func Summarize(exp *scenario.Expanded, st *cluster.State) *Summary {
	sc := exp.Scenario
	s := &Summary{
		Scenario:  sc.Metadata.Name,
		File:      exp.File,
		Seed:      exp.Seed,
		Protocols: map[string]int{},
		Types:     map[string]int{},
		Events:    map[string]int{},
		Generated: exp.Generated,
		Proxy:     sc.Proxy,
		Checks:    []string{},
	}
	nodeIdx := map[string]int{}
	for i, name := range st.SortedNodes() {
		n := st.Nodes[name]
		s.Nodes = append(s.Nodes, NodeSummary{Name: name, Zone: n.Zone, IP: n.IP.String(), PodCIDR: n.PodCIDR.String()})
		nodeIdx[name] = i
	}
	svcs := map[string]bool{}
	s.Headless = exp.HeadlessCount
	s.EndpointSlices = exp.SliceCount
	var per []int
	for _, name := range st.SortedServicePorts() {
		sp := st.Services[name]
		svcs[name.NamespacedName.String()] = true
		s.ServicePorts++
		s.Protocols[string(sp.Name.Protocol)]++
		s.Types[string(sp.Type)]++
		if sp.ClientIPAffinity {
			s.Policies.ClientIPAffinity++
		}
		if sp.InternalLocal {
			s.Policies.InternalTrafficPolicyLocal++
		}
		if sp.ExternalLocal {
			s.Policies.ExternalTrafficPolicyLocal++
		}
		eps := st.Endpoints[name]
		per = append(per, len(eps))
		if len(eps) == 0 {
			s.Policies.WithoutEndpoints++
		}
		ready := false
		for _, e := range eps {
			s.Endpoints.add(e)
			if i, ok := nodeIdx[e.NodeName]; ok {
				s.Nodes[i].Endpoints.add(e)
			}
			ready = ready || e.Ready
		}
		if !ready {
			s.Policies.WithoutReadyEndpoints++
		}
	}
	s.Services = len(svcs)
	s.PerService = quantiles(per)
	if t := sc.Traffic; t != nil {
		ts := &TrafficSummary{Clients: len(t.Clients), Connections: t.Connections}
		if ts.Connections == 0 && t.Duration != nil {
			ts.Connections = int64(t.Rate * t.Duration.Seconds())
		}
		for _, c := range t.Clients {
			if c.Where == cluster.Outside {
				ts.ExternalClients++
				ts.SourceIPs += c.SourceIPs
				continue
			}
			nodes := len(c.Nodes)
			if nodes == 0 {
				nodes = len(st.Nodes)
			}
			ts.ClientPods += nodes * c.PodsPerNode
			ts.SourceIPs += nodes * c.PodsPerNode * c.SourceIPs
		}
		s.Traffic = ts
	}
	for _, e := range sc.Events {
		s.Events[e.Type]++
	}
	for _, c := range sc.Checks {
		s.Checks = append(s.Checks, c.Name)
	}
	return s
}

func quantiles(v []int) Quantiles {
	if len(v) == 0 {
		return Quantiles{}
	}
	v = slices.Clone(v)
	sort.Ints(v)
	q := func(p float64) int { return v[min(len(v)-1, int(p*float64(len(v))))] }
	return Quantiles{Min: v[0], P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: v[len(v)-1]}
}

// maxNodeRows bounds the per-node table in text output.
const maxNodeRows = 40

// WriteTable prints the summary for people.
func (s *Summary) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	p("scenario\t%s (%s)\n", s.Scenario, s.File)
	p("seed\t%d\n", s.Seed)
	p("nodes\t%d\n", len(s.Nodes))
	p("services\t%d (%d service ports, %d headless skipped, %d EndpointSlices)\n", s.Services, s.ServicePorts, s.Headless, s.EndpointSlices)
	p("protocols\t%s\n", kv(s.Protocols))
	p("types\t%s\n", kv(s.Types))
	p("policies\tClientIP affinity %d, internalTrafficPolicy Local %d, externalTrafficPolicy Local %d\n",
		s.Policies.ClientIPAffinity, s.Policies.InternalTrafficPolicyLocal, s.Policies.ExternalTrafficPolicyLocal)
	p("without endpoints\t%d service ports (%d without a ready one)\n", s.Policies.WithoutEndpoints, s.Policies.WithoutReadyEndpoints)
	e := s.Endpoints
	p("endpoints\t%d: ready %d, serving+terminating %d, terminating %d, not ready %d\n", e.Total, e.Ready, e.ServingTerminating, e.NotServingTerminating, e.NotReady)
	q := s.PerService
	p("per service port\tmin %d, p50 %d, p90 %d, p99 %d, max %d\n", q.Min, q.P50, q.P90, q.P99, q.Max)
	p("proxy\tmodes %s; ipvs scheduler %s; minSyncPeriod %s; syncPeriod %s; iptables backend %s\n",
		cluster.JoinModes(s.Proxy.Modes, ","), s.Proxy.IPVSScheduler, s.Proxy.MinSyncPeriod.Duration, s.Proxy.SyncPeriod.Duration, s.Proxy.IPTablesBackend)
	if t := s.Traffic; t != nil {
		p("traffic\t%d clients, %d client pods, %d outside the cluster, %d source IPs, %d connections\n", t.Clients, t.ClientPods, t.ExternalClients, t.SourceIPs, t.Connections)
	}
	p("events\t%s\n", kv(s.Events))
	p("checks\t%d\n", len(s.Checks))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tZONE\tIP\tPOD CIDR\tENDPOINTS\tREADY\tSERVING+TERM\tTERM\tNOT READY")
	for i, n := range s.Nodes {
		if i == maxNodeRows {
			fmt.Fprintf(tw, "... %d more nodes (-o json lists all)\n", len(s.Nodes)-maxNodeRows)
			break
		}
		c := n.Endpoints
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", n.Name, dash(n.Zone), n.IP, n.PodCIDR, c.Total, c.Ready, c.ServingTerminating, c.NotServingTerminating, c.NotReady)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func kv(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
