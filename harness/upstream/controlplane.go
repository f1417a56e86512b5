package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// Ports inside the control-plane namespace. etcd listens on 127.0.0.1 only
// (nothing outside the namespace reaches it); the apiserver on the
// namespace's fabric address.
const (
	APIServerPort   = 6443
	etcdClientPort  = 2379
	etcdPeerPort    = 2380
	etcdMetricsPort = 2381
)

// startTimeout bounds StartControlPlane's and StartKubeProxy's waits.
const startTimeout = 60 * time.Second

// ControlPlaneConfig is where and how StartControlPlane runs etcd and
// kube-apiserver.
type ControlPlaneConfig struct {
	// NS is the run's control-plane namespace (on the fabric).
	NS *netns.Namespace
	// Addr is its fabric address: the apiserver's bind and advertise
	// address.
	Addr netip.Addr
	// Dir is the run folder for certificates, tokens, etcd data and logs;
	// the caller creates and removes it.
	Dir string
	// ServiceCIDR is --service-cluster-ip-range (the scenario's).
	ServiceCIDR netip.Prefix
	// SecondaryServiceCIDR, when valid, is an IPv6 range appended to
	// --service-cluster-ip-range: a dual-stack API server, whose Services
	// may have an IPv6 ClusterIP too (the import fixtures use it; the
	// dataplane is IPv4 only).
	SecondaryServiceCIDR netip.Prefix
	// Bin are the binaries.
	Bin Binaries
	// Log gets progress lines (nil: none); process output goes to files in
	// Dir (etcd.log, kube-apiserver.log).
	Log io.Writer
	// Users are more users of the static token file, for a real cluster's
	// components (a kubelet's system:node:NAME in group system:nodes, the
	// controller manager, the scheduler); UserKubeconfig writes theirs.
	Users []User
	// NodeAuthorization authorizes with Node,RBAC and admits with
	// NodeRestriction, as a real cluster does for its kubelets (otherwise
	// RBAC alone, which is all kube-proxy needs).
	NodeAuthorization bool
}

// User is a user of the static token file: a name and its groups.
type User struct {
	Name   string
	Groups []string
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	cfg    ControlPlaneConfig
	creds  *credentials
	etcd   *process
	api    *process
	rest   *rest.Config
	client kubernetes.Interface
}

func (cfg *ControlPlaneConfig) validate() error {
	switch {
	case cfg.NS == nil:
		return errors.New("could not start the control plane: no namespace")
	case !cfg.Addr.Is4():
		return fmt.Errorf("could not start the control plane: address %v is not IPv4", cfg.Addr)
	case !cfg.ServiceCIDR.IsValid():
		return errors.New("could not start the control plane: no service CIDR")
	case cfg.Dir == "":
		return errors.New("could not start the control plane: no run folder")
	}
	if st, err := os.Stat(cfg.Dir); err != nil || !st.IsDir() {
		return fmt.Errorf("could not start the control plane: run folder %s: not a folder (%v)", cfg.Dir, err)
	}
	return nil
}

func (cfg *ControlPlaneConfig) logf(format string, args ...any) {
	if cfg.Log != nil {
		fmt.Fprintf(cfg.Log, format+"\n", args...)
	}
}

