package netns

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary a child that builds a topology of the given
// run ID, says "ready" and waits for a signal (60 s at most).
const childEnv = "KPSIM_NETNS_TEST_CHILD_RUNID"

func TestMain(m *testing.M) {
	if id := os.Getenv(childEnv); id != "" {
		os.Exit(runChild(id))
	}
	os.Exit(m.Run())
}

func runChild(id string) int {
	t, err := New(tinyConfig(id))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := WithSignalCleanup(context.Background(), t)
	defer stop()
	if err := t.Build(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("ready")
	select {
	case <-ctx.Done():
		// The handler has already torn the topology down.
		fmt.Println("cause:", context.Cause(ctx))
		return 0
	case <-time.After(60 * time.Second):
		t.Close()
		return 1
	}
}

// startChild runs a child that builds a topology and waits until it is ready.
func startChild(t *testing.T) (*exec.Cmd, string, *bufio.Reader) {
	t.Helper()
	needRoot(t)
	id, err := NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+id)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		Cleanup(CleanupOptions{Prefix: RunPrefix(id), Force: true})
	})
	r := bufio.NewReader(out)
	ready := make(chan error, 1)
	go func() {
		line, err := r.ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("child said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("child did not get ready: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("child not ready after 20 s")
	}
	return cmd, id, r
}

func waitChild(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("child did not exit within 20 s")
	}
}

func TestCleanupAfterSIGKILL(t *testing.T) {
	cmd, id, _ := startChild(t)
	prefix := RunPrefix(id)
	n := len(ourNamespaces(t, prefix))
	if n == 0 {
		t.Fatal("the child's namespaces are not there")
	}
	// Alive: a cleanup leaves it alone, and says so.
	rep, err := Cleanup(CleanupOptions{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Items) != n {
		t.Errorf("cleanup of a live run listed %d items, want its %d namespaces: %+v", len(rep.Items), n, rep.Items)
	}
	for _, it := range rep.Items {
		if it.Action != ActionSkipped || !it.Alive || it.PID != cmd.Process.Pid {
			t.Errorf("live run item %+v: want skipped, alive, pid %d", it, cmd.Process.Pid)
		}
	}
	if got := len(ourNamespaces(t, prefix)); got != n {
		t.Fatalf("cleanup removed a live run's namespaces (%d of %d left)", got, n)
	}

	cmd.Process.Signal(syscall.SIGKILL)
	waitChild(t, cmd)
	if got := ourNamespaces(t, prefix); len(got) != n {
		t.Logf("after SIGKILL %d of %d namespaces are left (another cleanup may have run)", len(got), n)
	}
	dry, err := Cleanup(CleanupOptions{Prefix: prefix, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range dry.Items {
		if it.Action != ActionWould || it.Alive {
			t.Errorf("dry run item %+v: want %q, dead", it, ActionWould)
		}
	}
	if got := len(ourNamespaces(t, prefix)); got != n {
		t.Errorf("a dry run removed namespaces")
	}
	rep, err = Cleanup(CleanupOptions{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	// Another cleanup on the machine may have raced us to some items, so
	// the final state is what counts; what this one found it removed.
	for _, it := range rep.Items {
		if it.Action != ActionRemoved {
			t.Errorf("item %+v not removed", it)
		}
	}
	if got := ourNamespaces(t, prefix); len(got) != 0 {
		t.Errorf("namespaces left after cleanup: %v", got)
	}
	if st, _ := ProbeRun(id); st.Marker {
		t.Errorf("marker left after cleanup")
	}
	if l := ourRootLinks(t, prefix); len(l) != 0 {
		t.Errorf("root links left: %v", l)
	}
	// Nothing left: a second cleanup finds nothing.
	if rep, _ := Cleanup(CleanupOptions{Prefix: prefix}); len(rep.Items) != 0 {
		t.Errorf("second cleanup found %+v", rep.Items)
	}
}

func TestSIGTERMTearsDown(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd, id, r := startChild(t)
			if len(ourNamespaces(t, RunPrefix(id))) == 0 {
				t.Fatal("the child's namespaces are not there")
			}
			cmd.Process.Signal(sig)
			line, _ := r.ReadString('\n')
			waitChild(t, cmd)
			if code := cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("child exit code %d, want 0", code)
			}
			if want := "cause: interrupted by " + sig.String(); strings.TrimSpace(line) != want {
				t.Errorf("child said %q, want %q", line, want)
			}
			if got := ourNamespaces(t, RunPrefix(id)); len(got) != 0 {
				t.Errorf("namespaces left after %s: %v", sig, got)
			}
			if st, _ := ProbeRun(id); st.Marker {
				t.Errorf("marker left after %s", sig)
			}
		})
	}
}

func TestCleanupOptions(t *testing.T) {
	for _, p := range []string{"kpsim", "cni-", "kpsim-abc", "kpsim-3fa9c1"} {
		if _, err := Cleanup(CleanupOptions{Prefix: p}); err == nil {
			t.Errorf("Cleanup accepted prefix %q", p)
		}
	}
}

func TestCleanupForceAndNarrowPrefix(t *testing.T) {
	topo := buildTiny(t)
	id := topo.RunID()
	// A prefix narrower than the run picks one node's namespaces only.
	node := NodeName(id, "node-a")
	rep, err := Cleanup(CleanupOptions{Prefix: node, Force: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range rep.Items {
		if !strings.HasPrefix(it.Name, node) || it.Kind != KindNetns || !it.Alive {
			t.Errorf("narrow dry run listed %+v", it)
		}
	}
	if len(rep.Items) != 4 { // node, backends, two clients
		t.Errorf("narrow dry run listed %d items, want 4", len(rep.Items))
	}
	// Force removes a live run's namespaces and marker.
	rep, err = Cleanup(CleanupOptions{Prefix: RunPrefix(id), Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() != 0 || len(rep.Items) != len(topo.Config().NamespaceNames())+1 {
		t.Errorf("forced cleanup: %+v", rep.Items)
	}
	if got := ourNamespaces(t, RunPrefix(id)); len(got) != 0 {
		t.Errorf("namespaces left after a forced cleanup: %v", got)
	}
	// The run's own Close then finds nothing to remove, without error.
	if err := topo.Close(); err != nil {
		t.Errorf("Close after a forced cleanup: %v", err)
	}
}
