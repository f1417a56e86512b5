// Package agent is the in-cluster side of the probing that harness/conform
// does in namespaces: on a real Kubernetes cluster the harness cannot enter
// a pod's network namespace, so a prober pod (a DaemonSet, one per node)
// sends the probe blocks and echo backend pods count what reaches them. The
// harness drives both over HTTP through the kube-apiserver's pods/proxy
// subresource (Client, PodProxyDoer). The probes are conform's: a TCP SYN or
// a UDP datagram from a raw IP_HDRINCL socket (harness/traffic), probe j of
// a block with the ID tag<<24 | (First+j)&0xffffff and the source port
// traffic.BlockPort(Start, Step, j).
//
// One agent runs in one mode: echo (a backend: normal TCP and UDP servers on
// its ports, and a raw observer counting the probes that arrive, by tag,
// endpoint and client) or probe (sends blocks on request, and a raw ICMP
// observer counting the destination-unreachable errors that quote its
// probes). See README.md for the protocol and the security posture.
package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/harness/traffic"
)

// Port is the agent's HTTP port in its pod (the container port the
// harness names in pods/proxy: POD:9376).
const Port = 9376

// Modes of an agent.
const (
	ModeEcho  = "echo"
	ModeProbe = "probe"
)

// Limits of the protocol.
const (
	// MaxProbes bounds one send request: conform's MaxBlockProbes, one
	// block in which no source port repeats.
	MaxProbes = 32_768
	// MaxTag is the largest tag: the probe ID carries it in its top 8
	// bits, and the IP ID, which an ICMP error quotes, in its top 8 too.
	// Tag 0 works: the kernel replaces a raw packet's IP ID of 0 except in
	// a DF packet (ip_select_ident), and probes carry DF, so the rejects of
	// tag 0's first 65,536 IDs still match (TestAgentsInNamespaces).
	MaxTag = 255
	// MaxTags is how many tags' counts an agent keeps; the oldest is dropped
	// past it, and its Counts say so (Evicted).
	MaxTags = 64
	// maxBody bounds a request body.
	maxBody = 64 << 10
)

// Paths of the agent's HTTP API.
const (
	PathInfo    = "/v1/info"
	PathSend    = "/v1/send"
	PathCounts  = "/v1/counts"
	PathForget  = "/v1/forget"
	PathHealthz = "/healthz"
)

// SendRequest asks a probe agent to send one block of probes: probe j
// (0 <= j < N) goes from Src, source port traffic.BlockPort(Start, Step, j),
// to VIP, with the ID Tag<<24 | (First+j)&0xffffff, as conform's sendBlock
// sends them.
type SendRequest struct {
	Tag   uint32 `json:"tag"`
	Proto string `json:"proto"` // "tcp" or "udp"
	VIP   string `json:"vip"`   // "ip:port", IPv4
	// Src is the probes' source address; empty means the address the
	// kernel's route to VIP picks (the pod's own).
	Src   string `json:"src,omitempty"`
	First uint32 `json:"first"`
	N     int    `json:"n"`
	// Start and Step are the port walk: 0 <= Start < traffic.PortSpan, and
	// Step coprime with PortSpan (odd, not a multiple of 3), so no port
	// repeats within the block.
	Start int `json:"start"`
	Step  int `json:"step"`
}

// SendResult is what a send did: Sent probes written, SendErrors probes
// skipped because the device queue stayed full (ENOBUFS), and Error, when
// the block stopped early (the time bound, another socket error).
type SendResult struct {
	Sent       int    `json:"sent"`
	SendErrors int    `json:"sendErrors"`
	Error      string `json:"error,omitempty"`
}

// Arrival is a count of probes that reached Endpoint (the post-DNAT
// destination, "ip:port") from Client (the source address as the backend
// saw it).
type Arrival struct {
	Endpoint string `json:"endpoint"`
	Client   string `json:"client"`
	N        int    `json:"n"`
}

// Counts is what an agent observed of one tag's probes. An echo agent fills
// Arrivals; a probe agent Rejects and OtherICMP.
type Counts struct {
	Tag uint32 `json:"tag"`
	// Arrivals are sorted by endpoint, then client.
	Arrivals []Arrival `json:"arrivals"`
	// Rejects counts ICMP port-unreachable errors quoting this tag's
	// probes (what iptables REJECT and nftables reject send).
	Rejects int `json:"rejects"`
	// OtherICMP counts the other destination-unreachable codes (network or
	// host unreachable: a probe nobody handled).
	OtherICMP int `json:"otherICMP"`
	// Foreign counts what the agent saw of other tags' probes since it
	// started (an echo's arrivals, a prober's ICMP errors; cumulative, as
	// conform's Counts.Foreign).
	Foreign int `json:"foreign"`
	// ObserverDrops is the cumulative count of packets the kernel dropped
	// on the agent's raw sockets (full receive buffers) since it started:
	// probes delivered that nobody counted. Compare two readings.
	ObserverDrops uint64 `json:"observerDrops"`
	// Evicted says the agent dropped this tag's counts to stay within
	// MaxTags since it first saw the tag (a forget of the tag clears it):
	// the counts miss what came before.
	Evicted bool `json:"evicted,omitempty"`
}

