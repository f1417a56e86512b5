package netns

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// hierarchy is one mounted cgroup hierarchy: a v1 controller set (cpu,
// memory, name=systemd, ...) or the unified (v2) one.
type hierarchy struct {
	Mount       string   // e.g. /sys/fs/cgroup/memory
	Controllers []string // e.g. [memory]; [] for the unified hierarchy
	V2          bool
}

// RunCgroup is the run's cgroup: the same path in every mounted hierarchy,
// under the cgroup the run itself was started in (its memory cgroup on a
// v1 host), so that everything the cluster starts, the pods included, stays
// inside the run's accounting and can be found, killed and removed by
// walking it. On a cgroup v1 host (and a hybrid one: v1 controllers plus a
// unified mount) the kubelet's cgroupfs driver uses one path for every
// hierarchy, so the path must exist in each.
type RunCgroup struct {
	// Path is the cgroup path, e.g. /process_api/0234.../kpsim-3fa9c1.
	Path string
	// Hierarchies are where it exists.
	Hierarchies []hierarchy
	// record is cgroupRecord(id): the parents outside the tree, for
	// Cleanup.
	record string
}

// hierarchies lists the cgroup mounts of /proc/self/mountinfo.
func hierarchies() ([]hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("could not read the cgroup mounts: %w", err)
	}
	defer f.Close()
	var out []hierarchy
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || pf[3] != "/" || !strings.HasPrefix(pf[4], cgroupRoot) {
			continue
		}
		switch qf[0] {
		case "cgroup2":
			out = append(out, hierarchy{Mount: pf[4], V2: true})
		case "cgroup":
			var ctrls []string
			for _, o := range strings.Split(qf[2], ",") {
				switch {
				case o == "rw" || o == "ro" || o == "relatime" || o == "noatime" || o == "nosuid" || o == "nodev" || o == "noexec" || o == "clone_children" || o == "xattr":
				case strings.HasPrefix(o, "release_agent="):
				default:
					ctrls = append(ctrls, o)
				}
			}
			out = append(out, hierarchy{Mount: pf[4], Controllers: ctrls})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("could not read the cgroup mounts: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted under " + cgroupRoot)
	}
	return out, nil
}

// ownCgroup is the path the running process has in its memory hierarchy
// (v1) or the unified one (v2 only): where the run's cgroup goes.
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("could not read /proc/self/cgroup: %w", err)
	}
	var unified string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			return parts[2], nil
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
		}
	}
	if unified == "" {
		return "", errors.New("could not find the process's cgroup in /proc/self/cgroup")
	}
	return unified, nil
}

// NewRunCgroup creates run id's cgroup, <own cgroup>/kpsim-<id>, in every
// mounted hierarchy. Parents missing from a hierarchy are created too and
// recorded in cgroupRecord(id) (beside the run marker) before they are
// made, so that Remove, or Cleanup after a killed run, removes them again:
// afterwards they could not be told from the host's own. A new cpuset
// cgroup gets its parent's cpus and mems, or no task could join it. On
// error, what it made is removed.
func NewRunCgroup(id string) (*RunCgroup, error) {
	if !ValidRunID(id) {
		return nil, fmt.Errorf("could not create the run's cgroup: invalid run id %q", id)
	}
	base, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	rc := &RunCgroup{Path: filepath.Join(base, Prefix+id), Hierarchies: hs, record: cgroupRecord(id)}
	for _, h := range hs {
		if err := rc.mkdirAll(h, rc.Path); err != nil {
			return nil, errors.Join(err, rc.Remove())
		}
	}
	return rc, nil
}

// maxCgroupDepth bounds findRunCgroups' walk: a run's cgroup sits under
// the cgroup its program was started in (e.g. /process_api/<id>).
const maxCgroupDepth = 6

// findRunCgroups finds the run cgroups (folders named kpsim-<runid>) in
// the hierarchies hs, at most maxCgroupDepth deep, of the runs that prefix
// selects whole ("kpsim-" or "kpsim-<runid>-"): their cgroup paths by run
// ID. A run's tree is not searched further.
func findRunCgroups(hs []hierarchy, prefix string) map[string]string {
	out := map[string]string{}
	for _, h := range hs {
		filepath.WalkDir(h.Mount, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || p == h.Mount {
				return nil
			}
			rel := strings.TrimPrefix(p, h.Mount)
			if id, ok := strings.CutPrefix(d.Name(), Prefix); ok && ValidRunID(id) {
				if prefix == Prefix || prefix == RunPrefix(id) {
					out[id] = rel
				}
				return filepath.SkipDir
			}
			if strings.Count(rel, "/") >= maxCgroupDepth {
				return filepath.SkipDir
			}
			return nil
		})
	}
	return out
}

// cgroupRecord is the file listing the cgroup folders run id created
// outside its own tree (one full path a line), in creation order.
func cgroupRecord(id string) string { return filepath.Join(MarkerDir, id+".cgroup") }

// Mkdir creates sub (a path relative to the run's cgroup) in every
// hierarchy.
func (rc *RunCgroup) Mkdir(sub string) error {
	for _, h := range rc.Hierarchies {
		if err := rc.mkdirAll(h, filepath.Join(rc.Path, sub)); err != nil {
			return err
		}
	}
	return nil
}

