package netns

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestControlPlaneName(t *testing.T) {
	name := ControlPlaneName("abc123")
	if name != "kpsim-abc123-_cp" || RoleOf(name) != RoleControlPlane {
		t.Errorf("ControlPlaneName = %q (role %q), want kpsim-abc123-_cp (controlplane)", name, RoleOf(name))
	}
	cfg := tinyConfig("abc123")
	cfg.ControlPlane = netip.MustParsePrefix("198.18.0.2/16")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "the control plane") {
		t.Errorf("control plane on node-b's address: Validate = %v, want a clash", err)
	}
	cfg.ControlPlane = netip.MustParsePrefix("198.18.255.254/16")
	if names := cfg.NamespaceNames(); names[1] != name {
		t.Errorf("NamespaceNames()[1] = %s, want %s", names[1], name)
	}
}

// TestControlPlaneReachable: a listener on the control plane's address
// answers a connection from a node namespace over the fabric, with the
// control plane inside the nodes' prefix and outside it (/32 link routes).
func TestControlPlaneReachable(t *testing.T) {
	needRoot(t)
	for _, cp := range []string{"198.18.255.254/16", "10.255.0.1/24"} {
		t.Run(cp, func(t *testing.T) {
			cfg := newTinyConfig(t)
			cfg.ControlPlane = netip.MustParsePrefix(cp)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			topo, err := Build(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer topo.Close()
			if topo.ControlPlane() == nil || topo.ControlPlane().Name != ControlPlaneName(cfg.RunID) {
				t.Fatalf("ControlPlane() = %v", topo.ControlPlane())
			}
			addr := netip.AddrPortFrom(cfg.ControlPlane.Addr(), 6443).String()
			var ln net.Listener
			if err := topo.ControlPlane().Do(func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				if c, err := ln.Accept(); err == nil {
					c.Write([]byte("cp"))
					c.Close()
				}
			}()
			for _, n := range topo.Nodes() {
				var c net.Conn
				err := n.NS.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, 3*time.Second); return err })
				if err != nil {
					t.Fatalf("dial %s from %s: %v", addr, n.NS.Name, err)
				}
				got, _ := io.ReadAll(c)
				c.Close()
				if string(got) != "cp" {
					t.Errorf("from %s read %q, want cp", n.NS.Name, got)
				}
				go func() {
					if c, err := ln.Accept(); err == nil {
						c.Write([]byte("cp"))
						c.Close()
					}
				}()
			}
		})
	}
}

// TestCleanupKillsProcesses: a process left inside a run's namespace is
// killed and reported by Cleanup before the namespace goes, and the run
// folder is removed.
func TestCleanupKillsProcesses(t *testing.T) {
	needRoot(t)
	cfg := newTinyConfig(t)
	cfg.ControlPlane = netip.MustParsePrefix("198.18.255.254/16")
	topo, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	dir := RunDir(cfg.RunID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "etcd.log"), []byte("x"), 0o644)
	cmd := exec.Command("sleep", "300")
	if err := topo.ControlPlane().Start(cmd); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	procs, err := ProcessesIn(topo.ControlPlane().Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || procs[0].PID != cmd.Process.Pid || procs[0].Comm != "sleep" {
		t.Fatalf("ProcessesIn = %+v, want the sleep %d", procs, cmd.Process.Pid)
	}
	rep, err := Cleanup(CleanupOptions{Prefix: RunPrefix(cfg.RunID), Force: true})
	if err != nil {
		t.Fatal(err)
	}
	var killed, removedDir bool
	for _, it := range rep.Items {
		switch {
		case it.Kind == KindProcess && it.Action == ActionRemoved && strings.Contains(it.Name, "sleep in "+ControlPlaneName(cfg.RunID)):
			killed = true
		case it.Kind == KindRunDir && it.Name == dir && it.Action == ActionRemoved:
			removedDir = true
		}
	}
	if !killed || !removedDir {
		t.Errorf("report %+v: want the sleep killed and %s removed", rep.Items, dir)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("sleep ended with %v, want SIGKILL", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists: %v", dir, err)
	}
	names, _ := listNamespaces(RunPrefix(cfg.RunID))
	if len(names) > 0 || slices.Contains(names, ControlPlaneName(cfg.RunID)) {
		t.Errorf("namespaces left: %v", names)
	}
}
