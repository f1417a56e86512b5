package traffic

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// PacketSink writes one probe packet (IP header included) towards dst: a
// Sender, or a fake in tests.
type PacketSink interface {
	Send(pkt []byte, dst netip.Addr) error
}

// Walk is one block of probes: probe j (0 <= j < N) goes from Src, source
// port BlockPort(Start, Step, j), to Dst, with the ID ID(j). The namespace
// prober (harness/conform) and the in-cluster agent (harness/agent) send
// their blocks with SendWalk.
type Walk struct {
	Proto          Proto
	Src            netip.Addr
	Dst            netip.AddrPort
	N, Start, Step int
	ID             func(j int) uint32
	Deadline       time.Time
	MaxSendErrors  int
}

// SendWalk writes the walk: with two sinks and at least 2,000 probes two
// goroutines interleave it, each on a sink of its own. A probe that could
// not be written for a full queue (IsTransient) is counted in failed and
// skipped, up to MaxSendErrors per goroutine; any other error, or the
// deadline or ctx ending (looked at every 4,096 probes), stops the walk.
func SendWalk(ctx context.Context, w Walk, sinks []PacketSink) (sent, failed int, err error) {
	if len(sinks) == 0 {
		return 0, 0, errors.New("no sending socket")
	}
	workers := 1
	if w.N >= 2000 && len(sinks) >= 2 {
		workers = 2
	}
	sentW := make([]int, workers)
	failedW := make([]int, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for k := range workers {
		wg.Add(1)
		go func(s PacketSink) {
			defer wg.Done()
			bd := NewBuilder()
			for j := k; j < w.N; j += workers {
				if (sentW[k]+failedW[k])%4096 == 0 && (ctx.Err() != nil || time.Now().After(w.Deadline)) {
					errs[k] = fmt.Errorf("sending stopped after %d of %d probes: %w", sentW[k], w.N, errors.Join(ctx.Err(), errors.New("time bound reached")))
					return
				}
				pkt, err := bd.Build(w.Proto, netip.AddrPortFrom(w.Src, BlockPort(w.Start, w.Step, j)), w.Dst, w.ID(j))
				if err == nil {
					err = s.Send(pkt, w.Dst.Addr())
				}
				if err != nil && IsTransient(err) && failedW[k] < w.MaxSendErrors {
					failedW[k]++
					continue
				}
				if err != nil {
					errs[k] = fmt.Errorf("%w (%d probes not sent before it)", err, failedW[k])
					return
				}
				sentW[k]++
			}
		}(sinks[k])
	}
	wg.Wait()
	for k := range workers {
		sent += sentW[k]
		failed += failedW[k]
	}
	return sent, failed, errors.Join(errs...)
}
