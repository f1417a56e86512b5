package main

// TestKillConformThenCleanup is the kill soak of issue 10: it SIGKILLs
// `sim conform` at 20 seeded random moments spread over the run's phases
// (setup, sync, sampling, teardown), runs `sim cleanup` after each kill, and
// requires the root namespace (rules of every backend, named namespaces,
// links) to be exactly as before, and nothing of the killed run left: no
// kpsim- namespace, no marker under /run/kpsim.
//
// go test runs packages in parallel, and other packages' tests kill their
// own children and then expect their Cleanup to find what those left: so
// this test cleans up only its killed run (`sim cleanup --prefix
// kpsim-RUNID-`), and leaves other runs' kpsim- namespaces out of the
// snapshot comparison. A run's ID is printed before it creates anything
// ("building namespaces (run ID)"), so a kill before that line left nothing.
//
// Phases come from the progress lines sim conform writes to stderr (package
// harness/conform): the child stops itself (SIGSTOP) right after writing the
// marker line of the kill's phase (the KPSIM_TEST_STOP_AT hook,
// cmd/sim/app/stophook.go); the test resumes it and kills it a random delay
// later, drawn below that phase's duration in an un-killed run of the same
// backend. So the delay counts from the marker's write, not from when the
// test read it: under load the read came tens of milliseconds late, past
// the whole 25 ms build phase. The phase a kill hit is the last marker the
// child printed (stderr is unbuffered, so every line written before the
// kill is read).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
)

// simBinEnv names a prebuilt sim binary (make test passes bin/sim); without
// it the test builds one.
const simBinEnv = "KPSIM_SIM_BIN"

const (
	killCount    = 20
	killSeed     = 10
	killScenario = "../../scenarios/conformance/distribution.yaml"
	// runTimeout bounds one conform run (un-killed: about 1 s here).
	runTimeout = 2 * time.Minute
	// maxDraws bounds the draws of one kill: a draw that found the child
	// already exited (namespace removal takes about a millisecond, and the
	// child exits soon after) is drawn again in half the range.
	maxDraws = 8
)

// phase is where a conform run is, by the last progress line it printed.
type phase int

const (
	phaseStart    phase = iota // started, scenarios loading
	phaseSetup                 // "conform: NAME (FILE)": model, informers
	phaseBuild                 // "building namespaces (run ID)": marker, namespaces, links
	phaseSync                  // "namespaces built, syncing": backends, first syncs, prober
	phaseSampling              // "nodes synced, sampling": probes and checks
	phaseTeardown              // "tearing down": prober and backend sockets
	phaseRemove                // "removing namespaces": namespaces, marker, model
	phaseDone                  // "torn down": report, exit
	numPhases
)

var phaseNames = [numPhases]string{"start", "setup", "build", "sync", "sampling", "teardown", "remove", "done"}

// phaseMarkers are texts of the progress lines that phaseOf recognises,
// for the child's stop hook (KPSIM_TEST_STOP_AT, cmd/sim/app/stophook.go):
// the child stops itself right after writing its phase's line.
var phaseMarkers = map[phase]string{
	phaseSetup:    ".yaml)\n",
	phaseBuild:    ": building namespaces (run ",
	phaseSync:     ": namespaces built, syncing",
	phaseSampling: " nodes synced, sampling",
	phaseTeardown: ": tearing down",
	phaseRemove:   ": removing namespaces",
}

func (p phase) String() string { return phaseNames[p] }

// phaseOf recognises the progress lines of harness/conform's runSuite.
func phaseOf(line string) (phase, bool) {
	if !strings.HasPrefix(line, "conform: ") {
		return 0, false
	}
	switch {
	case strings.HasSuffix(line, ": torn down"):
		return phaseDone, true
	case strings.HasSuffix(line, ": removing namespaces"):
		return phaseRemove, true
	case strings.HasSuffix(line, ": tearing down"):
		return phaseTeardown, true
	case strings.HasSuffix(line, " nodes synced, sampling"):
		return phaseSampling, true
	case strings.HasSuffix(line, ": namespaces built, syncing"):
		return phaseSync, true
	case strings.Contains(line, ": building namespaces (run "):
		return phaseBuild, true
	case strings.HasSuffix(line, ".yaml)"):
		return phaseSetup, true
	}
	return 0, false
}

// variant is one dataplane the kills cycle through.
type variant struct{ mode, backend string }

func (v variant) args() []string {
	a := []string{"conform", killScenario, "--mode", v.mode}
	if v.backend != "" {
		a = append(a, "--iptables-backend", v.backend)
	}
	return a
}

func (v variant) String() string {
	if v.backend != "" {
		return v.mode + "/" + v.backend
	}
	return v.mode
}

