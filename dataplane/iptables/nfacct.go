package iptables

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// The nfacct counters kube-proxy's iptables mode creates on each full sync
// (pkg/proxy/metrics, pkg/proxy/util/nfacct) and matches with
// `-m nfacct --nfacct-name`: the INVALID-state drop rule of KUBE-FORWARD
// counts into the first, the localhost node-port rules of KUBE-NODEPORTS into
// the second. kube-proxy leaves the match out of a rule whose counter it could
// not create, and so does the renderer (Renderer.SetNFAcct).
const (
	NFAcctInvalidDropped     = "ct_state_invalid_dropped_pkts"
	NFAcctLocalhostNodePorts = "localhost_nps_accepted_pkts"
)

// NFAcctCounters lists both counters.
var NFAcctCounters = []string{NFAcctInvalidDropped, NFAcctLocalhostNodePorts}

// nfnetlink_acct's message types and attribute (linux/netfilter/nfnetlink_acct.h).
const (
	nfnlMsgAcctNew = 0 // NFNL_MSG_ACCT_NEW
	nfacctAttrName = 1 // NFACCT_NAME
	nfacctNameMax  = 31
)

// NFAcctEnsure creates the nfacct object name in ns unless it exists. The
// netlink socket is opened inside ns.Do, so the request acts in ns.
// Equivalent to: `ip netns exec NS nfacct add NAME` (which fails on an
// existing object, where this does not).
func NFAcctEnsure(ns *netns.Namespace, name string) error {
	if name == "" || len(name) > nfacctNameMax {
		return fmt.Errorf("could not create nfacct counter %q: the name must have 1 to %d characters", name, nfacctNameMax)
	}
	var sock *nl.NetlinkSocket
	err := ns.Do(func() error {
		var err error
		sock, err = nl.GetNetlinkSocketAt(vnetns.None(), vnetns.None(), unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return fmt.Errorf("could not open a netfilter netlink socket: %w", err)
	}
	defer sock.Close()
	req := &nl.NetlinkRequest{
		NlMsghdr: unix.NlMsghdr{
			Len:   uint32(unix.SizeofNlMsghdr),
			Type:  uint16(nfnlMsgAcctNew | unix.NFNL_SUBSYS_ACCT<<8),
			Flags: unix.NLM_F_REQUEST | unix.NLM_F_CREATE | unix.NLM_F_ACK,
		},
		Sockets: map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: sock}},
	}
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nfacctAttrName, nl.ZeroTerminated(name)))
	_, err = req.Execute(unix.NETLINK_NETFILTER, 0)
	// The kernel answers EBUSY for an existing object (without NLM_F_EXCL
	// or NLM_F_REPLACE): it is there, which is all we want.
	if err != nil && !errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("could not create nfacct counter %s: %w", name, err)
	}
	return nil
}
