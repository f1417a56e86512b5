package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestUsage: a bad command line is a usage error (exit status 2) that says
// what is wrong, before any socket is opened.
func TestUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{nil, "the first argument is the mode, echo or probe"},
		{[]string{"serve"}, "the first argument is the mode, echo or probe"},
		{[]string{"echo"}, `--ports: no port in ""`},
		{[]string{"echo", "--ports", "tcp:x"}, `--ports: port "tcp:x": "x" is not a port number`},
		{[]string{"echo", "--ports", "tcp:80", "extra"}, `unexpected argument "extra"`},
		{[]string{"probe", "--ports", "tcp:80"}, "flag provided but not defined: -ports"},
	} {
		var log bytes.Buffer
		err := Run(t.Context(), c.args, &log)
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: %v, want a usage error saying %q", c.args, err, c.msg)
		}
	}
}
