package app

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestProgressPhase: a phase line is drawn on a terminal once the command
// has taken a second, and cleared when the phase ends; ending twice is
// harmless; off a terminal nothing is written.
func TestProgressPhase(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, time.Now().Add(-2*time.Second), "always")
	end := p.phase("loading things")
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		drawn := strings.Contains(b.String(), "loading things, ")
		p.mu.Unlock()
		if drawn {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no phase line within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	end()
	end()
	out := b.String()
	if !strings.HasSuffix(out, "\r"+strings.Repeat(" ", 90)+"\r") {
		t.Errorf("the phase line was not cleared at its end: %q", out[max(0, len(out)-120):])
	}
	if n := len(b.String()); func() bool { time.Sleep(600 * time.Millisecond); return len(b.String()) != n }() {
		t.Error("the phase line was drawn again after its end")
	}

	var quiet bytes.Buffer
	q := newProgress(&quiet, time.Now().Add(-2*time.Second), "never")
	q.phase("loading things")()
	if quiet.Len() != 0 {
		t.Errorf("--progress never wrote %q", quiet.String())
	}
}
