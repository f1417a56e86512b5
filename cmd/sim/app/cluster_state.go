package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/cluster"
)

// States a cluster's supervisor writes into its state file.
const (
	clusterStarting = "starting"
	clusterReady    = "ready"
	clusterFailed   = "failed"
	clusterStopping = "stopping"
)

// clusterState is a local cluster's state file,
// /run/kpsim/<run ID>.cluster.json, written by its supervisor (sim cluster
// serve): created when it starts, rewritten as the cluster comes up or
// fails, removed as its last act after the cluster is down.
type clusterState struct {
	RunID string `json:"runID"`
	// PID is the supervisor's process ID.
	PID   int    `json:"pid"`
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// Kubeconfig is the admin kubeconfig the supervisor writes once the
	// cluster is ready (removed again by down); Server is its apiserver
	// address (the supervisor's forwarder on 127.0.0.1).
	Kubeconfig string   `json:"kubeconfig"`
	Server     string   `json:"server,omitempty"`
	Nodes      []string `json:"nodes"`
	ProxyMode  string   `json:"proxyMode"`
	// NodeProxy is kube-proxy or kpsim (sim proxy), with its Faults.
	NodeProxy string   `json:"nodeProxy,omitempty"`
	Faults    []string `json:"faults,omitempty"`
	// AgentImages says whether the echo and prober images were imported.
	AgentImages bool      `json:"agentImages"`
	Log         string    `json:"log"`
	Started     time.Time `json:"started"`
	// UpSeconds is how long cluster.Up took (ready states only).
	UpSeconds float64 `json:"upSeconds,omitempty"`
	// MemoryMB is the cluster's resident memory once ready.
	MemoryMB int `json:"memoryMB,omitempty"`
}

// clusterStateSuffix ends a state file's name, after the run ID.
const clusterStateSuffix = ".cluster.json"

// clusterStateDir holds the state files (replaced in tests).
var clusterStateDir = netns.MarkerDir

func clusterStatePath(id string) string {
	return filepath.Join(clusterStateDir, id+clusterStateSuffix)
}

// write replaces the state file atomically (a temporary file renamed).
func (st *clusterState) write() error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(clusterStateDir, 0o755); err != nil {
		return fmt.Errorf("could not create %s: %w", clusterStateDir, err)
	}
	p := clusterStatePath(st.RunID)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("could not write the cluster state %s: %w", p, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("could not write the cluster state %s: %w", p, err)
	}
	return nil
}

func readClusterState(id string) (*clusterState, error) {
	data, err := os.ReadFile(clusterStatePath(id))
	if err != nil {
		return nil, err
	}
	var st clusterState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("could not read the cluster state %s: %w", clusterStatePath(id), err)
	}
	if st.RunID != id {
		return nil, fmt.Errorf("could not read the cluster state %s: it names run %q", clusterStatePath(id), st.RunID)
	}
	return &st, nil
}

// listClusterStates reads every state file, in run ID order. A file that
// cannot be read is returned as a state of its run with the error.
func listClusterStates() ([]*clusterState, error) {
	ents, err := os.ReadDir(clusterStateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("could not list %s: %w", clusterStateDir, err)
	}
	var out []*clusterState
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), clusterStateSuffix)
		if !ok || !netns.ValidRunID(id) {
			continue
		}
		st, err := readClusterState(id)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			st = &clusterState{RunID: id, State: "unreadable", Error: err.Error()}
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b *clusterState) int { return strings.Compare(a.RunID, b.RunID) })
	return out, nil
}

// supervisorAlive reports whether st's supervisor still runs: its PID is a
// live (not zombie) process whose command line is `... cluster serve ...
// --run-id <id>` (a PID reused by another program is not ours).
func supervisorAlive(st *clusterState) bool {
	if st.PID <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", st.PID))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may hold
	// anything: read it after the last ')'.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.PID))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	i := slices.Index(args, "serve")
	return i > 0 && args[i-1] == "cluster" && slices.Contains(args, "--run-id="+st.RunID)
}

// waitGone waits until pid has exited (or become a zombie), at most d.
func waitGone(st *clusterState, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for supervisorAlive(st) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// removeClusterFiles removes what a supervisor leaves outside the run's
// namespaces, cgroups and folder: its state file, and the kubeconfig it
// wrote when that lies outside the run's folder and is still ours (its
// context is the run's).
func removeClusterFiles(st *clusterState) error {
	var errs []error
	if k := st.Kubeconfig; k != "" && !strings.HasPrefix(k, netns.RunDir(st.RunID)+"/") {
		if data, err := os.ReadFile(k); err == nil && bytes.Contains(data, []byte("current-context: "+cluster.ContextName(st.RunID)+"\n")) {
			if err := os.Remove(k); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.Remove(clusterStatePath(st.RunID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// KindClusterState is a local cluster's state file in a cleanup report.
const KindClusterState = "cluster-state"

// cleanupClusterStates is sim cleanup's part for local clusters (sim
// cluster up): the state files of the runs prefix selects whole. A dead
// supervisor's file goes (with the kubeconfig it wrote outside the run's
// folder); a live supervisor's is skipped, or with force the supervisor is
// killed (SIGKILL: its control plane dies with it, the rest is the run's
// leftovers, which netns.Cleanup removes afterwards) and its file goes.
func cleanupClusterStates(prefix string, force, dryRun bool) ([]netns.Leftover, error) {
	states, err := listClusterStates()
	if err != nil {
		return nil, err
	}
	var out []netns.Leftover
	for _, st := range states {
		if prefix != netns.Prefix && prefix != netns.RunPrefix(st.RunID) {
			continue
		}
		it := netns.Leftover{Kind: KindClusterState, Name: clusterStatePath(st.RunID), RunID: st.RunID, PID: st.PID, Alive: supervisorAlive(st)}
		switch {
		case it.Alive && !force && dryRun:
			it.Action = netns.ActionKeptAlive
		case it.Alive && !force:
			it.Action = netns.ActionSkipped
		case dryRun:
			it.Action = netns.ActionWould
		default:
			err := error(nil)
			if it.Alive {
				if err = syscall.Kill(st.PID, syscall.SIGKILL); err == nil && !waitGone(st, 10*time.Second) {
					err = errors.New("the supervisor " + strconv.Itoa(st.PID) + " still runs 10 s after SIGKILL")
				}
			}
			if err == nil {
				err = removeClusterFiles(st)
			}
			if err != nil {
				it.Action, it.Error = netns.ActionFailed, err.Error()
			} else {
				it.Action = netns.ActionRemoved
			}
		}
		out = append(out, it)
	}
	return out, nil
}
