package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kpsim/kpsim/harness/traffic"
)

// Prober is a probe agent: it sends blocks of probes on request (one at a
// time) and counts the ICMP destination-unreachable errors that come back
// about them, by tag.
type Prober struct {
	*server
	senders []PacketSink
	route   Router
	busy    chan struct{} // one send at a time
	close   []io.Closer
}

// NewProber returns a probe agent that writes probes with senders (a block
// of at least 2,000 probes is written by two goroutines, one per sender,
// when there are two, as conform does), takes their source address from
// route when a request names none, and counts the ICMP errors icmp
// delivers. OpenProber opens the kernel's.
func NewProber(info Info, senders []PacketSink, route Router, icmp PacketSource) *Prober {
	info.Mode, info.Ports = ModeProbe, nil
	p := &Prober{server: newServer(info, icmp), senders: senders, route: route, busy: make(chan struct{}, 1)}
	p.mux.HandleFunc("POST "+PathSend, p.serveSend)
	return p
}

// ServeHTTP answers the agent's API.
func (p *Prober) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

// onICMP counts an ICMP error quoting one of the probes.
func (p *Prober) onICMP(pkt []byte) {
	u, tag, ok := quotedProbe(pkt)
	if !ok {
		return
	}
	p.tally.icmp(tag, u.Code == traffic.CodePortUnreachable)
}

// Run counts ICMP errors until ctx ends and returns ctx's error, or the
// observer's.
func (p *Prober) Run(ctx context.Context) error { return p.obs.Run(ctx, p.onICMP) }

// Close closes the sockets OpenProber opened.
func (p *Prober) Close() error {
	var err error
	for _, c := range p.close {
		err = errors.Join(err, c.Close())
	}
	return err
}

// errBusy is returned when ctx ended while another send was running.
var errBusy = errors.New("another send is running")

// Send sends the block req asks for and returns when it is done: every
// probe written, or the block stopped (ctx, the time bound, a socket
// error; SendResult.Error says which). A request the agent refuses is an
// *InputError.
func (p *Prober) Send(ctx context.Context, req SendRequest) (SendResult, error) {
	b, err := req.validate()
	if err != nil {
		return SendResult{}, err
	}
	select {
	case p.busy <- struct{}{}:
	default:
		select {
		case p.busy <- struct{}{}:
		case <-ctx.Done():
			return SendResult{}, fmt.Errorf("%w: %w", errBusy, ctx.Err())
		}
	}
	defer func() { <-p.busy }()
	if !b.src.IsValid() {
		if b.src, err = p.route.Source(b.vip); err != nil {
			return SendResult{Error: fmt.Sprintf("could not pick a source address for %s: %v", b.vip, err)}, nil
		}
	}
	return p.sendBlock(ctx, b), nil
}

// maxSendErrors bounds the probes a block may skip for a full queue
// (ENOBUFS for too long) before it stops, as conform's.
const maxSendErrors = 1000

// sendBlock writes the block as conform's sendBlock does: probe j from
// b.src, source port traffic.BlockPort(start, step, j), ID b.id(j); two
// goroutines interleave the walk for large blocks.
func (p *Prober) sendBlock(ctx context.Context, b block) SendResult {
	sent, failed, err := traffic.SendWalk(ctx, traffic.Walk{Proto: b.proto, Src: b.src, Dst: b.vip, N: b.n, Start: b.start, Step: b.step,
		ID: b.id, Deadline: time.Now().Add(b.deadline()), MaxSendErrors: maxSendErrors}, p.senders)
	res := SendResult{Sent: sent, SendErrors: failed}
	if len(p.senders) == 0 {
		res.Error = "the agent has no sending socket"
	} else if err != nil {
		res.Error = err.Error()
	}
	return res
}

func (p *Prober) serveSend(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	var req SendRequest
	if err := decodeStrict(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, &InputError{"body", "not a send request: " + err.Error()})
		return
	}
	res, err := p.Send(r.Context(), req)
	var ie *InputError
	switch {
	case errors.As(err, &ie):
		writeError(w, http.StatusBadRequest, err)
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}
