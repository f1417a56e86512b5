package cluster

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/upstream"
)

// APIForwarder makes the run's kube-apiserver reachable from the network
// namespace that called ForwardAPI (the host's) without a route or link
// there: it listens on a loopback address and forwards every TCP
// connection to the apiserver, dialled from a socket created inside the
// control-plane namespace. TLS passes through untouched; the apiserver's
// serving certificate holds 127.0.0.1 (harness/upstream's servingSANs).
type APIForwarder struct {
	ln     net.Listener
	ns     *netns.Namespace
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// ForwardAPI listens on addr (e.g. "127.0.0.1:0": a free port) in the
// caller's network namespace and forwards to the apiserver until Close.
func (c *Cluster) ForwardAPI(addr string) (*APIForwarder, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("could not listen on %s for the apiserver: %w", addr, err)
	}
	f := &APIForwarder{ln: ln, ns: c.topo.ControlPlane(), conns: map[net.Conn]struct{}{},
		target: netip.AddrPortFrom(controlPlaneAddr.Addr(), upstream.APIServerPort).String()}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

// Addr is the address the forwarder listens on.
func (f *APIForwarder) Addr() netip.AddrPort {
	return f.ln.Addr().(*net.TCPAddr).AddrPort()
}

// Server is the URL a client uses: https://Addr.
func (f *APIForwarder) Server() string { return "https://" + f.Addr().String() }

func (f *APIForwarder) serve() {
	defer f.wg.Done()
	for {
		conn, err := f.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // EMFILE and the like: wait for a slot
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !f.track(conn) {
			conn.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(conn)
			f.forward(conn)
		}()
	}
}

// track records an open connection; false once the forwarder is closed.
func (f *APIForwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *APIForwarder) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
	c.Close()
}

// forward dials the apiserver inside the control-plane namespace (the
// socket keeps the namespace it was created in) and copies both ways,
// passing each side's end of stream on as a half close.
func (f *APIForwarder) forward(client net.Conn) {
	var server net.Conn
	err := f.ns.Do(func() error {
		var err error
		server, err = net.DialTimeout("tcp", f.target, 10*time.Second)
		return err
	})
	if err != nil || !f.track(server) {
		if server != nil {
			server.Close()
		}
		return
	}
	defer f.untrack(server)
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}
	wg.Add(2)
	go pipe(server, client)
	go pipe(client, server)
	wg.Wait()
}

// Close stops listening, closes every forwarded connection and waits
// until their goroutines have ended.
func (f *APIForwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	err := f.ln.Close()
	f.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("could not close the apiserver forwarder: %w", err)
	}
	return nil
}

// ContextName is the name of the cluster, user and context in the
// kubeconfigs AdminKubeconfig writes for run id: kpsim-<id>.
func ContextName(id string) string { return netns.Prefix + id }

// AdminKubeconfig is a kubeconfig of the run's admin (group
// system:masters, a bearer token) for the apiserver at server (e.g. an
// APIForwarder's), trusting the run's CA; its cluster, user and context
// are all named ContextName.
func (c *Cluster) AdminKubeconfig(server string) []byte {
	rc := c.cp.RESTConfig()
	return kubeconfig(ContextName(c.RunID()), server, rc.CAData, rc.BearerToken)
}

func kubeconfig(name, server string, caPEM []byte, token string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\n")
	fmt.Fprintf(&b, "clusters:\n- name: %s\n  cluster:\n    server: %s\n    certificate-authority-data: %s\n",
		name, server, base64.StdEncoding.EncodeToString(caPEM))
	fmt.Fprintf(&b, "users:\n- name: %s\n  user:\n    token: %s\n", name, token)
	fmt.Fprintf(&b, "contexts:\n- name: %s\n  context:\n    cluster: %s\n    user: %s\n", name, name, name)
	fmt.Fprintf(&b, "current-context: %s\n", name)
	return []byte(b.String())
}
