package upstream

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kpsim/kpsim/harness/testenv"
)

func TestTokenCSV(t *testing.T) {
	got := tokenCSV("aaa", "bbb")
	want := "aaa,kpsim-admin,kpsim-admin,\"system:masters\"\nbbb,system:kube-proxy,system:kube-proxy\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tokenCSV (-want +got):\n%s", diff)
	}
}

// TestAppendUsers: extra users (a kubelet in system:nodes, the controller
// manager) follow the admin and kube-proxy lines, each with a token of its
// own; a name that would break the CSV is refused.
func TestAppendUsers(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, tokenFile), []byte(tokenCSV("aaa", "bbb")), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := appendUsers(dir, []User{{Name: "system:node:node-a", Groups: []string{"system:nodes"}}, {Name: "system:kube-controller-manager"}})
	if err != nil {
		t.Fatal(err)
	}
	n, k := tokens["system:node:node-a"], tokens["system:kube-controller-manager"]
	if len(n) != 48 || len(k) != 48 || n == k {
		t.Fatalf("tokens %v", tokens)
	}
	got, _ := os.ReadFile(filepath.Join(dir, tokenFile))
	want := tokenCSV("aaa", "bbb") + n + ",system:node:node-a,system:node:node-a,\"system:nodes\"\n" +
		k + ",system:kube-controller-manager,system:kube-controller-manager\n"
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("token file (-want +got):\n%s", diff)
	}
	for _, bad := range []User{{Name: ""}, {Name: "a,b"}, {Name: "a\"b"}} {
		if _, err := appendUsers(dir, []User{bad}); err == nil {
			t.Errorf("appendUsers(%q) gave no error", bad.Name)
		}
	}
	if _, err := appendUsers(dir, []User{{Name: "x"}, {Name: "x"}}); err == nil {
		t.Error("a user listed twice gave no error")
	}
}

// TestKubeconfig loads the kubeconfig with client-go's own loader.
func TestKubeconfig(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	text := kubeconfig("https://198.18.255.254:6443", ca, KubeProxyUser, "tok123")
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(text))
	if err != nil {
		t.Fatalf("client-go cannot load it: %v\n%s", err, text)
	}
	if cfg.Host != "https://198.18.255.254:6443" || cfg.BearerToken != "tok123" || string(cfg.CAData) != string(ca) {
		t.Errorf("loaded host %q token %q CA %q", cfg.Host, cfg.BearerToken, cfg.CAData)
	}
}

// TestPKI: the serving certificate is signed by the CA and valid for the
// fabric address, the first service IP, localhost and the in-cluster names.
func TestPKI(t *testing.T) {
	dir := t.TempDir()
	addr := netip.MustParseAddr("198.18.255.254")
	svc := firstServiceIP(netip.MustParsePrefix("10.96.0.0/12"))
	if svc.String() != "10.96.0.1" {
		t.Fatalf("firstServiceIP = %s, want 10.96.0.1", svc)
	}
	creds, err := writePKI(dir, addr, svc)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(creds.caPEM) {
		t.Fatal("CA PEM does not parse")
	}
	cert := readCert(t, filepath.Join(dir, serveCertFile))
	for _, host := range []string{"198.18.255.254", "10.96.0.1", "127.0.0.1", "localhost", "kubernetes", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("serving certificate for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "198.18.0.1", Roots: roots}); err == nil {
		t.Error("serving certificate verifies for a node address it does not name")
	}
	tokens, _ := os.ReadFile(filepath.Join(dir, tokenFile))
	if string(tokens) != tokenCSV(creds.adminToken, creds.proxyToken) || creds.adminToken == creds.proxyToken {
		t.Errorf("token file %q", tokens)
	}
	key, _ := os.ReadFile(filepath.Join(dir, saKeyFile))
	if b, _ := pem.Decode(key); b == nil || b.Type != "RSA PRIVATE KEY" {
		t.Error("sa.key is not an RSA private key PEM")
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestParseVersion(t *testing.T) {
	v, err := parseVersion("Kubernetes v1.37.2\n")
	if err != nil || v != "v1.37.2" {
		t.Errorf("parseVersion = %q, %v", v, err)
	}
	if _, err := parseVersion("kube-proxy version unknown"); err == nil {
		t.Error("parseVersion accepted text without a version")
	}
}

func TestFindMissing(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, EtcdName), []byte("#!/bin/sh\n"), 0o755)
	_, err := findIn(dir, "")
	var me *MissingError
	if !errors.As(err, &me) {
		t.Fatalf("findIn = %v, want a *MissingError", err)
	}
	want := []string{filepath.Join(dir, APIServerName), filepath.Join(dir, KubeProxyName)}
	if !slices.Equal(me.Paths, want) || !strings.Contains(err.Error(), "make upstream") {
		t.Errorf("missing %v (%v), want %v and the make upstream hint", me.Paths, err, want)
	}
	for _, n := range []string{APIServerName, KubeProxyName} {
		os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755)
	}
	own := filepath.Join(dir, "my-kube-proxy")
	if _, err := findIn(dir, own); !errors.As(err, &me) || !slices.Equal(me.Paths, []string{own}) {
		t.Errorf("override missing: %v", err)
	}
	os.WriteFile(own, []byte("#!/bin/sh\n"), 0o755)
	if b, err := findIn(dir, own); err != nil || b.KubeProxy != own {
		t.Errorf("override: %+v, %v", b, err)
	}
}

