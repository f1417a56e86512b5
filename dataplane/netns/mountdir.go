package netns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ensureNetnsDir makes NetnsDir a shared mount point, as `ip netns add`
// does (iproute2 ip/ipnetns.c, netns_add): when NetnsDir is a plain
// directory, ip bind-mounts it on itself first. If it did so after a run of
// ours had mounted namespaces in the plain directory, those mounts would be
// hidden under its bind mount, where neither our teardown nor `sim cleanup`
// could reach them (umount: not mounted; unlink: EBUSY). Making the mount
// point ourselves, before the first namespace, means a later ip netns add
// finds one and only marks it shared. Among our own processes a lock
// (LockFile) keeps two runs from both binding it.
func ensureNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("could not create %s: %w", NetnsDir, err)
	}
	if err := os.MkdirAll(MarkerDir, 0o755); err != nil {
		return fmt.Errorf("could not create %s: %w", MarkerDir, err)
	}
	lock, err := os.OpenFile(filepath.Join(MarkerDir, "netns-dir.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("could not open the lock for %s: %w", NetnsDir, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("could not lock %s: %w", NetnsDir, err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: bind it on itself, then share it.
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("could not bind-mount %s on itself: %w", NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("could not make %s a shared mount point: %w", NetnsDir, err)
	}
	return nil
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	ID, Parent int
	Point      string
	FSType     string
}

func readMountInfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("could not read the mount table: %w", err)
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// 42 27 0:4 net:[4026532177] /run/netns/x rw - nsfs nsfs rw
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 {
			continue
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			continue
		}
		fs := ""
		if pf := strings.Fields(post); len(pf) > 0 {
			fs = pf[0]
		}
		out = append(out, mountEntry{ID: id, Parent: parent, Point: unescapeMount(f[4]), FSType: fs})
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hiddenNamespaces returns the nsfs mounts at NetnsDir/name that lie under
// a later mount of NetnsDir itself (made by ip netns add after they were
// mounted), and that covering mount's ID.
func hiddenNamespaces(mounts []mountEntry) (names []string, cover int) {
	for _, m := range mounts {
		if m.Point == NetnsDir {
			cover = m.ID
		}
	}
	if cover == 0 {
		return nil, 0
	}
	var parentOfDir int
	for _, m := range mounts {
		if m.ID == cover {
			parentOfDir = m.Parent
		}
	}
	for _, m := range mounts {
		if m.FSType == "nsfs" && m.Parent == parentOfDir && filepath.Dir(m.Point) == NetnsDir {
			names = append(names, filepath.Base(m.Point))
		}
	}
	return names, cover
}

// uncoverNetnsDir makes hidden namespaces reachable again: when the mount
// of NetnsDir that hides them holds nothing itself (no namespace was
// mounted in it since), it is unmounted, which changes no namespace, and
// made again after the hidden ones are removed (by the caller). With
// namespaces in it, another run's or a user's, it is left alone and the
// error says what to do.
func uncoverNetnsDir(mounts []mountEntry, cover int) error {
	var inUse []string
	for _, m := range mounts {
		if m.Parent == cover {
			inUse = append(inUse, filepath.Base(m.Point))
		}
	}
	if len(inUse) > 0 {
		return fmt.Errorf("the namespace is hidden under a later mount of %s (ip netns add makes one), which holds other namespaces (%s): remove those, or unmount %s, then run sim cleanup again",
			NetnsDir, strings.Join(inUse, ", "), NetnsDir)
	}
	if err := unix.Unmount(NetnsDir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("could not unmount the mount of %s that hides namespaces: %w", NetnsDir, err)
	}
	return nil
}
