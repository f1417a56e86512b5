package vm

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// libDirs are where a Debian amd64 system keeps shared libraries, in the
// dynamic loader's search order (no ld.so.cache is copied into the VM, so
// the libraries go to these same paths there).
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib"}

// Interpreter returns the ELF program interpreter of a file ("" for a
// statically linked one).
func Interpreter(file string) (string, error) {
	f, err := elf.Open(file)
	if err != nil {
		return "", fmt.Errorf("could not read %s as ELF: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", fmt.Errorf("could not read the interpreter of %s: %w", file, err)
			}
			return string(b[:len(b)-1]), nil // NUL-terminated
		}
	}
	return "", nil
}

// IsStatic reports whether an ELF executable has no interpreter.
func IsStatic(file string) (bool, error) {
	in, err := Interpreter(file)
	return in == "", err
}

// SharedDeps returns every file an ELF binary needs at run time, beside
// itself: its interpreter and its DT_NEEDED libraries, recursively, each as
// the path the loader will open (found in libDirs). Sorted.
func SharedDeps(files ...string) ([]string, error) {
	need := map[string]bool{}
	var visit func(file string) error
	visit = func(file string) error {
		f, err := elf.Open(file)
		if err != nil {
			return fmt.Errorf("could not read %s as ELF: %w", file, err)
		}
		defer f.Close()
		in, _ := Interpreter(file)
		if in != "" && !need[in] {
			need[in] = true
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("could not read the libraries %s needs: %w", file, err)
		}
		for _, l := range libs {
			p, err := findLib(l)
			if err != nil {
				return fmt.Errorf("%s needs %s: %w", file, l, err)
			}
			if need[p] {
				continue
			}
			need[p] = true
			if err := visit(p); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range files {
		if err := visit(f); err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(need))
	for p := range need {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}

func findLib(name string) (string, error) {
	if filepath.IsAbs(name) {
		return name, nil
	}
	for _, d := range libDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("not found in " + fmt.Sprint(libDirs))
}
