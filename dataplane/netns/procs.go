package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// RunDir is the folder for run id's files: certificates, tokens, etcd's
// data and the logs of the processes a run starts (harness/upstream). The
// run creates it; Topology.Close and Cleanup remove it. It is fixed under
// /tmp, not $TMPDIR, so that `sim cleanup` from another shell finds it.
func RunDir(id string) string { return filepath.Join("/tmp", Prefix+id) }

// Process is a process found inside one of a run's namespaces.
type Process struct {
	PID  int
	Comm string // /proc/PID/comm
}

// ProcessesIn lists the processes whose network namespace is the one
// bind-mounted at path (a /run/netns file), by comparing the device and
// inode of /proc/PID/ns/net with path's. Processes that exit during the
// scan, and zombies (which hold no namespace), are not listed.
func ProcessesIn(path string) ([]Process, error) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return nil, fmt.Errorf("could not stat %s: %w", path, err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("could not list /proc: %w", err)
	}
	var out []Process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil {
			continue
		}
		if st.Dev != want.Dev || st.Ino != want.Ino {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		out = append(out, Process{PID: pid, Comm: strings.TrimSpace(string(comm))})
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out, nil
}

// killWait is how long KillProcesses waits for killed processes to go.
const killWait = 5 * time.Second

// KillProcesses sends SIGKILL to every process listed and waits (5 s at
// most) until none of them is inside a namespace any more. A process that
// has already gone is not an error.
func KillProcesses(procs []Process) error {
	var errs []error
	for _, p := range procs {
		if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("could not kill process %d (%s): %w", p.PID, p.Comm, err))
		}
	}
	deadline := time.Now().Add(killWait)
	for _, p := range procs {
		for processHasNetns(p.PID) {
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("process %d (%s) still runs %s after SIGKILL", p.PID, p.Comm, killWait))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// processHasNetns: an exiting process drops its namespaces before it
// becomes a zombie, so a readable ns/net means it still holds one.
func processHasNetns(pid int) bool {
	var st unix.Stat_t
	return unix.Stat(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net"), &st) == nil
}

// killInside kills every process inside the namespace at path (see
// ProcessesIn) and returns what it killed.
func killInside(path string) ([]Process, error) {
	procs, err := ProcessesIn(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil || len(procs) == 0 {
		return nil, err
	}
	return procs, KillProcesses(procs)
}

// listRunDirs returns the run IDs that have a RunDir.
func listRunDirs() ([]string, error) {
	ents, err := os.ReadDir("/tmp")
	if err != nil {
		return nil, fmt.Errorf("could not list /tmp: %w", err)
	}
	var out []string
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), Prefix)
		if ok && e.IsDir() && ValidRunID(id) {
			out = append(out, id)
		}
	}
	return out, nil
}