// at is a time t0+s seconds; fake scrapes use it.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// fakeScrapes returns the scrapes in order, then the last one forever.
func fakeScrapes(ms ...Metrics) func(context.Context) (Metrics, error) {
	i := 0
	return func(context.Context) (Metrics, error) {
		m := ms[min(i, len(ms)-1)]
		i++
		return m, nil
	}
}

func TestSettle(t *testing.T) {
	since := at(10)
	idle := Metrics{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(8)}
	queued := Metrics{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1), ChangesPending: 1}
	programmedOnce := Metrics{Syncs: 6, SyncSeconds: 1.3, LastSync: at(10.3), LastQueued: at(10.1), Programming: 1}
	tests := []struct {
		name       string
		before     *Metrics // Change.Before
		programmed int      // Change.Programmed
		scrapes    []Metrics
		want       Sync
		wantErr    error
	}{{
		// One sync from 10.2 to 10.3: it started after the queue at 10.1.
		name:    "one sync after the queue",
		scrapes: []Metrics{idle, queued, {Syncs: 6, SyncSeconds: 1.1, LastSync: at(10.3), LastQueued: at(10.1)}},
		want:    Sync{Started: at(10.2), Ended: at(10.3), Duration: 100 * time.Millisecond},
	}, {
		// A sync already running at the queue (10.0 to 10.3, 0.3 s) ends
		// after S1 but started before the change was queued: no proof; the
		// next one (10.3 to 10.35) proves it.
		name: "in-progress sync",
		scrapes: []Metrics{queued,
			{Syncs: 6, SyncSeconds: 1.3, LastSync: at(10.3), LastQueued: at(10.1)},
			{Syncs: 6, SyncSeconds: 1.3, LastSync: at(10.3), LastQueued: at(10.1)},
			{Syncs: 7, SyncSeconds: 1.35, LastSync: at(10.35), LastQueued: at(10.1)}},
		want: Sync{Ended: at(10.35)},
	}, {
		// Two syncs between the scrapes: the second started after S1.
		name:    "two syncs",
		scrapes: []Metrics{queued, {Syncs: 7, SyncSeconds: 1.4, LastSync: at(10.5), LastQueued: at(10.1)}},
		want:    Sync{Ended: at(10.5)},
	}, {
		// The change's sync (10.2 to 10.3) ended before Settle's first look;
		// a scrape before the write saw 5 syncs, so its duration is known.
		name:    "sync done before the first look",
		scrapes: []Metrics{idle, {Syncs: 6, SyncSeconds: 1.1, LastSync: at(10.3), LastQueued: at(10.1)}},
		want:    Sync{Started: at(10.2), Ended: at(10.3), Duration: 100 * time.Millisecond},
	}, {
		// kube-proxy syncs at once after the queue (min-sync-period 0): the
		// start estimate (10.098) falls before the queue, but a scrape with
		// nothing pending and the same queue time came before the sync
		// ended, so the next sync to end proves it.
		name: "drained, immediate sync",
		scrapes: []Metrics{queued,
			{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1)},
			{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1)},
			{Syncs: 6, SyncSeconds: 1.05, LastSync: at(10.148), LastQueued: at(10.1)}},
		want: Sync{Started: at(10.098), Ended: at(10.148), Duration: 50 * time.Millisecond},
	}, {
		// The same with the scrape before the write given instead of seen:
		// Settle's first look already has the change's sync.
		name:    "sync done before the first look, Before given",
		before:  &idle,
		scrapes: []Metrics{{Syncs: 6, SyncSeconds: 1.1, LastSync: at(10.3), LastQueued: at(10.1)}},
		want:    Sync{Started: at(10.2), Ended: at(10.3), Duration: 100 * time.Millisecond},
	}, {
		// A stamped slice write observed as programmed: proven although
		// the one sync since Before started (10.0) before the queue.
		name:       "programmed",
		before:     &idle,
		programmed: 1,
		scrapes:    []Metrics{programmedOnce},
		want:       Sync{Ended: at(10.3)},
	}, {
		// Without Before the programming count has no baseline: the same
		// scrape proves nothing (TestSettleNotProven's first case); here
		// the next sync does.
		name:       "programmed without Before",
		programmed: 1,
		scrapes:    []Metrics{queued, programmedOnce, {Syncs: 7, SyncSeconds: 1.35, LastSync: at(10.35), LastQueued: at(10.1), Programming: 1}},
		want:       Sync{Ended: at(10.35)},
	}, {
		name:    "no queue",
		scrapes: []Metrics{idle},
		wantErr: errNoQueue,
	}, {
		name:    "failed sync",
		scrapes: []Metrics{queued, {Syncs: 6, SyncSeconds: 1.1, LastSync: at(9), LastQueued: at(10.1), SyncErrors: 1}},
		wantErr: ErrSyncFailed,
	}, {
		// With Before, a failure before Settle sees the queue counts too.
		name:    "failed sync before the queue",
		before:  &idle,
		scrapes: []Metrics{{Syncs: 6, SyncSeconds: 1.1, LastSync: at(9.5), LastQueued: at(8), SyncErrors: 1}},
		wantErr: ErrSyncFailed,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Change{Since: since, Before: tt.before, Programmed: tt.programmed}
			got, err := settle(context.Background(), fakeScrapes(tt.scrapes...), &syncHistory{}, c, 200*time.Millisecond, time.Millisecond)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("settle = %+v, %v; want %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Started.Equal(tt.want.Started) || !got.Ended.Equal(tt.want.Ended) || got.Duration.Round(time.Millisecond) != tt.want.Duration {
				t.Errorf("settle = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestSettleNotProven: a queued change whose only sync started before the
// queue, or whose sync ended before the first look with no earlier scrape
// to date its start, times out.
func TestSettleNotProven(t *testing.T) {
	for name, s := range map[string][]Metrics{
		"sync started before the queue": {
			{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1)},
			{Syncs: 6, SyncSeconds: 1.3, LastSync: at(10.3), LastQueued: at(10.1)},
		},
		"no baseline": {{Syncs: 6, SyncSeconds: 1.1, LastSync: at(10.3), LastQueued: at(10.1)}},
		// The same immediate sync with changes still pending at every look
		// before it ended: nothing proves it.
		"pending": {
			{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1), ChangesPending: 1},
			{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1), ChangesPending: 1},
			{Syncs: 6, SyncSeconds: 1.05, LastSync: at(10.148), LastQueued: at(10.1)},
		},
		// A queue time that changed between the two looks (a change
		// arrived while the gauges were read) is no drain.
		"queue moved": {
			{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1), ChangesPending: 1},
			{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.2)},
			{Syncs: 6, SyncSeconds: 1.05, LastSync: at(10.148), LastQueued: at(10.2)},
		},
	} {
		_, err := settle(context.Background(), fakeScrapes(s...), &syncHistory{}, Change{Since: at(10)}, 50*time.Millisecond, time.Millisecond)
		if err == nil || errors.Is(err, errNoQueue) {
			t.Errorf("%s: settle = %v, want a timeout with the change queued", name, err)
		}
	}
}

