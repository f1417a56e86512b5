package conform

import (
	"fmt"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// Independence is the run-time proof that a phase's probes were fresh NAT
// decisions: after each block of a batch (the conntrack tables were emptied
// before it, see MaxBlockProbes) the prober counts the new conntrack entries
// of the client's node namespace and compares them with the block's probes.
// A probe that met a live entry would have followed the earlier choice
// without a new entry, so fewer entries than probes that reached an
// endpoint prove reuse; equality proves that each probe was a new
// connection.
type Independence struct {
	// Counter names what was counted (the sysctl, or the hook the suite
	// set).
	Counter string `json:"counter,omitempty"`
	// Blocks and Probes count the blocks and probes that were checked.
	Blocks int `json:"blocks"`
	Probes int `json:"probes"`
	// Entries is the sum over the checked blocks of the new entries.
	Entries int64 `json:"entries"`
	// Arrived is the arrivals at the backends during the checked blocks.
	Arrived int `json:"arrived"`
	// Single counts probes of single-probe batches, which are not counted
	// (a batch of one cannot repeat a tuple of its own; the caller's
	// phases keep them apart).
	Single int `json:"single,omitempty"`
	// Problems lists the blocks that disproved or could not prove
	// independence, one line each.
	Problems []string `json:"problems,omitempty"`
}

// Holds reports whether every checked block proved fresh decisions.
func (i *Independence) Holds() bool { return len(i.Problems) == 0 }

// String is the proof in one line, for the report: "independent: 3
// blocks, 98,304 probes, 98,304 new conntrack entries" or the problems.
func (i *Independence) String() string {
	if i == nil || i.Blocks == 0 && i.Single == 0 {
		return ""
	}
	var b strings.Builder
	if i.Holds() {
		b.WriteString("independent: ")
	} else {
		b.WriteString("NOT shown independent: ")
	}
	fmt.Fprintf(&b, "%s %s, %s probes, %s %s", group(int64(i.Blocks)), plural(i.Blocks, "block", "blocks"), group(int64(i.Probes)), group(i.Entries), entriesNoun(i.Counter))
	if d := int64(i.Probes) - i.Entries; i.Holds() && d > 0 {
		fmt.Fprintf(&b, "; %s probes made no entry and did not arrive (rejected or dropped before a decision)", group(d))
	}
	if i.Single > 0 {
		fmt.Fprintf(&b, "; %s single probes not counted", group(int64(i.Single)))
	}
	if !i.Holds() {
		b.WriteString(": ")
		b.WriteString(strings.Join(i.Problems, "; "))
	}
	return b.String()
}

// add folds another batch's proof into i.
func (i *Independence) add(o Independence) {
	if i.Counter == "" {
		i.Counter = o.Counter
	}
	i.Blocks += o.Blocks
	i.Probes += o.Probes
	i.Entries += o.Entries
	i.Arrived += o.Arrived
	i.Single += o.Single
	i.Problems = append(i.Problems, o.Problems...)
}

// blockProof judges one block: probes sent, arrivals at the backends during
// the block, and new entries counted. Entries below arrivals prove that
// probes followed live entries (reuse); entries above the probes mean the
// table held something else, so nothing is proven. Between the two, the
// probes without an entry did not arrive either: rejected or dropped before
// a decision, which the loss accounting reports.
func blockProof(index, probes, arrived int, entries int64, counter string) string {
	switch {
	case entries < int64(arrived):
		return fmt.Sprintf("block %d: %s probes reached endpoints but only %s %s appeared: %s probes followed a live entry (tuple reuse)",
			index+1, group(int64(arrived)), group(entries), entriesNoun(counter), group(int64(arrived)-entries))
	case entries > int64(probes):
		return fmt.Sprintf("block %d: %s %s for %s probes: the table held other connections (flush failed?)", index+1, group(entries), entriesNoun(counter), group(int64(probes)))
	}
	return ""
}

// entriesNoun names what a counter counts.
func entriesNoun(counter string) string {
	if counter == counterIPVS {
		return "new IPVS connections"
	}
	return "new conntrack entries"
}

// counterConntrack is the default entry counter: per network namespace.
const counterConntrack = "net.netfilter.nf_conntrack_count"

// conntrackCount reads the number of conntrack entries of a namespace.
func conntrackCount(ns *netns.Namespace) (int64, error) {
	v, err := ns.ReadSysctl(counterConntrack)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("could not parse %s %q: %w", counterConntrack, v, err)
	}
	return n, nil
}

// group writes n with thousands separators (98,304).
func group(n int64) string { return thousands.Sprintf("%d", n) }

// thousands prints numbers with English thousands separators.
var thousands = message.NewPrinter(language.English)

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
