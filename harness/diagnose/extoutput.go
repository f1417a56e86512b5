package diagnose

// The external section and the placements in the table and Markdown
// reports (JSON carries Report.External and Report.Placement as they are).

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// entryWords is an entry in one cell: what, where, and its firewall or
// refusal.
func entryWords(e *EntryReport) string {
	w := e.What + " " + e.Dest
	switch {
	case e.Refused != "":
		w += " (" + e.Refused + ")"
	case e.Ranges:
		w += " (source ranges)"
	}
	return w
}

// entryCount is an entry's count in one cell.
func entryCount(e *EntryReport) string {
	switch {
	case !e.Counted:
		return "-"
	case e.Refused != "":
		return fmt.Sprintf("%d refused", e.RefusedN)
	case e.Ranges:
		return fmt.Sprintf("%d (%d allowed, %d denied)", e.Connections, e.Allowed, e.Denied)
	}
	return fmt.Sprint(e.Connections)
}

// splitWords says whose split the outside connections are.
func splitWords(xr *ExternalReport, counters bool) string {
	switch {
	case xr.Split != nil && xr.Split.rulesOnly:
		return fmt.Sprintf("its own: %d endpoints (rules only)", len(xr.Split.Endpoints))
	case xr.Split != nil && counters:
		return fmt.Sprintf("its own: %d endpoints, n %d", len(xr.Split.Endpoints), xr.Split.N)
	case xr.Split != nil:
		return fmt.Sprintf("its own: %d endpoints", len(xr.Split.Endpoints))
	case xr.SplitOf == xr.Port:
		return "the cluster IP port's (same counters)"
	case xr.SplitOf != "":
		return "= " + xr.SplitOf
	}
	return "-"
}

func (r *Report) writeExternalTable(w io.Writer) error {
	if len(r.External) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nEXTERNAL (connections from outside the cluster; an entry's count is what its rule counted)")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PORT\tNODE\tPOLICY\tENTRY\tCONNECTIONS\tSPLIT\tVERDICT\tP")
	for _, xr := range r.External {
		p := nan
		if xr.Split != nil {
			p = xr.Split.P
		}
		first := fmt.Sprintf("%s\t%s\t%s", xr.Port, orDash(xr.Node), orDash(xr.Policy))
		tail := fmt.Sprintf("%s\t%s\t%s", splitWords(xr, r.Counters), orDash(xr.Verdict), num(p, "%.3g"))
		if len(xr.Entries) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\n", first, tail)
		}
		for i, e := range xr.Entries {
			if i > 0 {
				first, tail = "\t\t", "\t\t"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", first, entryWords(e), entryCount(e), tail)
		}
	}
	return tw.Flush()
}

func (r *Report) writePlacementTable(w io.Writer) error {
	for _, pl := range r.Placement {
		fmt.Fprintf(w, "\nPLACEMENT %s (externalTrafficPolicy Local): cause %s; %s\n", pl.Port, pl.Cause, placementSummary(pl))
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tPODS\tDUMPED\tCONNECTIONS\tSHARE\tINTERVAL\tEXPECTED\tSPLIT")
		for _, ns := range pl.Nodes {
			conn := "-"
			if ns.Dumped && pl.Counted {
				conn = fmt.Sprint(ns.Connections)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%.3f\t%s\n", ns.Node, ns.Pods, yesNo(ns.Dumped), conn, num(ns.Share, "%.3f"),
				interval(ns.Lo, ns.Hi), ns.Expected, orDash(ns.Verdict))
		}
		fmt.Fprintln(tw, "POD\tNODE\t\tCONNECTIONS\tSHARE\tINTERVAL\tEXPECTED\t")
		for _, ps := range pl.Pods {
			conn := "-"
			if pl.Counted && ps.Share.Valid() {
				conn = fmt.Sprint(ps.Observed)
			}
			fmt.Fprintf(tw, "%s\t%s\t\t%s\t%s\t%s\t%.3f\t\n", ps.Addr, ps.Node, conn, num(ps.Share, "%.3f"), interval(ps.Lo, ps.Hi), ps.Expected)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// placementSummary is the balancer's and the ratio's line.
func placementSummary(pl *PlacementReport) string {
	var parts []string
	if pl.Balancer != "" {
		parts = append(parts, fmt.Sprintf("balancer %s (even: p = %s)", pl.Balancer, num(pl.EvenP, "%.3g")))
	} else {
		parts = append(parts, "balancer not tested (one dumped node, or no counts)")
	}
	parts = append(parts, fmt.Sprintf("busiest/idlest pod: %s from placement, %s observed", num(pl.ExpectedRatio, "%.2f"), num(pl.ObservedRatio, "%.2f")))
	return strings.Join(parts, "; ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func interval(lo, hi Float) string {
	if !lo.Valid() || !hi.Valid() {
		return "-"
	}
	return fmt.Sprintf("[%.3f, %.3f]", float64(lo), float64(hi))
}

// writeExternalMarkdown is the external section and the placements in
// Markdown.
func (r *Report) writeExternalMarkdown(w io.Writer) {
	if len(r.External) > 0 {
		fmt.Fprintln(w, "\n## External traffic")
		fmt.Fprintln(w, "\n| port | node | policy | entry | connections | split | verdict | p |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
		for _, xr := range r.External {
			p := nan
			if xr.Split != nil {
				p = xr.Split.P
			}
			var entries, counts []string
			for _, e := range xr.Entries {
				entries, counts = append(entries, entryWords(e)), append(counts, entryCount(e))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", xr.Port, orDash(xr.Node), xr.Policy, strings.Join(entries, "<br>"),
				strings.Join(counts, "<br>"), splitWords(xr, r.Counters), orDash(xr.Verdict), num(p, "%.3g"))
		}
	}
	for _, pl := range r.Placement {
		fmt.Fprintf(w, "\n### Placement of %s (externalTrafficPolicy Local)\n\n", pl.Port)
		fmt.Fprintf(w, "Cause: **%s**; %s.\n\n%s\n\n", pl.Cause, placementSummary(pl), pl.Message)
		fmt.Fprintln(w, "| node | pods | dumped | connections | share | interval | expected | split |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
		for _, ns := range pl.Nodes {
			fmt.Fprintf(w, "| %s | %d | %s | %d | %s | %s | %.3f | %s |\n", ns.Node, ns.Pods, yesNo(ns.Dumped), ns.Connections, num(ns.Share, "%.3f"),
				interval(ns.Lo, ns.Hi), ns.Expected, orDash(ns.Verdict))
		}
		fmt.Fprintln(w, "\n| pod | node | connections | share | interval | expected |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|")
		for _, ps := range pl.Pods {
			fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %.3f |\n", ps.Addr, ps.Node, ps.Observed, num(ps.Share, "%.3f"), interval(ps.Lo, ps.Hi), ps.Expected)
		}
	}
}