var variants = []variant{{"iptables", "nft"}, {"iptables", "legacy"}, {"nftables", ""}}

// child is one running sim conform.
type child struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	start  time.Time
	marks  chan mark     // every phase marker, as read
	done   chan struct{} // closed when stderr reached EOF
	stderr strings.Builder
	last   phase
	runID  string
	at     [numPhases]time.Duration // when each marker was read
}

type mark struct {
	p  phase
	at time.Duration
}

// startChild starts sim conform; with stopAt set, the child stops itself
// after writing that phase's marker (resume it with resumeAfterStop).
func startChild(t *testing.T, bin string, v variant, stopAt phase) *child {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	cmd := exec.CommandContext(ctx, bin, v.args()...)
	if m, ok := phaseMarkers[stopAt]; ok {
		cmd.Env = append(os.Environ(), "KPSIM_TEST_STOP_AT="+m)
	}
	cmd.Stdout = io.Discard
	pipe, err := cmd.StderrPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &child{cmd: cmd, cancel: cancel, marks: make(chan mark, numPhases+8), done: make(chan struct{})}
	c.start = time.Now()
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("could not start sim conform: %v", err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			c.stderr.WriteString(line + "\n")
			p, ok := phaseOf(line)
			if !ok {
				continue
			}
			at := time.Since(c.start)
			c.last, c.at[p] = p, at
			if _, id, ok := strings.Cut(line, ": building namespaces (run "); ok {
				c.runID, _, _ = strings.Cut(id, ")")
			}
			c.marks <- mark{p, at}
		}
		close(c.marks)
	}()
	return c
}

// wait reads to EOF and reaps the child; it returns the wait error.
func (c *child) wait() error {
	<-c.done
	err := c.cmd.Wait()
	c.cancel()
	return err
}

// resumeAfterStop waits (bounded) until the child has stopped itself at
// its marker, then continues it: the caller's delay counts from there.
func (c *child) resumeAfterStop() error {
	pid := c.cmd.Process.Pid
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, err := os.ReadFile(stat)
		if err != nil {
			return fmt.Errorf("child %d: %w", pid, err)
		}
		// The state follows the parenthesised command name.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("child %d did not stop at its marker within 30 s (stat: %s)", pid, strings.TrimSpace(string(b)))
		}
		time.Sleep(time.Millisecond)
	}
	return c.cmd.Process.Signal(syscall.SIGCONT)
}

// waitFor returns once the child printed marker p; false if it printed
// everything without it.
func (c *child) waitFor(p phase) bool {
	for m := range c.marks {
		if m.p == p {
			return true
		}
	}
	return false
}

