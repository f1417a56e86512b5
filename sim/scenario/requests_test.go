package scenario

import (
	"os"
	"testing"
	"time"
)

// TestRequestDefaults: a client with requests and a pool gets the
// documented defaults (round-robin, a fixed zero duration, Pareto's and
// the lognormal's shapes), and a scenario whose every client gives
// requests needs neither connections nor a rate.
func TestRequestDefaults(t *testing.T) {
	base, err := os.ReadFile("testdata/valid-base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data := string(base) + `traffic:
  clients:
    - name: pooled
      pool: {size: 4, maxAge: 30s}
      requests: {rate: 10}
    - name: pareto
      requests: {rate: 10, duration: {kind: pareto, mean: 20ms}}
    - name: lognormal
      pool: {size: 1}
      requests: {rate: 10, duration: {kind: lognormal, mean: 20ms}}
`
	l, err := Load("requests.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	cs := l.Scenario.Traffic.Clients
	p := cs[0].Pool
	if p.Pick != PickRoundRobin || p.MaxAge.Duration != 30*time.Second || p.Size != 4 {
		t.Errorf("pool %+v, want size 4, maxAge 30s, pick %s", p, PickRoundRobin)
	}
	if d := cs[0].Requests.Duration; d == nil || d.Kind != "fixed" || d.Mean.Duration != 0 {
		t.Errorf("default duration %+v, want fixed 0", d)
	}
	if d := cs[1].Requests.Duration; d.Alpha != DefaultParetoAlpha || d.Sigma != 0 || cs[1].Pool != nil {
		t.Errorf("pareto %+v, want alpha %g and no pool", d, DefaultParetoAlpha)
	}
	if d := cs[2].Requests.Duration; d.Sigma != DefaultLognormalSigma || d.Alpha != 0 {
		t.Errorf("lognormal %+v, want sigma %g", d, DefaultLognormalSigma)
	}
	if _, err := Expand(l, nil); err != nil {
		t.Fatal(err)
	}
}
