// Command ctgen is the traffic of gen-conntrack.sh: servers for the
// endpoint pods, TCP connections held open or closed, UDP flows, and the
// nfacct counters the dump's rules match. gen-conntrack.sh runs it inside
// the namespaces it creates (ip netns exec); it never opens a namespace
// itself.
//
//	ctgen serve -tcp 80,8080 -udp 53            answer on every address of the namespace
//	ctgen tcp -n N [-hold -ready FILE] ADDR:PORT N connections (held until SIGTERM, or closed)
//	ctgen udp -n N [-keep -ready FILE] ADDR:PORT N flows from N source ports (kept sending until SIGTERM)
//	ctgen ping -n N ADDR                        N ICMP echo requests, each answered
//	ctgen nfacct NAME...                        nfacct objects (ip netns exec NS nfacct add NAME)
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: ctgen serve|tcp|udp|nfacct ..."))
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "tcp":
		err = tcpClients(os.Args[2:])
	case "udp":
		err = udpClients(os.Args[2:])
	case "ping":
		err = ping(os.Args[2:])
	case "nfacct":
		err = nfacct(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ctgen:", err)
	os.Exit(1)
}

func ports(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		if s == "" {
			continue
		}
		p, err := strconv.Atoi(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// serve answers each TCP connection's first byte with one byte and then
// reads until the client closes; each UDP datagram is echoed.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	tcpList := fs.String("tcp", "", "TCP ports")
	udpList := fs.String("udp", "", "UDP ports")
	_ = fs.Parse(args)
	tp, err := ports(*tcpList)
	if err != nil {
		return err
	}
	up, err := ports(*udpList)
	if err != nil {
		return err
	}
	for _, p := range tp {
		l, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", p))
		if err != nil {
			return err
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					b := make([]byte, 1)
					if _, err := io.ReadFull(c, b); err != nil {
						return
					}
					if _, err := c.Write(b); err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, c)
				}()
			}
		}()
	}
	// One UDP socket per address: a reply must come from the address the
	// client's datagram was sent to (the endpoint its entry was DNATed to),
	// which a socket bound to 0.0.0.0 does not choose.
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	var pcs []net.PacketConn
	for _, p := range up {
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.To4() == nil || ipn.IP.IsLoopback() {
				continue
			}
			pc, err := net.ListenPacket("udp4", net.JoinHostPort(ipn.IP.String(), strconv.Itoa(p)))
			if err != nil {
				return err
			}
			pcs = append(pcs, pc)
		}
	}
	for _, pc := range pcs {
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:n], from)
			}
		}()
	}
	waitSignal()
	return nil
}

func waitSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
}

func ready(file string) error {
	if file == "" {
		return nil
	}
	return os.WriteFile(file, []byte("ready\n"), 0o644)
}

// tcpClients opens n connections one after the other, each exchanging one
// byte; with -hold they stay open until SIGTERM, else each is closed by
// the client right away (TIME_WAIT in the node's table).
func tcpClients(args []string) error {
	fs := flag.NewFlagSet("tcp", flag.ExitOnError)
	n := fs.Int("n", 1, "connections")
	hold := fs.Bool("hold", false, "keep the connections open until SIGTERM")
	readyFile := fs.String("ready", "", "write this file once every connection is up")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return errors.New("tcp: want one ADDR:PORT")
	}
	var held []net.Conn
	for i := 0; i < *n; i++ {
		c, err := net.DialTimeout("tcp4", fs.Arg(0), 3*time.Second)
		if err != nil {
			return fmt.Errorf("connection %d to %s: %w", i, fs.Arg(0), err)
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		b := []byte{'x'}
		if _, err := c.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return fmt.Errorf("connection %d to %s: no answer: %w", i, fs.Arg(0), err)
		}
		_ = c.SetDeadline(time.Time{})
		if *hold {
			held = append(held, c)
		} else {
			_ = c.Close()
		}
	}
	if err := ready(*readyFile); err != nil {
		return err
	}
	if *hold {
		waitSignal()
	}
	return nil
}

