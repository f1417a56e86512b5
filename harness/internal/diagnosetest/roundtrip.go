// Package diagnosetest holds what tests of sim diagnose share: the round
// trip from a sim conform --dump folder to diagnose.Analyze and back to the
// run's verdict (harness/diagnose's tests on the committed dumps,
// harness/conform's on a fresh run). It is test support, not part of sim.
package diagnosetest

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/harness/diagnose"
)

// FaultFindings names, for each fault sim conform --fault injects, the
// findings of which one sim diagnose must report on the port of a check the
// fault made fail: the rule-level finding for the faults that write a wrong
// split, the API comparison for the ones that keep or lose endpoints, the
// traffic policy and the affinity timeout for theirs.
var FaultFindings = map[string][]string{
	"uniform-probability":   {diagnose.KindUnequalRules},
	"skew-at-mde":           {diagnose.KindUnequalRules},
	"drop-last-endpoint":    {diagnose.KindMissing},
	"keep-not-ready":        {diagnose.KindStale},
	"keep-deleted-endpoint": {diagnose.KindStale},
	"ignore-local-policy":   {diagnose.KindLocalIgnored, diagnose.KindLocalToRemote},
	"affinity-no-timeout":   {diagnose.KindAffinityForever, diagnose.KindAffinityTimeout},
}

// PassFindings are the findings a check of a type may meet on its port and
// still pass: the documented behaviour the check verified, which sim
// diagnose tells the user about all the same. An internal-traffic-local
// check from a node without a local endpoint passes when every connection
// is dropped; sim diagnose reports that node's pods reach nothing.
var PassFindings = map[string][]string{
	"internal-traffic-local": {diagnose.KindNoLocal},
}

// RoundTripResult is one dumped check's analysis against the run's verdict.
type RoundTripResult struct {
	Check  *diagnose.DumpedCheck
	Format diagnose.Format
	// Failed is the run's verdict: one of the check's verdicts failed.
	Failed bool
	// Findings are the analysis' findings (level finding) on the check's
	// port.
	Findings []*diagnose.Finding
	// Mismatch says how the analysis and the run disagree, "" when they
	// agree.
	Mismatch string
}

// RoundTrip analyses every dumped check of a sim conform --dump folder (the
// after dump, the before dump for the counter deltas, api.yaml, the node)
// and holds it against the run's verdict: a check that passed has no
// finding on its port; a check a fault made fail has one of the fault's
// FaultFindings there. Checks whose verdicts were errors or not run are
// left out. nftables dumps are analysed in both formats (text and JSON).
func RoundTrip(dir string) ([]RoundTripResult, error) {
	m, err := diagnose.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if len(m.Faults) > 1 {
		return nil, fmt.Errorf("%s: %d faults in one run: the round trip names one finding per fault", dir, len(m.Faults))
	}
	var out []RoundTripResult
	for _, dc := range m.Checks {
		failed, decided := false, true
		for _, v := range dc.Verdicts {
			switch v.Verdict {
			case "fail":
				failed = true
			case "pass":
			default:
				decided = false
			}
		}
		if !decided {
			continue
		}
		api, err := diagnose.LoadAPI(filepath.Join(dir, dc.Dir, dc.API))
		if err != nil {
			return nil, err
		}
		for _, f := range roundTripFormats(m.Mode) {
			after, err := ReadDumped(dir, dc, dc.After, f)
			if err != nil {
				return nil, err
			}
			before, err := ReadDumped(dir, dc, dc.Before, f)
			if err != nil {
				return nil, err
			}
			rep := diagnose.Analyze(after, diagnose.Options{Before: before, API: api, Node: dc.Node})
			r := RoundTripResult{Check: dc, Format: f, Failed: failed}
			vip, _ := netip.ParseAddr(dc.ClusterIP) // TestDumpManifests requires it
			key := diagnose.Key(vip, dc.Port, dc.Protocol)
			for _, fd := range rep.Findings {
				if fd.Level == diagnose.LevelFinding && (fd.Port == dc.ServicePort || fd.Port == key) {
					r.Findings = append(r.Findings, fd)
				}
			}
			r.Mismatch = judgeRoundTrip(m, r)
			out = append(out, r)
		}
	}
	return out, nil
}

func judgeRoundTrip(m *diagnose.Manifest, r RoundTripResult) string {
	var kinds []string
	for _, f := range r.Findings {
		kinds = append(kinds, f.Kind)
	}
	if !r.Failed {
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return slices.Contains(PassFindings[r.Check.Type], k) })
		if len(kinds) > 0 {
			return fmt.Sprintf("the run passed the check, sim diagnose reports %s", strings.Join(kinds, ", "))
		}
		return ""
	}
	if len(m.Faults) == 0 {
		return "the run failed the check on the correct dataplane (a false failure: the round trip has nothing to compare)"
	}
	want := FaultFindings[m.Faults[0]]
	if len(want) == 0 {
		return "no finding is named for fault " + m.Faults[0]
	}
	for _, k := range kinds {
		if slices.Contains(want, k) {
			return ""
		}
	}
	return fmt.Sprintf("the run caught %s, sim diagnose reports %v on the port, want one of %v", m.Faults[0], kinds, want)
}

// roundTripFormats are the formats a mode's dumps are analysed in.
func roundTripFormats(mode string) []diagnose.Format {
	switch mode {
	case "iptables":
		return []diagnose.Format{diagnose.FormatIPTablesSave}
	case "nftables":
		return []diagnose.Format{diagnose.FormatNFT, diagnose.FormatNFTJSON}
	case "ipvs":
		return []diagnose.Format{diagnose.FormatIPVSAdm}
	}
	return nil
}

// ReadDumped reads one of a check's dumps in format f. For ipvsadm the
// listing, the stats and the connection table are read as one input, as a
// user concatenates them and ReadIPVSAdm takes them (ipvsadm -Ln: the
// scheduler, weights and persistence; -Ln --stats --exact: the counts;
// -Lnc: the persistence templates).
func ReadDumped(dir string, dc *diagnose.DumpedCheck, files map[string]string, f diagnose.Format) (*diagnose.Dump, error) {
	names := []string{files[string(f)]}
	if f == diagnose.FormatIPVSAdm {
		names = []string{files["ipvsadm"], files["ipvsadm-stats"], files["ipvsadm-conns"]}
	}
	var data []byte
	for _, n := range names {
		if n == "" {
			return nil, fmt.Errorf("%s: no %s dump", dc.Dir, f)
		}
		b, err := os.ReadFile(filepath.Join(dir, dc.Dir, n))
		if err != nil {
			return nil, err
		}
		data = append(data, b...)
	}
	return diagnose.Read(f, filepath.Join(dir, dc.Dir, names[0]), data)
}
