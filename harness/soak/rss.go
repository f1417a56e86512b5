package soak

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

func lookPath(name string) (string, error) { return exec.LookPath(name) }

// RSS criterion: the median RSS over the last quarter of the changes may
// exceed the median over the first quarter by at most RSSGrowthFactor
// times it plus RSSGrowthSlackMiB. A leak proportional to N (a record kept
// per change) grows past it as N grows; the slack absorbs the Go heap's
// settling into its GOGC steady state and the kernel's lazy return of
// freed pages.
const (
	RSSGrowthFactor   = 1.25
	RSSGrowthSlackMiB = 16
)

// RSS is the process's resident memory over the soak.
type RSS struct {
	// PeakMiB is VmHWM, the peak resident set of the whole process.
	PeakMiB float64 `json:"peakMiB"`
	// FirstQuarterMiB and LastQuarterMiB are the medians of the VmRSS
	// samples taken while changes 0..N/4 and 3N/4..N were made.
	FirstQuarterMiB float64 `json:"firstQuarterMiB"`
	LastQuarterMiB  float64 `json:"lastQuarterMiB"`
	// LimitMiB is the criterion: FirstQuarterMiB × RSSGrowthFactor +
	// RSSGrowthSlackMiB.
	LimitMiB float64     `json:"limitMiB"`
	Pass     bool        `json:"pass"`
	Samples  []RSSSample `json:"samples"`
}

// RSSSample is VmRSS after a number of changes.
type RSSSample struct {
	Event int     `json:"event"`
	MiB   float64 `json:"mib"`
}

type rssRecorder struct {
	n       int
	samples []RSSSample
}

func newRSSRecorder(n int) *rssRecorder { return &rssRecorder{n: n} }

func (r *rssRecorder) sample(event int) {
	rss, _ := procStatus()
	r.samples = append(r.samples, RSSSample{Event: event, MiB: rss})
}

func (r *rssRecorder) last() float64 {
	if len(r.samples) == 0 {
		return 0
	}
	return r.samples[len(r.samples)-1].MiB
}

func (r *rssRecorder) verdict() RSS {
	_, hwm := procStatus()
	out := RSS{PeakMiB: hwm, Samples: r.samples}
	var first, last []float64
	for _, s := range r.samples {
		if s.Event <= r.n/4 {
			first = append(first, s.MiB)
		}
		if s.Event >= r.n-r.n/4 {
			last = append(last, s.MiB)
		}
	}
	out.FirstQuarterMiB, out.LastQuarterMiB = median(first), median(last)
	out.LimitMiB = out.FirstQuarterMiB*RSSGrowthFactor + RSSGrowthSlackMiB
	out.Pass = out.LastQuarterMiB <= out.LimitMiB
	return out
}

func median(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// procStatus reads VmRSS and VmHWM (MiB) from /proc/self/status.
func procStatus() (rss, hwm float64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}
