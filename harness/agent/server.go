package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/kpsim/kpsim/harness/traffic"
)

// PacketSource is a raw observer: *traffic.Observer in the kernel, a
// FakeNet's observer in tests. Run calls handle with every packet (IP
// header included) until ctx ends; handle is safe for concurrent use.
// Drops is the cumulative count of packets the source lost (the kernel's
// drop counter of full receive buffers).
type PacketSource interface {
	Run(ctx context.Context, handle func([]byte)) error
	Drops() uint64
}

// PacketSink writes one probe packet (IP header included) towards dst:
// *traffic.Sender in the kernel. An error that traffic.IsTransient accepts
// (a full device queue) skips that probe only.
type PacketSink = traffic.PacketSink

// Router says which source address the kernel's route to dst picks (the
// pod's own address, in a pod).
type Router interface {
	Source(dst netip.AddrPort) (netip.Addr, error)
}

// server is what both modes answer: /healthz, /v1/info, /v1/counts and
// /v1/forget over a tally.
type server struct {
	info  Info
	tally *tally
	obs   PacketSource
	mux   *http.ServeMux
}

func newServer(info Info, obs PacketSource) *server {
	s := &server{info: info, tally: newTally(MaxTags), obs: obs, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET "+PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	s.mux.HandleFunc("GET "+PathInfo, func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.info) })
	s.mux.HandleFunc("GET "+PathCounts, s.serveCounts)
	s.mux.HandleFunc("POST "+PathForget, s.serveForget)
	return s
}

// Counts is what the agent observed of tag's probes.
func (s *server) Counts(tag uint8) Counts {
	c := s.tally.counts(tag)
	if s.obs != nil {
		c.ObserverDrops = s.obs.Drops()
	}
	return c
}

// Forget drops the counts of the tags below below (0..256).
func (s *server) Forget(below int) { s.tally.forget(below) }

// Info describes the agent.
func (s *server) Info() Info { return s.info }

func (s *server) serveCounts(w http.ResponseWriter, r *http.Request) {
	tag, err := queryInt(r, "tag", 0, MaxTag)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusOK, s.Counts(uint8(tag)))
}

func (s *server) serveForget(w http.ResponseWriter, r *http.Request) {
	below, err := queryInt(r, "below", 0, MaxTag+1)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	s.Forget(below)
	w.WriteHeader(http.StatusNoContent)
}

// queryInt reads a required integer query parameter in lo..hi.
func queryInt(r *http.Request, name string, lo, hi int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, &InputError{name, "missing (query parameter)"}
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, &InputError{name, fmt.Sprintf("%q is not a number in %d..%d", v, lo, hi)}
	}
	return n, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"could not encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, errorBody{Error: err.Error()})
}

// readBody reads a request body of at most maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, &InputError{"body", fmt.Sprintf("larger than %d bytes", maxBody)}
	}
	return b, err
}

// runAll runs fns until ctx ends or one fails, and returns the first
// error (ctx's when none failed).
func runAll(ctx context.Context, fns ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(fns))
	for _, fn := range fns {
		go func() { errs <- fn(ctx) }()
	}
	var first error
	for range fns {
		err := <-errs
		if first == nil && err != nil && !errors.Is(err, context.Canceled) {
			first = err
			cancel()
		}
	}
	if first != nil {
		return first
	}
	return ctx.Err()
}