// udpClients sends one datagram from each of n sockets and waits for the
// echo; with -keep every socket then sends one datagram a second until
// SIGTERM (a flow that keeps its conntrack entry alive, answered or not).
func udpClients(args []string) error {
	fs := flag.NewFlagSet("udp", flag.ExitOnError)
	n := fs.Int("n", 1, "flows")
	keep := fs.Bool("keep", false, "keep sending until SIGTERM")
	unanswered := fs.Bool("unanswered", false, "expect no answer (the flows stay UNREPLIED)")
	readyFile := fs.String("ready", "", "write this file once every flow was answered")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return errors.New("udp: want one ADDR:PORT")
	}
	raddr, err := net.ResolveUDPAddr("udp4", fs.Arg(0))
	if err != nil {
		return err
	}
	var socks []*net.UDPConn
	for i := 0; i < *n; i++ {
		c, err := net.DialUDP("udp4", nil, raddr)
		if err != nil {
			return err
		}
		if _, err := c.Write([]byte("q")); err != nil {
			return err
		}
		socks = append(socks, c)
		if *unanswered {
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b := make([]byte, 16)
		if _, err := c.Read(b); err != nil {
			return fmt.Errorf("flow %d to %s: no answer: %w", i, fs.Arg(0), err)
		}
	}
	if err := ready(*readyFile); err != nil {
		return err
	}
	if !*keep {
		for _, c := range socks {
			_ = c.Close()
		}
		return nil
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-tick.C:
			for _, c := range socks {
				_, _ = c.Write([]byte("q"))
			}
		}
	}
}

// ping sends n ICMP echo requests (identifier = pid, sequence 1..n) from
// a raw socket and waits for each reply.
func ping(args []string) error {
	fs := flag.NewFlagSet("ping", flag.ExitOnError)
	n := fs.Int("n", 1, "echo requests")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return errors.New("ping: want one ADDR")
	}
	c, err := net.Dial("ip4:icmp", fs.Arg(0))
	if err != nil {
		return err
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	for seq := 1; seq <= *n; seq++ {
		msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'k', 'p'}
		sum := 0
		for i := 0; i < len(msg); i += 2 {
			sum += int(msg[i])<<8 | int(msg[i+1])
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		msg[2], msg[3] = byte(^sum>>8), byte(^sum)
		if _, err := c.Write(msg); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b := make([]byte, 1500)
		for {
			k, err := c.Read(b)
			if err != nil {
				return fmt.Errorf("echo %d to %s: no reply: %w", seq, fs.Arg(0), err)
			}
			// The raw socket gives the IP header first.
			if h := int(b[0]&0x0f) * 4; k >= h+8 && b[h] == 0 && int(b[h+4])<<8|int(b[h+5]) == id {
				break
			}
		}
	}
	return nil
}

// nfacct creates nfacct objects in the current namespace through
// nfnetlink_acct (NFNL_MSG_ACCT_NEW with NFACCT_NAME), as kube-proxy does
// before it writes `-m nfacct --nfacct-name` rules.
func nfacct(names []string) error {
	for _, name := range names {
		sock, err := nl.GetNetlinkSocketAt(vnetns.None(), vnetns.None(), unix.NETLINK_NETFILTER)
		if err != nil {
			return err
		}
		req := &nl.NetlinkRequest{
			NlMsghdr: unix.NlMsghdr{
				Len:   uint32(unix.SizeofNlMsghdr),
				Type:  uint16(0 | unix.NFNL_SUBSYS_ACCT<<8),
				Flags: unix.NLM_F_REQUEST | unix.NLM_F_CREATE | unix.NLM_F_ACK,
			},
			Sockets: map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: sock}},
		}
		req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
		req.AddData(nl.NewRtAttr(1, nl.ZeroTerminated(name)))
		_, err = req.Execute(unix.NETLINK_NETFILTER, 0)
		sock.Close()
		if err != nil && !errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("nfacct %s: %w", name, err)
		}
	}
	return nil
}