// TestSettleNudge: with a Nudge, Settle asks for a sync once the change
// is queued and again after each sync that ends without proof, and stops
// asking once one proves it. In the fake, a sync runs only when nudged and
// ends before the next look; the change (queued at 10.1) finds a sync in
// progress since 10.05, which the first nudge lets end: it started before
// the queue and proves nothing, and without a second nudge no sync would
// follow (changes stay pending at every look, so no drain proves it).
func TestSettleNudge(t *testing.T) {
	start := Metrics{Syncs: 5, SyncSeconds: 1.0, LastSync: at(9), LastQueued: at(10.1), ChangesPending: 1}
	m := start
	syncs := []struct{ started, ended float64 }{{10.05, 10.15}, {10.2, 10.25}, {10.3, 10.35}}
	nudges := 0
	scrape := func(context.Context) (Metrics, error) { return m, nil }
	nudge := func(context.Context) error {
		s := syncs[nudges]
		nudges++
		m.Syncs++
		m.SyncSeconds += s.ended - s.started
		m.LastSync, m.LastQueued = at(s.ended), at(s.started)
		return nil
	}
	got, err := settle(context.Background(), scrape, &syncHistory{}, Change{Since: at(10), Nudge: nudge}, time.Second, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if nudges != 2 || !got.Ended.Equal(at(10.25)) {
		t.Errorf("settle = %+v after %d nudges, want the sync ended at 10.25 after 2", got, nudges)
	}
	m, nudges = start, 0
	if _, err := settle(context.Background(), scrape, &syncHistory{}, Change{Since: at(10)}, 50*time.Millisecond, time.Millisecond); err == nil {
		t.Error("without a nudge: settled, want a timeout")
	}
	failing := func(context.Context) error { return errors.New("refused") }
	if _, err := settle(context.Background(), scrape, &syncHistory{}, Change{Since: at(10), Nudge: failing}, time.Second, time.Millisecond); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a failing nudge: %v, want its error at once", err)
	}
}

