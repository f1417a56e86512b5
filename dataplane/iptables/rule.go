package iptables

// A parsed iptables rule: the subset of iptables' matches and targets that
// kube-proxy's layout (and our ipset option) uses. The fake refuses anything
// else, so a typo in the renderer fails a unit test instead of a kernel.

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// ErrBadRule is wrapped by errors about a rule the fake cannot parse.
var ErrBadRule = errors.New("bad rule")

// Standard targets, which need no chain of that name.
var builtinTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true,
	"DNAT": true, "SNAT": true, "MASQUERADE": true, "MARK": true, "SET": true,
}

// addrMatch is -s/-d, possibly negated.
type addrMatch struct {
	set    bool
	neg    bool
	prefix netip.Prefix
}

func (a addrMatch) match(ip netip.Addr) bool {
	if !a.set {
		return true
	}
	return a.prefix.Contains(ip) != a.neg
}

// Rule is one parsed rule.
type Rule struct {
	// Args are the rule's arguments after "-A CHAIN", tokenised.
	Args []string

	proto    string
	src, dst addrMatch
	dport    int
	dportNeg bool

	// statistic
	probSet bool
	prob    float64 // quantised as the kernel does
	// recent
	recentName    string
	recentCheck   bool // --rcheck
	recentSet     bool // --set
	recentSeconds int  // 0: no --seconds
	// set match
	matchSet string
	// nfacct match: counts, always matches
	nfacct string
	// cluster matches, in order (a rule may have several)
	clusters []clusterMatch
	// mark
	markSet        bool
	markNeg        bool
	markVal, markM uint32
	// addrtype
	srcLocal, dstLocal       int // 0 any, 1 LOCAL, -1 ! LOCAL
	ctSet, ctNeg             bool
	ctStates                 map[string]bool
	target                   string
	isGoto                   bool
	toDest                   netip.AddrPort
	toDestIP                 netip.Addr
	markOp                   string
	markArg                  uint32
	markArgMask              uint32 // --set-xmark's mask
	addSet                   string
	addTimeout               int // -1: none
	rejectWith, masqRandFull string
}

// Target is the rule's -j or -g target ("" for none).
func (r *Rule) Target() string { return r.target }

// QuantizedProbability is the kernel's probability for a --probability
// string: userspace stores lround(0x80000000*p) and the kernel matches
// (prandom_u32() & 0x7FFFFFFF) < that, so the probability is that over 2^31.
func QuantizedProbability(s string) (float64, error) {
	p, err := strconv.ParseFloat(s, 64)
	if err != nil || p < 0 || p > 1 {
		return 0, fmt.Errorf("%w: probability %q is not between 0 and 1", ErrBadRule, s)
	}
	return math.Round(0x80000000*p) / 0x80000000, nil
}

// ParseRule parses the arguments of a rule (after "-A CHAIN").
func ParseRule(args []string) (*Rule, error) {
	r := &Rule{Args: args, addTimeout: -1}
	modules := map[string]bool{}
	neg := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "!" {
			neg = true
			continue
		}
		wasNeg := neg
		neg = false
		val := ""
		if valueOptions[a] {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("%w: %s needs a value", ErrBadRule, a)
			}
			i++
			val = args[i]
		}
		switch a {
		case "--match-set":
			if !modules["set"] || i+1 >= len(args) || args[i+1] != "src" {
				return nil, fmt.Errorf("%w: --match-set needs -m set and the flag src", ErrBadRule)
			}
			r.matchSet = val
			i++
		case "-j", "--jump", "-g", "--goto":
			r.target = val
			r.isGoto = a == "-g" || a == "--goto"
			if err := r.parseTarget(args[i+1:]); err != nil {
				return nil, err
			}
			i = len(args)
		default:
			if err := r.parseOption(a, val, wasNeg, modules); err != nil {
				return nil, err
			}
		}
	}
	if err := r.checkModules(modules); err != nil {
		return nil, err
	}
	return r, nil
}

