package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"strings"
	"testing"
	"time"
)

func sample() *Run {
	return &Run{Mode: "iptables", Subject: "kube-proxy", SubjectVersion: "v1.37.2", IPTablesBackend: "nft", Kernel: "6.18", Seed: 7, FamilyAlpha: 0.001, Duration: 3 * time.Second,
		Suites: []*Suite{
			{Scenario: "distribution", File: "d.yaml", Checks: []*Check{
				{Name: "distribution:demo/web:http@node-a", Type: "distribution", Verdict: Pass, Test: "chi-square", P: 0.4, N: 9000, Alpha: 0.0001},
				{Name: "distribution:demo/api@node-a", Type: "distribution", Verdict: Fail, Message: "p below alpha", Test: "chi-square", P: 1e-9, N: 9000,
					Table: []Row{{Outcome: "10.244.0.20:8443", Observed: 3000, Expected: 1800}, {Outcome: "10.244.0.21:8443", Observed: 0, Expected: 1800}}},
			}},
			{Scenario: "broken", File: "b.yaml", SetupError: "could not create namespace"},
		}}
}

func TestJUnit(t *testing.T) {
	var buf bytes.Buffer
	if err := sample().WriteJUnit(&buf); err != nil {
		t.Fatal(err)
	}
	var js junitSuites
	if err := xml.Unmarshal(buf.Bytes(), &js); err != nil {
		t.Fatalf("invalid XML: %v\n%s", err, buf.String())
	}
	if js.Tests != 3 || js.Failures != 1 || js.Errors != 1 || len(js.Suites) != 2 {
		t.Errorf("counts: tests %d failures %d errors %d suites %d", js.Tests, js.Failures, js.Errors, len(js.Suites))
	}
	if js.Suites[1].Cases[0].Name != "setup" || js.Suites[1].Cases[0].Error == nil {
		t.Error("a failed setup must still produce a testcase")
	}
	for _, want := range []string{`name="mode" value="iptables"`, `name="kernel"`, `name="iptablesBackend" value="nft"`, `name="seed" value="7"`,
		`name="subject" value="kube-proxy"`, `name="subjectVersion" value="v1.37.2"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("JUnit lacks %s", want)
		}
	}
}

func TestMarkdownAndJSON(t *testing.T) {
	r := sample()
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "**2 failed**") || !strings.Contains(md.String(), "10.244.0.21:8443") || !strings.Contains(md.String(), "Subject kube-proxy v1.37.2") {
		t.Errorf("markdown:\n%s", md.String())
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Run
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Suites[0].Checks[1].Table) != 2 || back.Subject != "kube-proxy" || back.SubjectVersion != "v1.37.2" {
		t.Errorf("json round trip: %v", err)
	}
	if f := r.Failed(); len(f) != 2 || f[0] != "distribution/distribution:demo/api@node-a" || f[1] != "broken/setup" {
		t.Errorf("failed = %v", f)
	}
}
