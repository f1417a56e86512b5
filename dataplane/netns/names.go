package netns

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
)

// Prefix starts the name of every network namespace this package creates and
// the alternative name of every link. A run's names start with
// RunPrefix(runID), "kpsim-<runid>-".
const Prefix = "kpsim-"

// RunIDLen is the length of a run ID: lower-case hex characters.
const RunIDLen = 6

// Namespace roles, the part of a namespace name after the node label.
const (
	fabricSuffix       = "_fabric"
	controlPlaneSuffix = "_cp"
	backendSuffix      = "_be"
	clientInfix        = "_c-"
	routerSuffix       = "_router"
	outsideInfix       = "_x-"
)

// maxLabel bounds a node or client label inside names: a netns name is a
// file name (255 bytes) and an alternative link name is at most 127 bytes
// (ALTIFNAMSIZ 128), so labels longer than this are shortened with a hash.
const maxLabel = 40

// maxLinkIndex bounds the number in a link name ("kp<runid>f123456" is the
// longest that fits IFNAMSIZ, 15 characters).
const maxLinkIndex = 999999

var runIDRe = regexp.MustCompile(`^[0-9a-f]{6}$`)

// NewRunID returns a fresh random run ID: 6 lower-case hex characters.
func NewRunID() (string, error) {
	var b [RunIDLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("could not draw a run id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ValidRunID reports whether id is a run ID: 6 lower-case hex characters.
func ValidRunID(id string) bool { return runIDRe.MatchString(id) }

// RunPrefix is the prefix of every name of run id: "kpsim-<id>-".
func RunPrefix(id string) string { return Prefix + id + "-" }

// ParseName splits a name made by this package, "kpsim-<runid>-<rest>", into
// its run ID and the rest. ok is false for any other name.
func ParseName(name string) (runID, rest string, ok bool) {
	s, found := strings.CutPrefix(name, Prefix)
	if !found || len(s) < RunIDLen+2 || s[RunIDLen] != '-' {
		return "", "", false
	}
	if !ValidRunID(s[:RunIDLen]) {
		return "", "", false
	}
	return s[:RunIDLen], s[RunIDLen+1:], true
}

// ValidCleanupPrefix reports whether prefix may select names to remove: it
// must be Prefix itself or start with a whole run prefix ("kpsim-<runid>-"),
// so that a typo can never select names that are not ours.
func ValidCleanupPrefix(prefix string) bool {
	if prefix == Prefix {
		return true
	}
	id, _, ok := ParseName(prefix + "x")
	return ok && strings.HasPrefix(prefix, RunPrefix(id))
}

// MatchPrefix reports whether name is one of ours (ParseName succeeds) and
// starts with prefix, and returns its run ID.
func MatchPrefix(name, prefix string) (runID string, ok bool) {
	id, _, ok := ParseName(name)
	if !ok || !strings.HasPrefix(name, prefix) {
		return "", false
	}
	return id, true
}

// Label turns a node or client name into the label used inside namespace
// and link names: lower case, characters other than [a-z0-9.-] replaced by
// '-', and names longer than 40 characters (or changed by the replacement)
// shortened to 31 characters plus '-' and an 8-hex-digit FNV-1a hash of the
// original, so that distinct names keep distinct labels. '_' never occurs in
// a label, which keeps the role suffixes ("_be", "_c-", "_fabric")
// unambiguous.
func Label(name string) string {
	var b strings.Builder
	changed := false
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
			changed = true
		}
	}
	s := b.String()
	if s == "" || s == "." || s == ".." {
		changed = true
	}
	if !changed && len(s) <= maxLabel {
		return s
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	if len(s) > maxLabel-9 {
		s = s[:maxLabel-9]
	}
	return fmt.Sprintf("%s-%08x", s, h.Sum32())
}

// FabricName is the name of run id's fabric namespace, which holds the bridge
// that connects the nodes.
func FabricName(id string) string { return RunPrefix(id) + fabricSuffix }

// ControlPlaneName is the name of run id's control-plane namespace, where
// etcd and kube-apiserver run (Config.ControlPlane).
func ControlPlaneName(id string) string { return RunPrefix(id) + controlPlaneSuffix }

// NodeName is the name of the namespace of node (a Kubernetes node name).
func NodeName(id, node string) string { return RunPrefix(id) + Label(node) }

// BackendName is the name of the namespace that holds every endpoint address
// of node.
func BackendName(id, node string) string { return NodeName(id, node) + backendSuffix }

// ClientName is the name of the namespace of client pod index (0-based) of
// client group on node.
func ClientName(id, node, group string, index int) string {
	return NodeName(id, node) + clientInfix + Label(group) + "-" + strconv.Itoa(index)
}

// RouterName is the name of run id's router: the edge between the fabric
// and the world outside the cluster (Config.Outside).
func RouterName(id string) string { return RunPrefix(id) + routerSuffix }

// OutsideName is the name of the namespace of outside client index
// (0-based) of client group: a machine outside the cluster, behind the
// router.
func OutsideName(id, group string, index int) string {
	return RunPrefix(id) + outsideInfix + Label(group) + "-" + strconv.Itoa(index)
}

// Role is what a namespace of a run is for.
type Role string

// Roles of namespaces.
const (
	RoleFabric       Role = "fabric"
	RoleControlPlane Role = "controlplane"
	RoleNode         Role = "node"
	RoleBackend      Role = "backend"
	RoleClient       Role = "client"
	RoleRouter       Role = "router"
	RoleOutside      Role = "outside"
)

// RoleOf tells the role of a namespace name made by this package, from its
// suffix. It returns "" for names that are not ours.
func RoleOf(name string) Role {
	_, rest, ok := ParseName(name)
	switch {
	case !ok:
		return ""
	case rest == fabricSuffix:
		return RoleFabric
	case rest == controlPlaneSuffix:
		return RoleControlPlane
	case rest == routerSuffix:
		return RoleRouter
	case strings.HasPrefix(rest, outsideInfix):
		return RoleOutside
	case strings.HasSuffix(rest, backendSuffix):
		return RoleBackend
	case strings.Contains(rest, clientInfix):
		return RoleClient
	}
	return RoleNode
}

// Link names. IFNAMSIZ leaves 15 characters, too few for "kpsim-<runid>-"
// and a role, so a link's own name is "kp<runid>" plus a short role, and
// its alternative name (`ip link property add altname`, up to 127 characters)
// carries the full run prefix. Names need only be unique inside a namespace.

// LinkTag starts the own name of every link of run id: "kp<runid>".
func LinkTag(id string) string { return "kp" + id }

func bridgeLink(id string) string            { return LinkTag(id) + "br" }
func fabricPortLink(id string, i int) string { return LinkTag(id) + "f" + strconv.Itoa(i) }
func uplinkLink(id string) string            { return LinkTag(id) + "eth0" }
func backendPortLink(id string) string       { return LinkTag(id) + "be" }
func clientPortLink(id string, j int) string { return LinkTag(id) + "c" + strconv.Itoa(j) }
func podLink(id string) string               { return LinkTag(id) + "eth0" }
func outsidePortLink(id string, j int) string {
	return LinkTag(id) + "x" + strconv.Itoa(j)
}

var linkRe = regexp.MustCompile(`^kp([0-9a-f]{6})(eth0|br|be|f[0-9]{1,6}|c[0-9]{1,6}|x[0-9]{1,6})$`)

// MatchLink reports whether a link (its own name and alternative names) is
// one of ours selected by prefix (a valid cleanup prefix): its name or an
// alternative name starts with prefix, or its name is one of our short link
// names ("kp<runid><role>") of a run that prefix selects.
func MatchLink(name string, altNames []string, prefix string) (runID string, ok bool) {
	for _, n := range append([]string{name}, altNames...) {
		if id, ok := MatchPrefix(n, prefix); ok {
			return id, true
		}
	}
	m := linkRe.FindStringSubmatch(name)
	if m == nil {
		return "", false
	}
	if prefix != Prefix && prefix != RunPrefix(m[1]) {
		// A prefix longer than a run prefix selects namespaces by their
		// node label; short link names carry none.
		return "", false
	}
	return m[1], true
}