// valueOptions are the options ParseRule reads with a value.
var valueOptions = map[string]bool{
	"-p": true, "--protocol": true, "-s": true, "--source": true, "-d": true, "--destination": true,
	"-m": true, "--match": true, "-j": true, "--jump": true, "-g": true, "--goto": true,
	"--comment": true, "--nfacct-name": true, "--mode": true, "--probability": true, "--name": true, "--seconds": true,
	"--match-set": true, "--mark": true, "--dst-type": true, "--src-type": true,
	"--ctstate": true, "--dport": true, "--destination-port": true,
	"--cluster-total-nodes": true, "--cluster-local-node": true, "--cluster-hash-seed": true,
	"--mask": true,
}

// parseOption reads one match option a (with its value val, negated by a
// preceding "!" when neg) into r; modules are the -m matches loaded so far.
func (r *Rule) parseOption(a, val string, neg bool, modules map[string]bool) error {
	switch a {
	case "-p", "--protocol":
		r.proto = strings.ToLower(val)
	case "-s", "--source", "-d", "--destination":
		p, err := parsePrefix(val)
		if err != nil {
			return err
		}
		m := addrMatch{set: true, neg: neg, prefix: p}
		if a == "-s" || a == "--source" {
			r.src = m
		} else {
			r.dst = m
		}
	case "-m", "--match":
		switch val {
		case "tcp", "udp", "sctp", "comment", "statistic", "recent", "set", "mark", "addrtype", "conntrack", "cluster", "nfacct":
			modules[val] = true
			if val == "cluster" {
				r.clusters = append(r.clusters, clusterMatch{})
			}
		default:
			return fmt.Errorf("%w: match %q is not modelled", ErrBadRule, val)
		}
	case "--comment":
		if !modules["comment"] {
			return fmt.Errorf("%w: --comment without -m comment", ErrBadRule)
		}
	case "--nfacct-name":
		if !modules["nfacct"] || val == "" {
			return fmt.Errorf("%w: --nfacct-name needs -m nfacct and a name", ErrBadRule)
		}
		r.nfacct = val
	case "--mode", "--probability":
		return r.parseStatistic(a, val, modules)
	case "--name", "--rcheck", "--set", "--reap", "--seconds", "--mask", "--rsource":
		return r.parseRecent(a, val, modules)
	case "--mark":
		if !modules["mark"] {
			return fmt.Errorf("%w: --mark without -m mark", ErrBadRule)
		}
		v, m, err := parseMark(val)
		if err != nil {
			return err
		}
		r.markSet, r.markNeg, r.markVal, r.markM = true, neg, v, m
	case "--dst-type", "--src-type", "--ctstate", "--dport", "--destination-port":
		return r.parseStateMatch(a, val, neg, modules)
	case "--cluster-total-nodes", "--cluster-local-node", "--cluster-hash-seed":
		return r.parseCluster(a, val, neg)
	default:
		return fmt.Errorf("%w: option %q is not modelled", ErrBadRule, a)
	}
	return nil
}

// parseStatistic reads the statistic match's --mode and --probability.
func (r *Rule) parseStatistic(a, val string, modules map[string]bool) error {
	if a == "--mode" {
		if !modules["statistic"] || val != "random" {
			return fmt.Errorf("%w: --mode %s needs -m statistic and mode random", ErrBadRule, val)
		}
		return nil
	}
	if !modules["statistic"] {
		return fmt.Errorf("%w: --probability without -m statistic", ErrBadRule)
	}
	q, err := QuantizedProbability(val)
	if err != nil {
		return err
	}
	r.probSet, r.prob = true, q
	return nil
}

// parseRecent reads the recent match's options.
func (r *Rule) parseRecent(a, val string, modules map[string]bool) error {
	if !modules["recent"] {
		return fmt.Errorf("%w: %s without -m recent", ErrBadRule, a)
	}
	switch a {
	case "--name":
		r.recentName = val
	case "--rcheck", "--set", "--reap":
		r.recentCheck = r.recentCheck || a == "--rcheck"
		r.recentSet = r.recentSet || a == "--set"
		if a == "--reap" && r.recentSeconds == 0 {
			// libxt_recent: "--reap is only valid with --seconds"
			// (checked once all options are read, in checkModules).
			r.recentSeconds = -1
		}
	case "--seconds":
		n, err := strconv.Atoi(val)
		if err != nil || n <= 0 {
			return fmt.Errorf("%w: --seconds %q", ErrBadRule, val)
		}
		r.recentSeconds = n
	case "--mask":
		// iptables-save prints the default --mask 255.255.255.255 and
		// --rsource with every recent match: a list keyed by the whole
		// source address, as kube-proxy means it.
		if val != "255.255.255.255" {
			return fmt.Errorf("%w: recent --mask %q (only 255.255.255.255 is modelled)", ErrBadRule, val)
		}
	}
	return nil
}