// StartControlPlane generates the run's certificates, keys and tokens in
// cfg.Dir, starts etcd and then kube-apiserver inside cfg.NS and waits
// (60 s at most) until etcd is healthy, the apiserver's /readyz answers
// 200 and its default ServiceCIDR is ready. On error it stops what it
// started.
func StartControlPlane(ctx context.Context, cfg ControlPlaneConfig) (*ControlPlane, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	creds, err := writePKI(cfg.Dir, cfg.Addr, firstServiceIP(cfg.ServiceCIDR))
	if err != nil {
		return nil, fmt.Errorf("could not start the control plane: %w", err)
	}
	if creds.userTokens, err = appendUsers(cfg.Dir, cfg.Users); err != nil {
		return nil, fmt.Errorf("could not start the control plane: %w", err)
	}
	c := &ControlPlane{cfg: cfg, creds: creds}
	c.rest = c.restConfig(creds.adminToken)
	if c.client, err = kubernetes.NewForConfig(c.rest); err != nil {
		return nil, fmt.Errorf("could not make the admin client: %w", err)
	}
	admin := kubeconfig(c.Server(), creds.caPEM, AdminUser, creds.adminToken)
	if err := os.WriteFile(filepath.Join(cfg.Dir, adminKubeconf), []byte(admin), 0o600); err != nil {
		return nil, fmt.Errorf("could not write the admin kubeconfig: %w", err)
	}
	deadline := time.Now().Add(startTimeout)
	if err := c.startEtcd(ctx, deadline); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := c.startAPIServer(ctx, deadline); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *ControlPlane) startEtcd(ctx context.Context, deadline time.Time) error {
	start := time.Now()
	u := func(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }
	args := []string{c.cfg.Bin.Etcd,
		"--name=kpsim",
		"--data-dir=" + filepath.Join(c.cfg.Dir, "etcd-data"),
		"--listen-client-urls=" + u(etcdClientPort),
		"--advertise-client-urls=" + u(etcdClientPort),
		"--listen-peer-urls=" + u(etcdPeerPort),
		"--initial-advertise-peer-urls=" + u(etcdPeerPort),
		"--initial-cluster=kpsim=" + u(etcdPeerPort),
		"--listen-metrics-urls=" + u(etcdMetricsPort),
		"--log-outputs=stderr",
	}
	p, err := startProcess(c.cfg.NS, c.cfg.Dir, "etcd", args, processEnv())
	if err != nil {
		return err
	}
	c.etcd = p
	hc := &http.Client{Transport: &http.Transport{DialContext: dialIn(c.cfg.NS), Proxy: noProxy}, Timeout: 5 * time.Second}
	err = poll(ctx, 50*time.Millisecond, time.Until(deadline), "etcd healthy", func() (bool, error) {
		if p.exited() {
			return false, &fatalError{p.exitError()}
		}
		resp, err := hc.Get(u(etcdClientPort) + "/health")
		if err != nil {
			return false, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`), nil
	})
	if err != nil {
		return fmt.Errorf("could not start etcd: %w", err)
	}
	c.cfg.logf("etcd healthy in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

func (c *ControlPlane) startAPIServer(ctx context.Context, deadline time.Time) error {
	start := time.Now()
	d := c.cfg.Dir
	args := []string{c.cfg.Bin.APIServer,
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(etcdClientPort),
		"--bind-address=" + c.cfg.Addr.String(),
		"--advertise-address=" + c.cfg.Addr.String(),
		"--secure-port=" + strconv.Itoa(APIServerPort),
		"--service-cluster-ip-range=" + c.serviceRange(),
		"--cert-dir=" + filepath.Join(d, "apiserver-certs"),
		"--tls-cert-file=" + filepath.Join(d, serveCertFile),
		"--tls-private-key-file=" + filepath.Join(d, serveKeyFile),
		"--client-ca-file=" + filepath.Join(d, caCertFile),
		"--token-auth-file=" + filepath.Join(d, tokenFile),
		"--authorization-mode=" + c.authorizationMode(),
		"--service-account-key-file=" + filepath.Join(d, saPubFile),
		"--service-account-signing-key-file=" + filepath.Join(d, saKeyFile),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--profiling=false",
	}
	if c.cfg.NodeAuthorization {
		args = append(args, "--enable-admission-plugins=NodeRestriction")
	}
	p, err := startProcess(c.cfg.NS, d, "kube-apiserver", args, processEnv())
	if err != nil {
		return err
	}
	c.api = p
	err = poll(ctx, 100*time.Millisecond, time.Until(deadline), "kube-apiserver /readyz", func() (bool, error) {
		if p.exited() {
			return false, &fatalError{p.exitError()}
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("could not start kube-apiserver: %w", err)
	}
	// The default ServiceCIDR ("kubernetes") is created by a controller of
	// the apiserver after /readyz can answer 200. kube-proxy's nftables
	// proxier writes the "Drop traffic to unallocated ClusterIPs" rule from
	// it in full syncs only (setupNFTables), so a kube-proxy whose first sync
	// came before it would miss the rule for an hour. A real cluster's
	// apiserver created it long before any kube-proxy started.
	err = poll(ctx, 100*time.Millisecond, time.Until(deadline), "the default ServiceCIDR", func() (bool, error) {
		if p.exited() {
			return false, &fatalError{p.exitError()}
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		sc, err := c.client.NetworkingV1().ServiceCIDRs().Get(rctx, defaultServiceCIDR, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady), nil
	})
	if err != nil {
		return fmt.Errorf("could not start kube-apiserver: %w", err)
	}
	c.cfg.logf("kube-apiserver ready in %s (default ServiceCIDR ready)", time.Since(start).Round(time.Millisecond))
	return nil
}

func (c *ControlPlane) authorizationMode() string {
	if c.cfg.NodeAuthorization {
		return "Node,RBAC"
	}
	return "RBAC"
}

// defaultServiceCIDR is the ServiceCIDR object kube-apiserver makes from
// --service-cluster-ip-range.
const defaultServiceCIDR = "kubernetes"

func (c *ControlPlane) serviceRange() string {
	if c.cfg.SecondaryServiceCIDR.IsValid() {
		return c.cfg.ServiceCIDR.String() + "," + c.cfg.SecondaryServiceCIDR.String()
	}
	return c.cfg.ServiceCIDR.String()
}

// Server is the apiserver's URL on the fabric, https://Addr:6443.
func (c *ControlPlane) Server() string {
	return "https://" + netip.AddrPortFrom(c.cfg.Addr, APIServerPort).String()
}

// Namespace is the control-plane namespace.
func (c *ControlPlane) Namespace() *netns.Namespace { return c.cfg.NS }

// AdminKubeconfig is the path of the admin's kubeconfig in Dir, for
// `ip netns exec <cp> kubectl --kubeconfig ...` while debugging.
func (c *ControlPlane) AdminKubeconfig() string { return filepath.Join(c.cfg.Dir, adminKubeconf) }

// restConfig is a client config for token, dialling inside the control
// plane's namespace, with no client-side rate limit (the harness writes
// thousands of objects) and no proxy from the environment.
func (c *ControlPlane) restConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            c.Server(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.creds.caPEM},
		Dial:            dialIn(c.cfg.NS),
		Proxy:           noProxy,
		QPS:             -1,
		UserAgent:       "kpsim",
		Timeout:         30 * time.Second,
	}
}

// UserKubeconfig is a kubeconfig for one of ControlPlaneConfig.Users,
// with its bearer token, for a component that dials the apiserver from
// inside the run's namespaces.
func (c *ControlPlane) UserKubeconfig(name string) (string, error) {
	token, ok := c.creds.userTokens[name]
	if !ok {
		return "", fmt.Errorf("could not write a kubeconfig for %s: not a user of this control plane", name)
	}
	return kubeconfig(c.Server(), c.creds.caPEM, name, token), nil
}

// CAFile is the path of the run's CA certificate (PEM), which signed the
// apiserver's serving certificate.
func (c *ControlPlane) CAFile() string { return filepath.Join(c.cfg.Dir, caCertFile) }

// ServiceAccountKeyFile is the path of the service-account signing key
// (RSA, PEM), for kube-controller-manager's
// --service-account-private-key-file.
func (c *ControlPlane) ServiceAccountKeyFile() string { return filepath.Join(c.cfg.Dir, saKeyFile) }

// Client is an admin client (group system:masters) whose connections are
// dialled inside the control plane's namespace.
func (c *ControlPlane) Client() kubernetes.Interface { return c.client }

// RESTConfig is the admin client's configuration (a copy), for informers
// and other clients.
func (c *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Close stops kube-apiserver, then etcd: SIGTERM, SIGKILL after 10 s, and
// waits for each. Safe to call more than once.
func (c *ControlPlane) Close() error {
	err := errors.Join(c.api.stop(), c.etcd.stop())
	if err != nil {
		return fmt.Errorf("could not stop the control plane: %w", err)
	}
	return nil
}

func noProxy(*http.Request) (*url.URL, error) { return nil, nil }

// processEnv is the environment of the upstream processes: ours without
// proxy variables (everything they reach is inside the run).
func processEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToLower(k) {
		case "http_proxy", "https_proxy", "no_proxy", "all_proxy":
			continue
		}
		out = append(out, kv)
	}
	return out
}
