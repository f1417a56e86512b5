package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MarkerDir holds one marker file per live run, RUNID.pid, holding the
// run's process ID. The run holds an exclusive flock on it while it lives;
// the kernel drops the lock when the process dies, however it dies, so
// "locked" means "alive" without trusting a PID that may have been reused.
const MarkerDir = "/run/kpsim"

// marker is a run's locked marker file.
type marker struct {
	path string
	f    *os.File
}

func markerPath(runID string) string { return filepath.Join(MarkerDir, runID+".pid") }

// acquireMarker creates and locks the marker of runID. It fails when another
// live process holds that run ID.
func acquireMarker(runID string) (*marker, error) {
	if err := os.MkdirAll(MarkerDir, 0o755); err != nil {
		return nil, fmt.Errorf("could not create %s: %w", MarkerDir, err)
	}
	path := markerPath(runID)
	// A cleanup may find the file between its creation and the lock, take it
	// for a dead run's and remove it: then the locked file is no longer the
	// one at path, and we try again (three times at most).
	for range 3 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("could not create run marker %s: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("could not lock run marker %s: run %s is in use by a live process", path, runID)
			}
			return nil, fmt.Errorf("could not lock run marker %s: %w", path, err)
		}
		if !sameFile(f, path) {
			f.Close()
			continue
		}
		err = f.Truncate(0)
		if err == nil {
			_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		if err != nil {
			f.Close()
			os.Remove(path)
			return nil, fmt.Errorf("could not write run marker %s: %w", path, err)
		}
		return &marker{path: path, f: f}, nil
	}
	return nil, fmt.Errorf("could not create run marker %s: it kept being removed", path)
}

func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// release removes the marker and drops its lock. Removing before unlocking
// means a cleanup never finds an unlocked marker of a run that is still
// tearing down.
func (m *marker) release() error {
	if m == nil || m.f == nil {
		return nil
	}
	err := os.Remove(m.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	m.f.Close()
	m.f = nil
	if err != nil {
		return fmt.Errorf("could not remove run marker %s: %w", m.path, err)
	}
	return nil
}

// RunState is what the marker of a run says.
type RunState struct {
	RunID string
	// PID is the process that owns (or owned) the run, 0 when unknown.
	PID int
	// Alive is true when a process holds the run's marker lock.
	Alive bool
	// Marker is true when the marker file exists.
	Marker bool
}

// ProbeRun reads the marker of runID: whether a live process holds it and
// its PID. A run without a marker is dead: a run writes its marker before
// it creates any namespace and removes it after deleting the last one.
func ProbeRun(runID string) (RunState, error) {
	st := RunState{RunID: runID}
	path := markerPath(runID)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("could not open run marker %s: %w", path, err)
	}
	defer f.Close()
	st.Marker = true
	var buf [32]byte
	n, _ := f.Read(buf[:])
	st.PID, _ = strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	// A shared lock conflicts with the owner's exclusive lock, and taking it
	// does not stop another prober.
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		st.Alive = true
	case err != nil:
		return st, fmt.Errorf("could not probe the lock of run marker %s: %w", path, err)
	default:
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
	}
	return st, nil
}

// listMarkers returns the run IDs that have a marker file.
func listMarkers() ([]string, error) {
	ents, err := os.ReadDir(MarkerDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("could not list %s: %w", MarkerDir, err)
	}
	var out []string
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".pid")
		if ok && ValidRunID(id) {
			out = append(out, id)
		}
	}
	return out, nil
}