// parseStateMatch reads the addrtype, conntrack and tcp/udp port options.
func (r *Rule) parseStateMatch(a, val string, neg bool, modules map[string]bool) error {
	switch a {
	case "--dst-type", "--src-type":
		if !modules["addrtype"] || val != "LOCAL" {
			return fmt.Errorf("%w: %s %s needs -m addrtype and type LOCAL", ErrBadRule, a, val)
		}
		t := 1
		if neg {
			t = -1
		}
		if a == "--dst-type" {
			r.dstLocal = t
		} else {
			r.srcLocal = t
		}
	case "--ctstate":
		if !modules["conntrack"] {
			return fmt.Errorf("%w: --ctstate without -m conntrack", ErrBadRule)
		}
		r.ctSet, r.ctNeg, r.ctStates = true, neg, map[string]bool{}
		for _, s := range strings.Split(val, ",") {
			r.ctStates[s] = true
		}
	default: // --dport, --destination-port
		if !modules["tcp"] && !modules["udp"] && !modules["sctp"] && r.proto != "tcp" && r.proto != "udp" && r.proto != "sctp" {
			return fmt.Errorf("%w: --dport without -p tcp, udp or sctp", ErrBadRule)
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w: --dport %q", ErrBadRule, val)
		}
		r.dport, r.dportNeg = n, neg
	}
	return nil
}

// checkModules applies the matches' final checks, as their libxt
// extensions do once the whole rule is read.
func (r *Rule) checkModules(modules map[string]bool) error {
	if r.recentSeconds < 0 {
		return fmt.Errorf("%w: recent: --reap is only valid with --seconds", ErrBadRule)
	}
	if modules["recent"] && (r.recentName == "" || r.recentCheck == r.recentSet) {
		return fmt.Errorf("%w: -m recent needs --name and one of --rcheck or --set", ErrBadRule)
	}
	if modules["nfacct"] && r.nfacct == "" {
		return fmt.Errorf("%w: -m nfacct needs --nfacct-name", ErrBadRule)
	}
	if err := r.checkClusters(); err != nil {
		return err
	}
	if r.proto != "" && (modules["tcp"] && r.proto != "tcp" || modules["udp"] && r.proto != "udp" || modules["sctp"] && r.proto != "sctp") {
		return fmt.Errorf("%w: -m tcp/udp/sctp does not match -p %s", ErrBadRule, r.proto)
	}
	return nil
}

// clusterMatch is one cluster match (xt_cluster): the connection's original
// source address hashed with jhash and seed into total buckets is in bucket
// node-1 (negated with neg).
type clusterMatch struct {
	total, node int
	seed        uint32
	neg         bool
}

// checkClusters applies libxt_cluster's final check to each cluster match:
// both numbers are required, and the node is within the total.
func (r *Rule) checkClusters() error {
	for _, c := range r.clusters {
		if c.total == 0 || c.node == 0 || c.node > c.total {
			return fmt.Errorf("%w: -m cluster needs --cluster-total-nodes and a --cluster-local-node within it", ErrBadRule)
		}
	}
	return nil
}

// parseCluster reads one option of the last cluster match (at most 32
// nodes).
func (r *Rule) parseCluster(opt, val string, neg bool) error {
	if len(r.clusters) == 0 {
		return fmt.Errorf("%w: %s without -m cluster", ErrBadRule, opt)
	}
	c := &r.clusters[len(r.clusters)-1]
	n, err := strconv.ParseUint(val, 0, 32)
	if err != nil {
		return fmt.Errorf("%w: %s %q", ErrBadRule, opt, val)
	}
	switch opt {
	case "--cluster-total-nodes":
		if n < 1 || n > 32 {
			return fmt.Errorf("%w: --cluster-total-nodes %d is outside 1..32", ErrBadRule, n)
		}
		c.total = int(n)
	case "--cluster-local-node":
		if n < 1 {
			return fmt.Errorf("%w: --cluster-local-node %d", ErrBadRule, n)
		}
		c.node, c.neg = int(n), neg
	case "--cluster-hash-seed":
		c.seed = uint32(n)
	}
	return nil
}