// sample reads one sample's value from /metrics text by its exact series
// name, independently of ParseMetrics.
func sample(t *testing.T, text, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return f
		}
	}
	t.Fatalf("no sample %s", series)
	return 0
}

// TestParseMetrics reads the real kube-proxy's /metrics (captured by the
// root integration test with -update) and checks each figure against the
// sample line, and kube-proxy's own invariant: every sync is full or
// partial.
func TestParseMetrics(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "metrics-"+mode+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			m, err := ParseMetrics(strings.NewReader(string(data)))
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			v4 := `{ip_family="IPv4"}`
			checks := []struct {
				name      string
				got, want float64
			}{
				{"Syncs", float64(m.Syncs), sample(t, text, mSync+"_count"+v4)},
				{"SyncSeconds", m.SyncSeconds, sample(t, text, mSync+"_sum"+v4)},
				{"FullSyncs", float64(m.FullSyncs), sample(t, text, mFull+"_count"+v4)},
				{"PartialSyncSeconds", m.PartialSyncSeconds, sample(t, text, mPartial+"_sum"+v4)},
				{"Programming", float64(m.Programming), sample(t, text, mProgramming+"_count"+v4)},
				{"LastSync", float64(m.LastSync.UnixNano()) / 1e9, sample(t, text, mLast+v4)},
				{"LastQueued", float64(m.LastQueued.UnixNano()) / 1e9, sample(t, text, mQueued+v4)},
				{"ChangesPending", float64(m.ChangesPending), sample(t, text, mSvcPending) + sample(t, text, mEpPending)},
			}
			for _, c := range checks {
				if math.Abs(c.got-c.want) > 1e-6 {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
				}
			}
			if m.Syncs == 0 || m.Syncs != m.FullSyncs+m.PartialSyncs || m.SyncErrors != 0 {
				t.Errorf("syncs %d = full %d + partial %d, errors %d: want > 0, equal, 0", m.Syncs, m.FullSyncs, m.PartialSyncs, m.SyncErrors)
			}
			if m.LastSync.Before(m.LastQueued) {
				t.Errorf("last sync %v before last queue %v after settling", m.LastSync, m.LastQueued)
			}
		})
	}
}

// TestParseMetricsFamilies: an unlabelled series is read, another family
// is ignored, and a missing metric reads as zero.
func TestParseMetricsFamilies(t *testing.T) {
	text := "# TYPE " + mIPTFail + " counter\n" + mIPTFail + " 3\n" +
		"# TYPE " + mNFTFail + " counter\n" + mNFTFail + `{ip_family="IPv6"} 7` + "\n" + mNFTFail + `{ip_family="IPv4"} 2` + "\n"
	m, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m.SyncErrors != 5 || m.Syncs != 0 || !m.LastSync.IsZero() {
		t.Errorf("ParseMetrics = %+v, want SyncErrors 5 and the rest zero", m)
	}
}

// TestKubeProxyArgv: kube-proxy runs with a private /run of its own, or
// inside a node's mount namespace when MountNS says which.
func TestKubeProxyArgv(t *testing.T) {
	testenv.RequireCommands(t, "unshare", "nsenter")
	cfg := KubeProxyConfig{Node: "node-a", NodeIP: netip.MustParseAddr("198.18.0.1"), Mode: "iptables"}
	argv, err := cfg.argv([]string{"/bin/kube-proxy"}, "/d/kc")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(argv[1:8], " "); !strings.HasSuffix(argv[0], "unshare") || got != "--mount --propagation private sh -c "+privateRun+" /bin/kube-proxy" {
		t.Errorf("argv = %q", argv)
	}
	cfg.MountNS = "/proc/42/ns/mnt"
	if argv, err = cfg.argv([]string{"/bin/kube-proxy"}, "/d/kc"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(argv[1:5], " "); !strings.HasSuffix(argv[0], "nsenter") || got != "--mount=/proc/42/ns/mnt -- /bin/kube-proxy --kubeconfig=/d/kc" {
		t.Errorf("argv = %q", argv)
	}
	// A drop-in node proxy in kube-proxy's place takes its command line.
	if argv, err = cfg.argv([]string{"/bin/sim", "proxy", "--own-netns"}, "/d/kc"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(argv[1:7], " "); got != "--mount=/proc/42/ns/mnt -- /bin/sim proxy --own-netns --kubeconfig=/d/kc" {
		t.Errorf("argv = %q", argv)
	}
}