func (rc *RunCgroup) mkdirAll(h hierarchy, p string) error {
	var missing []string
	for d := p; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(h.Mount, d)); err == nil {
			break
		}
		missing = append([]string{d}, missing...)
	}
	for _, d := range missing {
		full := filepath.Join(h.Mount, d)
		if rc.record != "" && !within(d, rc.Path) {
			if err := appendLine(rc.record, full); err != nil {
				return fmt.Errorf("could not record cgroup %s: %w", full, err)
			}
		}
		if err := os.Mkdir(full, 0o755); err != nil {
			return fmt.Errorf("could not create cgroup %s: %w", full, err)
		}
		if slices.Contains(h.Controllers, "cpuset") {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(filepath.Dir(full), f))
				if err != nil {
					return fmt.Errorf("could not read %s of %s: %w", f, filepath.Dir(full), err)
				}
				if err := os.WriteFile(filepath.Join(full, f), v, 0o644); err != nil {
					return fmt.Errorf("could not set %s of %s: %w", f, full, err)
				}
			}
		}
	}
	return nil
}

// ProcsFiles are the cgroup.procs files of sub (relative to the run's
// cgroup) in every hierarchy: writing a PID to each moves that process
// there in all of them.
func (rc *RunCgroup) ProcsFiles(sub string) []string {
	var out []string
	for _, h := range rc.Hierarchies {
		out = append(out, filepath.Join(h.Mount, rc.Path, sub, "cgroup.procs"))
	}
	return out
}

// Procs lists every process in the run's cgroup tree, in any hierarchy.
func (rc *RunCgroup) Procs() ([]int, error) {
	seen := map[int]bool{}
	var errs []error
	for _, h := range rc.Hierarchies {
		root := filepath.Join(h.Mount, rc.Path)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, err := os.ReadFile(p)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids, errors.Join(errs...)
}

// Kill sends SIGKILL to every process of the run's cgroup tree until none
// is left (new ones may appear while it kills: a shim starting a
// container), at most timeout. The freezer hierarchy, when there is one,
// holds the tree still while the signals go out.
func (rc *RunCgroup) Kill(timeout time.Duration) error {
	freezer := ""
	for _, h := range rc.Hierarchies {
		if slices.Contains(h.Controllers, "freezer") {
			freezer = filepath.Join(h.Mount, rc.Path, "freezer.state")
		}
	}
	deadline := time.Now().Add(timeout)
	killed := map[int]bool{}
	for {
		pids, err := rc.Procs()
		if err != nil {
			return fmt.Errorf("could not list the run's processes: %w", err)
		}
		if len(pids) == 0 {
			return waitReaped(killed, deadline)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("could not kill the run's processes within %s: %v left", timeout, pids)
		}
		if freezer != "" {
			os.WriteFile(freezer, []byte("FROZEN"), 0o644)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
			killed[pid] = true
		}
		if freezer != "" {
			os.WriteFile(freezer, []byte("THAWED"), 0o644)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReaped waits until every killed process is gone from /proc. A killed
// task leaves its cgroup at once but stays a zombie until its parent reaps
// it; the shims, and the daemons once the launcher is gone, are orphans
// whose parent is PID 1 (process_api here), which reaps them within
// moments. Until then ps still lists them.
func waitReaped(killed map[int]bool, deadline time.Time) error {
	for {
		var left []int
		for pid := range killed {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			slices.Sort(left)
			return fmt.Errorf("killed processes not reaped in time (zombies of PID 1?): %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Remove removes the run's cgroup tree in every hierarchy, children first,
// then the parents NewRunCgroup created. The tree must be empty (Kill).
func (rc *RunCgroup) Remove() error {
	var errs []error
	for _, h := range rc.Hierarchies {
		root := filepath.Join(h.Mount, rc.Path)
		var dirs []string
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first: WalkDir lists a folder before its children.
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirRetry(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err == nil && rc.record != "" {
		errs = append(errs, removeRecordedParents(rc.record))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("could not remove the run's cgroups: %w", err)
	}
	return nil
}

// removeRecordedParents removes, deepest first, the parents a run recorded
// in its cgroup record, when they are empty: one still holding another
// run's cgroup (two runs of one session share /process_api/<id> in the
// hierarchies where only they made it) stays, and is that run's to leave
// behind; a known limit.
func removeRecordedParents(record string) error {
	data, err := os.ReadFile(record)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("could not read %s: %w", record, err)
	}
	lines := strings.Fields(string(data))
	var errs []error
	for i := len(lines) - 1; i >= 0; i-- {
		p := lines[i]
		if !strings.HasPrefix(p, cgroupRoot+"/") || strings.Contains(p, "..") {
			errs = append(errs, fmt.Errorf("%s: %q is not a cgroup folder", record, p))
			continue
		}
		err := syscall.Rmdir(p)
		if err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EBUSY) {
			errs = append(errs, fmt.Errorf("could not remove cgroup %s: %w", p, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(record); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("could not remove %s: %w", record, err)
	}
	return nil
}

// within reports whether cgroup path p is root or inside it.
func within(p, root string) bool { return p == root || strings.HasPrefix(p, root+"/") }

func appendLine(path, line string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line + "\n")
	return errors.Join(err, f.Close())
}

// rmdirRetry removes an empty cgroup, retrying a moment on EBUSY (a killed
// task leaves its cgroup a little after it is reaped).
func rmdirRetry(p string) error {
	var err error
	for i := 0; i < 50; i++ {
		err = syscall.Rmdir(p)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("could not remove cgroup %s: %w", p, err)
}
