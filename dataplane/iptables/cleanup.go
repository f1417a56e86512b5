package iptables

import "strings"

// CleanupText turns iptables-save output into the iptables-restore
// --noflush input that removes what kube-proxy installed: in each table, the
// rules of other chains that jump to a KUBE- chain are deleted (-D), and
// every KUBE- chain is flushed (declared again) and then deleted (-X).
// Chains of other owners and their other rules are left alone. The IPVS
// backend, which programs iptables too, cleans up with the same text.
func CleanupText(save string) string {
	var out strings.Builder
	var dels []string
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			out.WriteString(line + "\n")
			dels = dels[:0]
		case strings.HasPrefix(line, ":KUBE-"):
			name := strings.Fields(line[1:])[0]
			out.WriteString(":" + name + " - [0:0]\n")
			dels = append(dels, name)
		case strings.HasPrefix(line, "-A ") && strings.Contains(line, " -j KUBE-") && !strings.HasPrefix(line, "-A KUBE-"):
			out.WriteString("-D" + line[2:] + "\n")
		case line == "COMMIT":
			for _, d := range dels {
				out.WriteString("-X " + d + "\n")
			}
			out.WriteString("COMMIT\n")
		}
	}
	return out.String()
}