// parseTarget reads the target's options.
func (r *Rule) parseTarget(opts []string) error {
	next := func(i int) (string, error) {
		if i+1 >= len(opts) {
			return "", fmt.Errorf("%w: %s %s needs a value", ErrBadRule, r.target, opts[i])
		}
		return opts[i+1], nil
	}
	if !builtinTargets[r.target] {
		if len(opts) > 0 {
			return fmt.Errorf("%w: a jump to chain %s takes no options", ErrBadRule, r.target)
		}
		return nil
	}
	for i := 0; i < len(opts); i++ {
		o := opts[i]
		switch {
		case r.target == "DNAT" && o == "--to-destination":
			v, err := next(i)
			if err != nil {
				return err
			}
			i++
			if ap, err := netip.ParseAddrPort(v); err == nil {
				r.toDest = ap
			} else if ip, err := netip.ParseAddr(v); err == nil {
				r.toDestIP = ip
			} else {
				return fmt.Errorf("%w: DNAT --to-destination %q", ErrBadRule, v)
			}
		case r.target == "MASQUERADE" && o == "--random-fully":
			r.masqRandFull = o
		case r.target == "REJECT" && o == "--reject-with":
			v, err := next(i)
			if err != nil {
				return err
			}
			r.rejectWith = v
			i++
		case r.target == "MARK" && (o == "--or-mark" || o == "--xor-mark" || o == "--and-mark" || o == "--set-mark"):
			v, err := next(i)
			if err != nil {
				return err
			}
			m, err := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 32)
			if err != nil || !strings.HasPrefix(v, "0x") {
				return fmt.Errorf("%w: MARK %s %q is not a hexadecimal mark", ErrBadRule, o, v)
			}
			r.markOp, r.markArg = o, uint32(m)
			i++
		case r.target == "MARK" && o == "--set-xmark":
			// iptables-save prints every MARK operation this way:
			// --or-mark M as M/M, --xor-mark M as M/0x0.
			v, err := next(i)
			if err != nil {
				return err
			}
			val, mask, err := parseMark(v)
			if err != nil || !strings.HasPrefix(v, "0x") {
				return fmt.Errorf("%w: MARK --set-xmark %q is not a hexadecimal value/mask", ErrBadRule, v)
			}
			r.markOp, r.markArg, r.markArgMask = o, val, mask
			i++
		case r.target == "SET" && o == "--add-set":
			v, err := next(i)
			if err != nil {
				return err
			}
			if i+2 >= len(opts) || opts[i+2] != "src" {
				return fmt.Errorf("%w: SET --add-set needs the flag src", ErrBadRule)
			}
			r.addSet = v
			i += 2
		case r.target == "SET" && o == "--exist":
		case r.target == "SET" && o == "--timeout":
			v, err := next(i)
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("%w: SET --timeout %q", ErrBadRule, v)
			}
			r.addTimeout = n
			i++
		default:
			return fmt.Errorf("%w: target %s option %q is not modelled", ErrBadRule, r.target, o)
		}
	}
	switch {
	case r.target == "DNAT" && !r.toDest.IsValid() && !r.toDestIP.IsValid():
		return fmt.Errorf("%w: DNAT needs --to-destination", ErrBadRule)
	case r.target == "MARK" && r.markOp == "":
		return fmt.Errorf("%w: MARK needs a mark operation", ErrBadRule)
	case r.target == "SET" && r.addSet == "":
		return fmt.Errorf("%w: SET needs --add-set", ErrBadRule)
	}
	return nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%w: %q is not an address or prefix", ErrBadRule, s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parseMark(s string) (val, mask uint32, err error) {
	v, m, hasMask := strings.Cut(s, "/")
	pv, err1 := strconv.ParseUint(v, 0, 32)
	pm := uint64(0xffffffff)
	var err2 error
	if hasMask {
		pm, err2 = strconv.ParseUint(m, 0, 32)
	}
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%w: mark %q", ErrBadRule, s)
	}
	return uint32(pv), uint32(pm), nil
}
