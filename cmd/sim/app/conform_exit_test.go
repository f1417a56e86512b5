package app

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/harness/report"
)

// TestConformExit: a failed check exits 1 even with environment errors; an
// environment error alone exits 3 and names what was lost; a check not run
// alone exits 0.
func TestConformExit(t *testing.T) {
	failed := &report.Check{Name: "web @ node-a", Verdict: report.Fail}
	env := &report.Check{Name: "api @ node-a", Verdict: report.Error, ErrorKind: report.KindEnvironment, Message: "observation lost 12 probes on node-a"}
	skip := &report.Check{Name: "aff / expiry", Verdict: report.NotRun, Message: "timeout over 10 s"}
	pass := &report.Check{Name: "db @ node-a", Verdict: report.Pass}
	runOf := func(cs ...*report.Check) *report.Run {
		return &report.Run{Mode: "iptables", Suites: []*report.Suite{{Scenario: "s", Checks: cs}}}
	}
	for _, c := range []struct {
		name string
		run  *report.Run
		err  error
		code int
		msg  string
	}{
		{"failure wins", runOf(failed, env, skip, pass), nil, ExitCheckFailed, "web @ node-a"},
		{"environment", runOf(env, skip, pass), nil, ExitEnvironment, "observation lost 12 probes on node-a"},
		{"environment setup", &report.Run{Suites: []*report.Suite{{Scenario: "s", SetupError: "no ip command", SetupErrorKind: report.KindEnvironment}}}, nil, ExitEnvironment, "no ip command"},
		{"subject setup error is a failure", &report.Run{Suites: []*report.Suite{{Scenario: "s", SetupError: "first sync failed"}}}, nil, ExitCheckFailed, "s/setup"},
		{"not run is not a failure", runOf(skip, pass), nil, ExitOK, ""},
		{"interrupted", runOf(pass), context.Canceled, ExitCheckFailed, "canceled"},
	} {
		err := exitFor(c.run, c.err)
		if got := ExitCode(err); got != c.code {
			t.Errorf("%s: exit %d, want %d (%v)", c.name, got, c.code, err)
		}
		if c.msg != "" && (err == nil || !strings.Contains(err.Error(), c.msg)) {
			t.Errorf("%s: error %v lacks %q", c.name, err, c.msg)
		}
		if c.code == ExitOK && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if !errors.Is(exitFor(runOf(pass), context.Canceled), context.Canceled) {
		t.Error("an interrupted run must keep its error")
	}
}

func TestPrintRunCounts(t *testing.T) {
	var out bytes.Buffer
	printRun(Streams{Out: &out}, &report.Run{Mode: "iptables", Suites: []*report.Suite{{Scenario: "s", Checks: []*report.Check{
		{Name: "a", Verdict: report.Pass},
		{Name: "b", Verdict: report.NotRun, Message: "timeout over 10 s"},
		{Name: "c", Verdict: report.Error, ErrorKind: report.KindEnvironment, Message: "observation lost 12 probes on node-a"},
	}}}})
	for _, want := range []string{"SKIP  s / b", "not run: timeout over 10 s", "ENV   s / c", "2 verdicts ran, 1 not run, 0 failed, 1 environment errors",
		"This machine could not run or observe:", "s/c: observation lost 12 probes on node-a"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
