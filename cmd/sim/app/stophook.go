package app

import (
	"bytes"
	"io"
	"os"
	"syscall"
)

// stopAtEnv names the test hook of the kill soak (cmd/sim
// TestKillConformThenCleanup): when it is set, sim conform stops itself
// (SIGSTOP) right after writing a progress line that contains its value.
// The test then resumes the process (SIGCONT) and kills it a drawn delay
// later, so the kill's moment is measured from the marker's write, not from
// when the test happened to read it (under load, tens of milliseconds later:
// longer than the 25 ms build phase). Unset, the log is the stream itself.
const stopAtEnv = "KPSIM_TEST_STOP_AT"

// stopAt wraps a progress log with the hook when the environment asks.
func stopAt(w io.Writer) io.Writer {
	marker := os.Getenv(stopAtEnv)
	if marker == "" {
		return w
	}
	return &stopWriter{w: w, marker: []byte(marker)}
}

type stopWriter struct {
	w      io.Writer
	marker []byte
}

func (s *stopWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err == nil && bytes.Contains(p, s.marker) {
		// Stopped until the test's SIGCONT; the line is already written.
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	return n, err
}
