// Command kpsim-agent is the in-cluster agent of harness/agent: an echo
// backend that counts the probes reaching its ports, or a prober that
// sends probe blocks on request and counts the ICMP errors they bring
// back. The harness drives it over HTTP on port 9376 through the
// kube-apiserver's pods/proxy subresource. It needs CAP_NET_RAW and nothing
// else; SIGTERM or SIGINT stops it cleanly.
//
//	kpsim-agent echo --ports tcp:8080,udp:8080 [--listen :9376]
//	kpsim-agent probe [--listen :9376]
//
// NODE_NAME and POD_IP (the downward API) name the node and the pod in
// GET /v1/info.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/kpsim/kpsim/harness/agent"
)

// version is set at build time (make kpsim-agent: git describe).
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "kpsim-agent: %v\n", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

const usage = `usage:
  kpsim-agent echo --ports tcp:8080,udp:8080 [--listen :9376]
  kpsim-agent probe [--listen :9376]`

// usageError is a bad command line (exit status 2).
type usageError struct{ error }

// runner is an agent of either mode.
type runner interface {
	http.Handler
	Run(ctx context.Context) error
	Close() error
}

// Run runs the agent args ask for until ctx ends, logging to log.
func Run(ctx context.Context, args []string, log io.Writer) error {
	if len(args) == 0 || (args[0] != agent.ModeEcho && args[0] != agent.ModeProbe) {
		return usageError{errors.New("the first argument is the mode, echo or probe\n" + usage)}
	}
	mode := args[0]
	fs := flag.NewFlagSet("kpsim-agent "+mode, flag.ContinueOnError)
	fs.SetOutput(log)
	listen := fs.String("listen", ":"+strconv.Itoa(agent.Port), "the HTTP API's address")
	var ports *string
	if mode == agent.ModeEcho {
		ports = fs.String("ports", "", "the ports to serve and count probes at, PROTO:PORT,... (tcp:8080,udp:8080)")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), usage)}
	}
	info := agent.Info{Node: os.Getenv("NODE_NAME"), PodIP: podIP(), Version: version}
	var a runner
	switch mode {
	case agent.ModeEcho:
		ps, err := agent.ParsePorts(*ports)
		if err != nil {
			return usageError{fmt.Errorf("--ports: %w", err)}
		}
		e, err := agent.OpenEcho(info, ps)
		if err != nil {
			return err
		}
		a, info = e, e.Info()
	case agent.ModeProbe:
		p, err := agent.OpenProber(info)
		if err != nil {
			return err
		}
		a, info = p, p.Info()
	}
	defer a.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("could not listen on %s: %w", *listen, err)
	}
	// A send takes at most 32,768 * 50 µs + 10 s: the write timeout
	// leaves room for it.
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(ctx) }()
	fmt.Fprintf(log, "kpsim-agent %s: %s mode, API on %s, node %q, pod %s, ports %v, observer buffer: %s\n",
		info.Version, info.Mode, ln.Addr(), info.Node, info.PodIP, info.Ports, info.ObserverBuffer)

	var failed error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		failed = fmt.Errorf("the HTTP server stopped: %w", err)
	case err := <-runErr:
		runErr <- err
		failed = fmt.Errorf("the observer stopped: %w", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil && failed == nil {
		failed = fmt.Errorf("could not stop the HTTP server: %w", err)
	}
	cancel()
	<-runErr
	if failed == nil {
		fmt.Fprintf(log, "kpsim-agent: stopped\n")
	}
	return failed
}

// podIP is POD_IP (the downward API's status.podIP), or else the first
// global unicast IPv4 address of the pod's interfaces.
func podIP() string {
	if ip := os.Getenv("POD_IP"); ip != "" {
		return ip
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}
