package diagnose

// The conntrack part of the report as text and Markdown (JSON is the
// ConntrackReport itself).

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// summary is the conntrack report's opening lines.
func (cr *ConntrackReport) summary() []string {
	shown := "the file has no count line"
	if cr.Shown >= 0 {
		shown = fmt.Sprintf("conntrack said %d", cr.Shown)
	}
	s := cr.Service
	out := []string{
		fmt.Sprintf("conntrack %s: %d entries (%s); %d to service ports of the dump: %d TCP established, %d other TCP, %d UDP, %d other; %d elsewhere",
			cr.File, cr.Entries, shown, s.Total(), s.TCPEstablished, s.TCPOther, s.UDP, s.Other, cr.NotService.Total()),
	}
	if s.Total() > 0 {
		out = append(out, fmt.Sprintf("long-lived (TCP ESTABLISHED and ASSURED): %d of %d service entries, %.3f [%.3f, %.3f] (Clopper-Pearson, %g); timeouts left %s",
			cr.LongLived, s.Total(), float64(cr.Share), float64(cr.ShareLo), float64(cr.ShareHi), 1-cr.Alpha, cr.Remaining))
	}
	out = append(out, fmt.Sprintf("long-lived split: Pearson chi-square of each port's long-lived connections (clients with ClientIP affinity) against the intended split, Holm over %d tested port(s) at α = %g (a family of its own)",
		cr.Tested, cr.Alpha))
	return out
}

// active are the ports with at least one entry.
func (cr *ConntrackReport) active() []*CTPort {
	var out []*CTPort
	for _, cp := range cr.Ports {
		if cp.Counts.Total() > 0 {
			out = append(out, cp)
		}
	}
	return out
}

func staleCount(cp *CTPort) int {
	n := 0
	for _, e := range cp.Endpoints {
		if !e.Listed {
			n += e.Counts.Total()
		}
	}
	return n
}

// destinations names a port's destinations that had entries.
func (cp *CTPort) destinations() string {
	var parts []string
	for _, f := range cp.Frontends {
		if f.Entries == 0 {
			continue
		}
		w := fmt.Sprintf("%s %s: %d (%d long-lived)", f.What, f.Dest, f.Entries, f.LongLived)
		if !f.Tested {
			w += ", externalTrafficPolicy Local: not in the test"
		}
		parts = append(parts, w)
	}
	return strings.Join(parts, "; ")
}

// endpointRow is one endpoint's cells: entries, long-lived, tested, share,
// interval, intended, and what it is.
func endpointRow(cp *CTPort, e *CTEndpoint) []string {
	share, iv, intended := "-", "-", "-"
	if e.Lo.Valid() && cp.TestN > 0 {
		share = fmt.Sprintf("%.3f", e.Share)
		iv = fmt.Sprintf("[%.3f, %.3f]", float64(e.Lo), float64(e.Hi))
		intended = fmt.Sprintf("%.3f", e.Expected/float64(cp.TestN))
	}
	what := e.Pinned
	switch {
	case !e.Listed:
		what = "stale: not in the rules"
	case what != "":
		what = "pinned " + what + " than its share"
	}
	return []string{e.Addr.String(), fmt.Sprint(e.Counts.Total()), fmt.Sprint(e.LongLived), fmt.Sprint(e.Tested), share, iv, intended, what}
}

// writeTable prints the conntrack part of the text report.
func (cr *ConntrackReport) writeTable(w io.Writer) error {
	fmt.Fprintln(w)
	for _, l := range cr.summary() {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PORT\tENTRIES\tTCP-EST\tTCP-OTHER\tUDP\tLONG-LIVED\tSHARE\tSTALE\tUNTRANSLATED\tVERDICT\tP")
	for _, cp := range cr.active() {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\n", cp.Port, cp.Counts.Total(), cp.Counts.TCPEstablished, cp.Counts.TCPOther,
			cp.Counts.UDP, cp.LongLived, num(cp.Share, "%.3f"), staleCount(cp), cp.Untranslated.Total(), cp.Verdict, num(cp.P, "%.3g"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PORT\tENDPOINT\tENTRIES\tLONG-LIVED\tTESTED\tSHARE\tINTERVAL\tINTENDED\tPINNED")
	for _, cp := range cr.active() {
		label := cp.Port
		for _, e := range cp.Endpoints {
			if e.Counts.Total() == 0 && !e.Lo.Valid() {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\n", label, strings.Join(endpointRow(cp, e), "\t"))
			label = ""
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nDESTINATIONS (entries per original destination)")
	for _, cp := range cr.active() {
		fmt.Fprintf(w, "%s: %s\n", cp.Port, cp.destinations())
	}
	return nil
}

// writeMarkdown prints the conntrack part of the Markdown report.
func (cr *ConntrackReport) writeMarkdown(w io.Writer) {
	fmt.Fprintln(w, "\n## Conntrack")
	fmt.Fprintln(w)
	for _, l := range cr.summary() {
		fmt.Fprintf(w, "%s\n\n", l)
	}
	fmt.Fprintf(w, "Long-lived: %s.\n\n", cr.Definition)
	fmt.Fprintln(w, "| port | entries | TCP established | other TCP | UDP | long-lived | share | stale | untranslated | verdict | p | Holm p |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, cp := range cr.active() {
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %s | %d | %d | %s | %s | %s |\n", cp.Port, cp.Counts.Total(), cp.Counts.TCPEstablished,
			cp.Counts.TCPOther, cp.Counts.UDP, cp.LongLived, num(cp.Share, "%.3f"), staleCount(cp), cp.Untranslated.Total(), cp.Verdict,
			num(cp.P, "%.3g"), num(cp.Adjusted, "%.3g"))
	}
	for _, cp := range cr.active() {
		fmt.Fprintf(w, "\n### %s (conntrack)\n\n%s: %s", cp.Port, cp.Key, cp.destinations())
		if cp.Tested != "" && cp.TestN > 0 {
			fmt.Fprintf(w, "; tested: %d %s", cp.TestN, cp.Tested)
		}
		fmt.Fprintf(w, "; timeouts left %s\n\n", cp.Remaining)
		fmt.Fprintln(w, "| endpoint | entries | long-lived | tested | share | interval | intended | |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
		for _, e := range cp.Endpoints {
			fmt.Fprintf(w, "| %s |\n", strings.Join(endpointRow(cp, e), " | "))
		}
	}
}
