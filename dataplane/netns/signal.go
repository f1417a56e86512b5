package netns

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// SignalError is the cause of a context cancelled by WithSignalCleanup.
type SignalError struct{ Signal os.Signal }

func (e *SignalError) Error() string { return fmt.Sprintf("interrupted by %s", e.Signal) }

// WithSignalCleanup tears t down when the process gets SIGINT or SIGTERM,
// then cancels the returned context with a *SignalError cause; the caller
// should return when it is done (t is already removed by then, so a main
// that exits right away leaves nothing). After the first signal the
// handlers are removed, so a second ^C kills the process at once (what it
// leaves, `sim cleanup` removes). t may still be unbuilt: Close interrupts
// a Build in progress. stop removes the handlers without closing t.
func WithSignalCleanup(ctx context.Context, t *Topology) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	var once sync.Once
	stop = func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
		})
	}
	go func() {
		select {
		case s := <-ch:
			stop()
			t.Close()
			cancel(&SignalError{Signal: s})
		case <-done:
			cancel(context.Canceled)
		case <-ctx.Done():
			stop()
		}
	}()
	return ctx, stop
}
