package vm

import (
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// CPIOWriter writes a cpio archive in the "newc" format (magic 070701), the
// one the kernel unpacks as an initramfs (Documentation/driver-api/
// early-userspace/buffer-format.rst). Go's standard library has no cpio
// package; this writer covers what an initramfs needs: directories, regular
// files and symbolic links. The kernel does not create missing parent
// directories, so the writer emits them first, once each. Paths are
// absolute or relative; they are stored without the leading slash.
type CPIOWriter struct {
	w    io.Writer
	ino  uint32
	dirs map[string]bool
	seen map[string]bool
	err  error
}

// NewCPIOWriter starts an archive on w.
func NewCPIOWriter(w io.Writer) *CPIOWriter {
	return &CPIOWriter{w: w, ino: 1, dirs: map[string]bool{".": true, "": true}, seen: map[string]bool{}}
}

// Mode bits of cpio entries (the st_mode file types).
const (
	modeDir     = 0o040000
	modeRegular = 0o100000
	modeSymlink = 0o120000
)

// ErrDuplicate is returned when a path is written twice.
var ErrDuplicate = errors.New("path already in the archive")

func clean(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

// header writes one entry's header, name and padding.
func (c *CPIOWriter) header(name string, mode uint32, size int, nlink uint32) {
	if c.err != nil {
		return
	}
	c.ino++
	h := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	buf := make([]byte, 0, len(h)+len(name)+4)
	buf = append(buf, h...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = append(buf, make([]byte, pad4(len(buf)))...)
	_, c.err = c.w.Write(buf)
}

func pad4(n int) int { return (4 - n%4) % 4 }

func (c *CPIOWriter) body(data []byte) {
	if c.err != nil {
		return
	}
	if _, c.err = c.w.Write(data); c.err != nil {
		return
	}
	_, c.err = c.w.Write(make([]byte, pad4(len(data))))
}

// parents emits the missing parent directories of p.
func (c *CPIOWriter) parents(p string) {
	dir := path.Dir(p)
	if c.dirs[dir] {
		return
	}
	c.parents(dir)
	c.dirs[dir] = true
	c.seen[dir] = true
	c.header(dir, modeDir|0o755, 0, 2)
}

func (c *CPIOWriter) claim(p string) error {
	if c.seen[p] {
		return fmt.Errorf("could not add %s: %w", p, ErrDuplicate)
	}
	c.seen[p] = true
	return nil
}

// Dir adds a directory (and its parents).
func (c *CPIOWriter) Dir(p string, perm uint32) error {
	p = clean(p)
	if c.dirs[p] {
		return c.err
	}
	if err := c.claim(p); err != nil {
		return err
	}
	c.parents(p)
	c.dirs[p] = true
	c.header(p, modeDir|perm&0o7777, 0, 2)
	return c.err
}

// File adds a regular file with the given permission bits.
func (c *CPIOWriter) File(p string, perm uint32, data []byte) error {
	p = clean(p)
	if err := c.claim(p); err != nil {
		return err
	}
	c.parents(p)
	c.header(p, modeRegular|perm&0o7777, len(data), 1)
	c.body(data)
	return c.err
}

// Symlink adds a symbolic link to target.
func (c *CPIOWriter) Symlink(p, target string) error {
	p = clean(p)
	if err := c.claim(p); err != nil {
		return err
	}
	c.parents(p)
	c.header(p, modeSymlink|0o777, len(target), 1)
	c.body([]byte(target))
	return c.err
}

// Has reports whether a path was added.
func (c *CPIOWriter) Has(p string) bool { return c.seen[clean(p)] || c.dirs[clean(p)] }

// Close writes the trailer. It does not close the underlying writer.
func (c *CPIOWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 1)
	return c.err
}
