package scenario

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Requests makes a client send requests at a rate of its own, each taking
// a duration drawn from Duration: over a pool of long-lived connections
// when the client has a Pool, else one new connection per request (the
// connection lasts the request). traffic.connections, rate and
// connectionDuration are for the clients without requests.
type Requests struct {
	// Rate is the requests per second of each client (each client pod, or
	// each of its source addresses when sourceIPs > 1), a Poisson process
	// over its targets, shared out as connections are (every Service an
	// equal share, split over its ports).
	Rate float64 `json:"rate"`
	// Duration is how long a request takes (default: fixed 0).
	Duration *DurationDist `json:"duration,omitempty"`
}

// Pool is a client's pool of long-lived connections: Size connections to
// each target service port, opened when the run starts, each kept until
// MaxAge (then closed and replaced at once) or for the whole run.
type Pool struct {
	// Size is the number of connections per client and target service
	// port.
	Size int `json:"size"`
	// MaxAge is the maximum connection age; each connection's lifetime is
	// MaxAge with a random jitter of ±10 % (gRPC's MaxConnectionAge adds
	// the same). Without it the connections are kept for the whole run.
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
	// Pick is how a request picks its connection in the pool: round-robin
	// (the default) or least-busy (the fewest requests in flight, the
	// first of them on a tie).
	Pick string `json:"pick,omitempty"`
}

// Request and pool values, documented in scenarios/README.md.
const (
	PickRoundRobin = "round-robin"
	PickLeastBusy  = "least-busy"
	// MaxPoolSize bounds a pool's connections per client and target.
	MaxPoolSize = 1024
	// MaxRequestRate bounds a client's requests per second.
	MaxRequestRate = 1e6
	// MinMaxAge bounds maxAge from below (a connection's lifetime).
	MinMaxAge = 100 * time.Millisecond
	// DefaultParetoAlpha is a Pareto duration's shape when none is given:
	// a finite mean and an infinite variance, the heavy tail of request
	// durations measured in many services.
	DefaultParetoAlpha = 1.5
	// DefaultLognormalSigma is a lognormal duration's sigma (of the log)
	// when none is given.
	DefaultLognormalSigma = 1.5
)

// Enumerations of the request fields.
var (
	PoolPicks        = []string{PickRoundRobin, PickLeastBusy}
	RequestDistKinds = []string{"fixed", "exponential", "pareto", "lognormal"}
)

// clientRequests checks a client's requests and pool and fills their
// defaults. It runs before the client's weight gets its default, so that
// a weight given to a client with requests is seen.
func (v *validator) clientRequests(cp string, c *Client) {
	if c.Pool != nil && c.Requests == nil {
		v.r.at(cp+".pool", "a pool carries requests: give requests (their rate and duration)")
	}
	q := c.Requests
	if q == nil {
		return
	}
	if !(q.Rate > 0 && q.Rate <= MaxRequestRate) {
		v.r.at(cp+".requests.rate", "must be above 0 and at most 10^6 requests per second, got %g", q.Rate)
	}
	if q.Duration == nil {
		q.Duration = &DurationDist{Kind: "fixed"}
	} else {
		v.durationDist(cp+".requests.duration", q.Duration, RequestDistKinds)
	}
	if c.Weight > 0 {
		v.r.at(cp+".weight", "a client with requests sends at requests.rate; weight shares traffic.connections among the clients without requests")
	}
	p := c.Pool
	if p == nil {
		return
	}
	if p.Size < 1 || p.Size > MaxPoolSize {
		v.r.at(cp+".pool.size", "must be between 1 and %d, got %d", MaxPoolSize, p.Size)
	}
	if p.MaxAge != nil && p.MaxAge.Duration < MinMaxAge {
		v.r.at(cp+".pool.maxAge", "must be at least %s, got %s (leave it out to keep the connections for the whole run)", MinMaxAge, p.MaxAge.Duration)
	}
	if p.Pick == "" {
		p.Pick = PickRoundRobin
	} else if !oneOf(p.Pick, PoolPicks) {
		v.r.at(cp+".pool.pick", "unknown value %q (choose from %s)", p.Pick, choices(PoolPicks))
	}
	if c.SourcePorts == "fixed" && p.Size > 1 {
		v.r.at(cp+".sourcePorts", "a pool of %d connections needs a source port for each: random or sequential", p.Size)
	}
}

// durationDist checks a distribution of durations against the kinds
// allowed where it stands, and fills the shape of a heavy-tailed one.
func (v *validator) durationDist(path string, d *DurationDist, kinds []string) {
	if !oneOf(d.Kind, kinds) {
		v.r.at(path+".kind", "unknown distribution %q (choose from %s)", d.Kind, choices(kinds))
	}
	switch {
	case d.Mean.Duration < 0:
		v.r.at(path+".mean", "must not be negative")
	case d.Mean.Duration == 0 && (d.Kind == "pareto" || d.Kind == "lognormal"):
		v.r.at(path+".mean", "a %s distribution needs a positive mean", d.Kind)
	}
	v.distShape(path, d)
	switch d.Kind {
	case "pareto":
		if d.Alpha == 0 {
			d.Alpha = DefaultParetoAlpha
		} else if !(d.Alpha > 1 && d.Alpha <= 100) {
			v.r.at(path+".alpha", "must be above 1 (the mean is infinite at 1 and below) and at most 100, got %g", d.Alpha)
		}
	case "lognormal":
		if d.Sigma == 0 {
			d.Sigma = DefaultLognormalSigma
		} else if !(d.Sigma > 0 && d.Sigma <= 5) {
			v.r.at(path+".sigma", "must be above 0 and at most 5, got %g", d.Sigma)
		}
	}
}

// distShape reports a shape parameter given to a kind that has none.
func (v *validator) distShape(path string, d *DurationDist) {
	if d.Alpha != 0 && d.Kind != "pareto" {
		v.r.at(path+".alpha", "applies to kind pareto only")
	}
	if d.Sigma != 0 && d.Kind != "lognormal" {
		v.r.at(path+".sigma", "applies to kind lognormal only")
	}
}

// requestsOnly checks the traffic-wide volume fields when every client
// sends requests of its own, and reports whether they do: then
// connections, rate and connectionDuration apply to no client, and
// duration, when given, is the length of the run.
func (v *validator) requestsOnly(t *Traffic) bool {
	if len(t.Clients) == 0 {
		return false
	}
	for _, c := range t.Clients {
		if c.Requests == nil {
			return false
		}
	}
	const why = "applies to clients without requests, and every client here gives requests"
	if t.Connections != 0 {
		v.r.at("traffic.connections", why)
	}
	if t.Rate != 0 {
		v.r.at("traffic.rate", why+" (duration alone sets the length of the run)")
	}
	if t.ConnectionDuration != nil {
		v.r.at("traffic.connectionDuration", why+" (their requests.duration is the duration)")
	}
	if d := t.Duration; d != nil && (d.Duration <= 0 || d.Duration > 24*time.Hour) {
		v.r.at("traffic.duration", "must be positive and at most 24h, got %s", d.Duration)
	}
	return true
}
