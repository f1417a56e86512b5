package upstream

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
)

// TestControlPlane is the run a test asks StartForTest for.
type TestControlPlane struct {
	// Topology is the run's namespaces (RunID is set by StartForTest);
	// its ControlPlane address is the API server's, its ServiceCIDR the
	// API server's --service-cluster-ip-range.
	Topology netns.Config
	// SecondaryServiceCIDR, when valid, makes the API server dual-stack
	// (ControlPlaneConfig.SecondaryServiceCIDR).
	SecondaryServiceCIDR netip.Prefix
}

// apiSliceWait bounds StartForTest's wait for the API server's own
// EndpointSlice.
const apiSliceWait = 30 * time.Second

// StartForTest builds the run c describes (a fresh run ID) and starts etcd
// and kube-apiserver in its control-plane namespace, for tests that need a
// real API server. It returns once the API server has written its own
// EndpointSlice default/kubernetes (shortly after it is ready), so that no
// write of the API server's lands among a test's. Everything is closed
// through t.Cleanup (the run's folder with the topology); a failed test
// logs the last lines of kube-apiserver.log. It needs root and the
// binaries of bin/ (FindForTest): without them the test skips, or fails
// under make test.
func StartForTest(t testing.TB, ctx context.Context, c TestControlPlane) (*netns.Topology, *ControlPlane) {
	t.Helper()
	testenv.RequireRoot(t)
	bin := FindForTest(t)
	id, err := netns.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.Topology
	cfg.RunID = id
	topo, err := netns.Build(ctx, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil { // removes the run's folder too
			t.Error(err)
		}
	})
	dir := netns.RunDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cp, err := StartControlPlane(ctx, ControlPlaneConfig{NS: topo.ControlPlane(), Addr: cfg.ControlPlane.Addr(), Dir: dir,
		ServiceCIDR: cfg.ServiceCIDR, SecondaryServiceCIDR: c.SecondaryServiceCIDR, Bin: bin, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane: %s", strings.TrimSpace(log.String()))
	t.Cleanup(func() {
		if err := cp.Close(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			if data, err := os.ReadFile(filepath.Join(dir, "kube-apiserver.log")); err == nil {
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				t.Logf("kube-apiserver.log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-20):], "\n"))
			}
		}
	})
	deadline := time.Now().Add(apiSliceWait)
	for {
		_, err := cp.Client().DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the API server wrote no EndpointSlice default/kubernetes within %v: %v", apiSliceWait, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return topo, cp
}