// Total is the sum of the arrivals.
func (c Counts) Total() int {
	n := 0
	for _, a := range c.Arrivals {
		n += a.N
	}
	return n
}

// Info describes an agent.
type Info struct {
	Mode    string `json:"mode"`
	Node    string `json:"node"` // NODE_NAME, from the downward API
	PodIP   string `json:"podIP"`
	Version string `json:"version"`
	// Ports are an echo agent's served ports ("tcp:8080").
	Ports []string `json:"ports,omitempty"`
	// ObserverBuffer says how the raw observer's receive buffer was set
	// (traffic.Observer.Buffer): without CAP_NET_ADMIN the kernel caps it
	// at net.core.rmem_max, and a burst of probes may overflow it
	// (Counts.ObserverDrops).
	ObserverBuffer string `json:"observerBuffer,omitempty"`
}

// errorBody is the JSON of every error the agent answers.
type errorBody struct {
	Error string `json:"error"`
}

// InputError is a request the agent refused (HTTP 400): the field and why.
type InputError struct {
	Field, Msg string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Msg }

// block is a validated SendRequest.
type block struct {
	tag         uint32
	proto       traffic.Proto
	vip         netip.AddrPort
	src         netip.Addr // invalid: the route's choice
	first       uint32
	n           int
	start, step int
}

// validate checks a request and returns the block it asks for.
func (r SendRequest) validate() (block, error) {
	b := block{tag: r.Tag, first: r.First, n: r.N, start: r.Start, step: r.Step}
	if r.Tag > MaxTag {
		return b, &InputError{"tag", fmt.Sprintf("%d is out of range 0..%d (the probe ID carries it in 8 bits)", r.Tag, MaxTag)}
	}
	p, err := ParseProto(r.Proto)
	if err != nil {
		return b, &InputError{"proto", err.Error()}
	}
	b.proto = p
	if b.vip, err = netip.ParseAddrPort(r.VIP); err != nil {
		return b, &InputError{"vip", fmt.Sprintf("%q is not ip:port", r.VIP)}
	}
	if !b.vip.Addr().Is4() || b.vip.Port() == 0 {
		return b, &InputError{"vip", fmt.Sprintf("%q is not an IPv4 address with a port (probes are IPv4 only)", r.VIP)}
	}
	if r.Src != "" {
		if b.src, err = netip.ParseAddr(r.Src); err != nil || !b.src.Is4() {
			return b, &InputError{"src", fmt.Sprintf("%q is not an IPv4 address", r.Src)}
		}
	}
	if r.N < 1 || r.N > MaxProbes {
		return b, &InputError{"n", fmt.Sprintf("%d is out of range 1..%d (one block)", r.N, MaxProbes)}
	}
	if r.Start < 0 || r.Start >= traffic.PortSpan {
		return b, &InputError{"start", fmt.Sprintf("%d is out of range 0..%d", r.Start, traffic.PortSpan-1)}
	}
	if r.Step < 1 || r.Step >= traffic.PortSpan || gcd(r.Step, traffic.PortSpan) != 1 {
		return b, &InputError{"step", fmt.Sprintf("%d is not in 1..%d and coprime with %d (odd, not a multiple of 3): the walk would repeat a port", r.Step, traffic.PortSpan-1, traffic.PortSpan)}
	}
	return b, nil
}

// id is the probe ID of the block's j-th probe, as conform's sendBlock
// builds it.
func (b block) id(j int) uint32 { return b.tag<<24 | (b.first+uint32(j))&0xffffff }

// deadline bounds a block's sending as conform's sendBlock does: 50 µs a
// probe plus 10 s.
func (b block) deadline() time.Duration {
	return time.Duration(b.n)*50*time.Microsecond + 10*time.Second
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ParseProto reads "tcp" or "udp" (any case).
func ParseProto(s string) (traffic.Proto, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return traffic.TCP, nil
	case "udp":
		return traffic.UDP, nil
	}
	return 0, fmt.Errorf("%q is not tcp or udp", s)
}

// PortSpec is a port an echo agent serves: "tcp:8080".
type PortSpec struct {
	Proto traffic.Proto
	Port  uint16
}

func (p PortSpec) String() string {
	return strings.ToLower(p.Proto.String()) + ":" + strconv.Itoa(int(p.Port))
}

// ParsePorts reads a comma-separated list of PROTO:PORT ("tcp:8080,udp:8080").
func ParsePorts(s string) ([]PortSpec, error) {
	var out []PortSpec
	seen := map[PortSpec]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		proto, port, ok := strings.Cut(f, ":")
		if !ok {
			return nil, fmt.Errorf("port %q is not PROTO:PORT (tcp:8080)", f)
		}
		p, err := ParseProto(proto)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", f, err)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > math.MaxUint16 {
			return nil, fmt.Errorf("port %q: %q is not a port number 1..65535", f, port)
		}
		ps := PortSpec{p, uint16(n)}
		if seen[ps] {
			return nil, fmt.Errorf("port %q is listed twice", f)
		}
		seen[ps] = true
		out = append(out, ps)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no port in %q", s)
	}
	return out, nil
}

// decodeStrict decodes one JSON value, refusing unknown fields (a
// misspelled field would otherwise be a silent default).
func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}