func TestKillConformThenCleanup(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "iptables-save", "iptables-legacy-save", "iptables-nft", "iptables-legacy", "nft")
	began := time.Now()
	bin := simBinary(t)
	before := rootSnapshot(t)

	// One un-killed run per variant: it must leave the root as it was, and
	// it measures each phase's duration for the kill delays.
	durs := map[variant][numPhases]time.Duration{}
	for _, v := range variants {
		c := startChild(t, bin, v, phaseStart)
		for range c.marks {
		}
		if err := c.wait(); err != nil {
			t.Fatalf("un-killed sim %s: %v\n%s", strings.Join(v.args(), " "), err, c.stderr.String())
		}
		if c.last != phaseDone {
			t.Fatalf("un-killed sim conform (%s) ended in phase %s, want %s:\n%s", v, c.last, phaseDone, c.stderr.String())
		}
		var d [numPhases]time.Duration
		for p := phaseStart; p < phaseDone; p++ {
			d[p] = c.at[p+1] - c.at[p]
		}
		durs[v] = d
		t.Logf("un-killed %s: %s total; setup %s, build %s, sync %s, sampling %s, teardown %s, remove %s", v, time.Since(c.start).Round(time.Millisecond),
			d[phaseSetup].Round(time.Millisecond), d[phaseBuild].Round(time.Millisecond), d[phaseSync].Round(time.Millisecond),
			d[phaseSampling].Round(time.Millisecond), d[phaseTeardown].Round(time.Millisecond), d[phaseRemove].Round(time.Millisecond))
		rootSnapshot(t).requireSame(t, before, "after an un-killed run")
	}

	rng := rand.New(rand.NewPCG(killSeed, 0x6b696c6c))
	targets := []phase{phaseSetup, phaseBuild, phaseSync, phaseSampling, phaseTeardown, phaseRemove}
	var hits [numPhases]int
	misses := 0
	cleaned := 0
	for i := range killCount {
		v := variants[i%len(variants)]
		target := targets[i%len(targets)]
		// Delays are drawn in the first 80% of the phase as measured, so
		// that a kill lands in it though the load varies; a draw that found
		// the child exited (a short teardown) is drawn again in half the
		// range.
		frac := 0.8
		for tries := 1; ; tries++ {
			delay := time.Duration(rng.Float64() * frac * float64(durs[v][target]))
			c := startChild(t, bin, v, target)
			if !c.waitFor(target) {
				c.wait()
				t.Fatalf("kill %d (%s): sim conform never reached %s:\n%s", i, v, target, c.stderr.String())
			}
			if err := c.resumeAfterStop(); err != nil {
				c.cmd.Process.Kill()
				c.wait()
				t.Fatalf("kill %d (%s): %v", i, v, err)
			}
			time.Sleep(delay)
			killErr := c.cmd.Process.Signal(syscall.SIGKILL)
			for range c.marks {
			}
			err := c.wait()
			killed := false
			if ee, ok := err.(*exec.ExitError); ok {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
					killed = true
				}
			}
			runID := c.runID
			what := fmt.Sprintf("kill %d (%s, %s + %s)", i, v, target, delay.Round(time.Microsecond))
			if runID == "" {
				// Killed before it named its run: it created nothing.
				if id := markerOf(t, c.cmd.Process.Pid); id != "" {
					t.Errorf("%s: a marker %s holds the killed process's PID, but the run never printed its ID", what, id)
				}
			}
			rep := runCleanupBin(t, bin, runID)
			checkAfterKill(t, before, rep, runID, what)
			if n := removedOf(rep, runID); n > 0 {
				cleaned++
			}
			if !killed {
				// The child exited before the signal (killErr says so): not
				// a kill. Its state was still checked; draw again, sooner.
				misses++
				if tries >= maxDraws {
					t.Fatalf("kill %d (%s): the child had exited before %d draws (%v, %v); the delays are too long", i, v, tries, killErr, err)
				}
				t.Logf("kill %d (%s, %s + %s): child had already exited (%v), drawing again", i, v, target, delay, err)
				frac /= 2
				continue
			}
			hits[c.last]++
			if (c.last == phaseSync || c.last == phaseSampling) && !removedKinds(rep, runID, netns.KindMarker, netns.KindNetns) {
				// Killed with its whole topology up: the marker and the
				// namespaces were there, and sim cleanup removed them.
				t.Errorf("kill %d (%s) hit %s, but sim cleanup removed no marker and namespace of run %q: %+v", i, v, c.last, runID, rep.Items)
			}
			t.Logf("kill %d: %s, marker %s + %s, hit %s, run %q: sim cleanup removed %d item(s)", i, v, target, delay.Round(time.Microsecond), c.last, runID, removedOf(rep, runID))
			break
		}
		if time.Since(began) > 10*time.Minute {
			t.Fatalf("the kill soak ran over 10 minutes after %d kills", i+1)
		}
	}
	var parts []string
	for p := phaseStart; p < numPhases; p++ {
		if hits[p] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p, hits[p]))
		}
	}
	t.Logf("%d kills (seed %d) hit: %s; %d left something that sim cleanup removed; %d miss(es) redrawn; %s in all",
		killCount, killSeed, strings.Join(parts, ", "), cleaned, misses, time.Since(began).Round(time.Millisecond))
	// Namespace removal takes about a millisecond, so a kill aimed at it
	// may land after it: teardown and removal together must be hit.
	for _, p := range []phase{phaseSetup, phaseBuild, phaseSync, phaseSampling} {
		if hits[p] == 0 {
			t.Errorf("no kill hit phase %s (hits %v)", p, hits)
		}
	}
	if hits[phaseTeardown]+hits[phaseRemove] == 0 {
		t.Errorf("no kill hit the teardown (hits %v)", hits)
	}
}

// simBinary returns $KPSIM_SIM_BIN or a sim built from this package.
func simBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv(simBinEnv); b != "" {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%s=%s: %v", simBinEnv, b, err)
		}
		return b
	}
	testenv.RequireCommands(t, "go")
	bin := filepath.Join(t.TempDir(), "sim")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("could not build sim: %v\n%s", err, out)
	}
	return bin
}

// markerOf finds the run whose marker holds pid (a child killed before it
// printed its run ID); "" when there is none.
func markerOf(t *testing.T, pid int) string {
	t.Helper()
	ents, err := os.ReadDir(netns.MarkerDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".pid")
		if !ok {
			continue
		}
		if st, err := netns.ProbeRun(id); err == nil && st.PID == pid {
			return id
		}
	}
	return ""
}

