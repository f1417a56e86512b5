package capacity

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
)

// SLO metrics (--slo NAME=LIMIT).
const (
	// SLOProgrammingLatency holds the p99 network programming latency to a
	// duration.
	SLOProgrammingLatency = "programming-latency"
	// SLOFullSync holds a full sync's time to a duration.
	SLOFullSync = "full-sync"
	// SLOFirstPacketRules holds the p99 rules a first packet walks to a
	// count.
	SLOFirstPacketRules = "first-packet-rules"
)

// SLO is one objective: a metric at or under a limit (seconds, or rules).
type SLO struct {
	Metric string  `json:"metric"`
	Limit  float64 `json:"limit"`
	Text   string  `json:"text"`
}

// ParseSLO reads "programming-latency=1s", "full-sync=30s" or
// "first-packet-rules=500".
func ParseSLO(s string) (SLO, error) {
	name, val, ok := strings.Cut(s, "=")
	if !ok || val == "" {
		return SLO{}, fmt.Errorf("--slo %q: want METRIC=LIMIT (%s=DURATION, %s=DURATION or %s=N)", s, SLOProgrammingLatency, SLOFullSync, SLOFirstPacketRules)
	}
	slo := SLO{Metric: name, Text: s}
	switch name {
	case SLOProgrammingLatency, SLOFullSync:
		d, err := time.ParseDuration(val)
		if err != nil || d <= 0 {
			return SLO{}, fmt.Errorf("--slo %q: %s wants a positive duration such as 1s or 500ms", s, name)
		}
		slo.Limit = d.Seconds()
	case SLOFirstPacketRules:
		n, err := strconv.Atoi(val)
		if err != nil || n <= 0 {
			return SLO{}, fmt.Errorf("--slo %q: %s wants a positive whole number of rules", s, name)
		}
		slo.Limit = float64(n)
	default:
		return SLO{}, fmt.Errorf("--slo %q: unknown metric %q (want %s, %s or %s)", s, name, SLOProgrammingLatency, SLOFullSync, SLOFirstPacketRules)
	}
	return slo, nil
}

// ParseSizes reads "1000,2000,5000": positive Service counts, sorted and
// without duplicates on return.
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--sizes %q: %q is not a positive Service count", s, f)
		}
		if n > MaxServices {
			return nil, fmt.Errorf("--sizes %q: %d is more than the %d Services the sweep generates", s, n, MaxServices)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// MaxServices bounds a size: a Service CIDR the sweep widens to (a /12)
// holds about a million cluster IPs, and memory grows with the state.
const MaxServices = 200000

// Answer is the largest size that meets an SLO in one variant.
type Answer struct {
	SLO     string       `json:"slo"`
	Mode    cluster.Mode `json:"mode"`
	Variant string       `json:"variant"`
	// Largest is the largest size of the ladder that meets the SLO; 0 when
	// none does.
	Largest int `json:"largestServices"`
	// Value is the metric at Largest (or at the smallest size when none
	// meets it).
	Value float64 `json:"value"`
	// Extrapolated is set when the answer rests on an extrapolated
	// figure: the one at Largest, or the one at the next size that fails.
	Extrapolated bool `json:"extrapolated"`
	// AllMeet says every size of the ladder meets it: the true limit lies
	// beyond the ladder.
	AllMeet bool   `json:"allMeet"`
	Text    string `json:"text"`
}

// metric is an SLO's figure in a row and whether it is extrapolated; ok is
// false when the row has no such figure.
func metric(slo SLO, r *Row) (v float64, extrapolated, ok bool) {
	switch slo.Metric {
	case SLOProgrammingLatency:
		if r.Latency == nil {
			return 0, false, false
		}
		return r.Latency.P99, r.Latency.Extrapolated, true
	case SLOFullSync:
		return r.FullSync.Seconds, r.FullSync.Extrapolated, true
	case SLOFirstPacketRules:
		return r.FirstPacket.RulesP99, false, true
	}
	return 0, false, false
}

// answer finds, for each SLO and variant, the largest size that meets it.
func answer(res *Result, slos []SLO) []Answer {
	var out []Answer
	for _, slo := range slos {
		for vi, m := range res.Models {
			a := Answer{SLO: slo.Text, Mode: m.Mode, Variant: m.Variant.Variant}
			have, allMeet := false, true
			firstFail := -1
			for si := range res.Sizes {
				r := &res.Sizes[si].Rows[vi]
				v, ex, ok := metric(slo, r)
				if !ok {
					continue
				}
				if !have {
					a.Value = v
				}
				have = true
				if v <= slo.Limit {
					a.Largest, a.Value, a.Extrapolated = res.Sizes[si].Services, v, ex
					firstFail = -1
				} else {
					allMeet = false
					if firstFail < 0 {
						firstFail = si
					}
				}
			}
			if !have {
				a.Text = "no figure (the scenario has no events to give a rate)"
				out = append(out, a)
				continue
			}
			if firstFail >= 0 {
				if _, ex, _ := metric(slo, &res.Sizes[firstFail].Rows[vi]); ex {
					a.Extrapolated = true
				}
			}
			a.AllMeet = allMeet
			a.Text = answerText(slo, a, res.Sizes[len(res.Sizes)-1].Services)
			out = append(out, a)
		}
	}
	return out
}

func answerText(slo SLO, a Answer, largest int) string {
	var s string
	switch {
	case a.Largest == 0:
		s = fmt.Sprintf("no size meets it (%s at the smallest)", formatValue(slo.Metric, a.Value))
	case a.AllMeet:
		s = fmt.Sprintf("every size meets it, up to %d Services (%s): the limit lies beyond the ladder", largest, formatValue(slo.Metric, a.Value))
	default:
		s = fmt.Sprintf("%d Services (%s)", a.Largest, formatValue(slo.Metric, a.Value))
	}
	if a.Extrapolated {
		s += "; rests on an extrapolated figure"
	}
	return s
}

func formatValue(metric string, v float64) string {
	if metric == SLOFirstPacketRules {
		return fmt.Sprintf("%.0f rules", v)
	}
	return fmt.Sprintf("%.3g s", v)
}
