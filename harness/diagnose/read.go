package diagnose

import (
	"bytes"
	"errors"
	"io/fs"
	"os"

	"github.com/kpsim/kpsim/sim/scenario"
)

// ReadFile reads one dump in format f. An unreadable file is bad input
// (scenario.ErrorList naming the file), as is a malformed line.
func ReadFile(f Format, path string) (*Dump, error) {
	data, err := readInput(path, "dump")
	if err != nil {
		return nil, err
	}
	return Read(f, path, data)
}

// readInput reads an input file; failing that, a scenario.ErrorList
// naming it (what: "dump", "conntrack table").
func readInput(path, what string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := "could not read the " + what
		switch {
		case errors.Is(err, fs.ErrNotExist):
			msg = "no such " + what + " file"
		case errors.Is(err, fs.ErrPermission):
			msg = "permission denied reading the " + what
		}
		return nil, scenario.ErrorList{{File: path, Message: msg}}
	}
	return data, nil
}

// Read parses data in format f; FormatNFT also takes nft -j output (its
// first non-space byte is '{').
func Read(f Format, file string, data []byte) (*Dump, error) {
	switch f {
	case FormatIPTablesSave:
		return ReadIPTablesSave(file, data)
	case FormatNFT, FormatNFTJSON:
		if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
			return ReadNFTJSON(file, data)
		}
		return ReadNFT(file, data)
	case FormatIPVSAdm:
		return ReadIPVSAdm(file, data)
	}
	return nil, scenario.ErrorList{{File: file, Message: "unknown dump format " + string(f)}}
}