// runCleanupBin runs sim cleanup for one run; without a run ID, a dry run
// over every run (it removes nothing another test may be waiting for).
func runCleanupBin(t *testing.T, bin, runID string) *netns.CleanupReport {
	t.Helper()
	args := []string{"cleanup", "-o", "json", "--dry-run"}
	if runID != "" {
		args = []string{"cleanup", "-o", "json", "--prefix", netns.RunPrefix(runID)}
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("sim cleanup: %v\n%s", err, out)
	}
	var rep netns.CleanupReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("sim cleanup -o json: %v\n%s", err, out)
	}
	return &rep
}

func removedOf(rep *netns.CleanupReport, runID string) int {
	n := 0
	for _, it := range rep.Items {
		if it.RunID == runID && runID != "" && it.Action == netns.ActionRemoved {
			n++
		}
	}
	return n
}

// removedKinds reports whether rep removed an item of every kind for runID.
func removedKinds(rep *netns.CleanupReport, runID string, kinds ...string) bool {
	for _, k := range kinds {
		if !slices.ContainsFunc(rep.Items, func(it netns.Leftover) bool {
			return runID != "" && it.RunID == runID && it.Kind == k && it.Action == netns.ActionRemoved
		}) {
			return false
		}
	}
	return true
}

// checkAfterKill requires cleanup to have removed everything of the killed
// run and the root namespace to equal before.
func checkAfterKill(t *testing.T, before *snapshot, rep *netns.CleanupReport, runID, what string) {
	t.Helper()
	for _, it := range rep.Items {
		if it.Action == netns.ActionFailed {
			t.Errorf("%s: sim cleanup could not remove %s %s: %s", what, it.Kind, it.Name, it.Error)
		}
		if it.RunID == runID && it.Action != netns.ActionRemoved {
			t.Errorf("%s: sim cleanup did not remove %s %s of the killed run: %s", what, it.Kind, it.Name, it.Action)
		}
	}
	after := rootSnapshot(t)
	after.requireSame(t, before, what)
	if runID == "" {
		return
	}
	for _, n := range after.ours {
		if strings.HasPrefix(n, netns.RunPrefix(runID)) {
			t.Errorf("%s: namespace %s of the killed run left after sim cleanup", what, n)
		}
	}
	if _, err := os.Stat(filepath.Join(netns.MarkerDir, runID+".pid")); !os.IsNotExist(err) {
		t.Errorf("%s: the killed run's marker is still there after sim cleanup (%v)", what, err)
	}
}

// snapshot is the root namespace as the Makefile's host-snapshot records it,
// with the kpsim- namespaces apart: tests of other packages may run theirs
// while this one does (go test runs packages in parallel), so those are
// checked by run (checkAfterKill), the rest must stay identical.
type snapshot struct {
	text string   // rules of every backend, other namespaces, root links
	ours []string // kpsim- namespaces
}

func rootSnapshot(t *testing.T) *snapshot {
	t.Helper()
	var b strings.Builder
	run := func(title string, filter func(string) (string, bool), name string, args ...string) {
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			t.Fatalf("snapshot: %s %s: %v", name, strings.Join(args, " "), err)
		}
		b.WriteString("## " + title + "\n")
		var lines []string
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if l, ok := filter(l); ok {
				lines = append(lines, l)
			}
		}
		if title == "links" {
			slices.Sort(lines)
		}
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}
	noComments := func(l string) (string, bool) { return l, !strings.HasPrefix(l, "#") }
	all := func(l string) (string, bool) { return l, true }
	s := &snapshot{}
	run("iptables-save", noComments, "iptables-save")
	run("iptables-legacy-save", noComments, "iptables-legacy-save")
	run("nft list ruleset", all, "nft", "list", "ruleset")
	run("ip netns", func(l string) (string, bool) {
		name, _, _ := strings.Cut(l, " ")
		if strings.HasPrefix(name, netns.Prefix) {
			s.ours = append(s.ours, name)
			return "", false
		}
		return l, l != ""
	}, "ip", "netns", "list")
	// `ip -o link show | sed 's/^[0-9]*: //' | cut -d' ' -f1 | sort`
	run("links", func(l string) (string, bool) {
		_, rest, ok := strings.Cut(l, ": ")
		name, _, _ := strings.Cut(rest, " ")
		return name, ok
	}, "ip", "-o", "link", "show")
	s.text = b.String()
	return s
}

func (s *snapshot) requireSame(t *testing.T, before *snapshot, what string) {
	t.Helper()
	if s.text == before.text {
		return
	}
	a, b := strings.Split(before.text, "\n"), strings.Split(s.text, "\n")
	var diff []string
	for _, l := range a {
		if !slices.Contains(b, l) {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range b {
		if !slices.Contains(a, l) {
			diff = append(diff, "+ "+l)
		}
	}
	t.Fatalf("%s: the root namespace changed:\n%s", what, strings.Join(diff, "\n"))
}
