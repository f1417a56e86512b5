package differential

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Comparison is one comparison of a batch: after step Step of every
// scenario that has it (Step == len(longest)+0 is the final cleanup, which
// deletes every object of the batch).
type Comparison struct {
	Step int
	// Cleanup marks the final comparison, after every object was deleted.
	Cleanup bool
	// Seeds are the scenarios written in this step.
	Seeds []uint64
	// Endpoints is the number of endpoints of the batch after the step,
	// per service port as kube-proxy counts them (Step.Endpoints), plus
	// the apiserver's own kubernetes endpoint and the ballast
	// (Config.Ballast): above 1,000, kube-proxy's iptables mode is in its
	// large-cluster mode.
	Endpoints int
	// Peak bounds the endpoints at any moment of the step (Step.Peak of
	// the scenarios written, the others' endpoints, the kubernetes one
	// and the ballast).
	Peak    int
	Results []Result
}

// RunBatch runs scenarios (seeds distinct modulo MaxSeeds) together: each
// step writes step k of every scenario that has one, waits for both sides
// (Write; with Config.Rounds in rounds, see rounds) and compares; a last
// step deletes every object left. fn sees
// each comparison; its error stops the batch.
func (e *Env) RunBatch(ctx context.Context, scs []*Scenario, fn func(Comparison) error) error {
	nss := make([]string, 0, len(scs))
	steps := 0
	for _, sc := range scs {
		nss = append(nss, sc.Namespace)
		steps = max(steps, len(sc.Steps))
	}
	if err := e.EnsureNamespaces(ctx, nss...); err != nil {
		return err
	}
	live := map[string]bool{}    // "svc ns/name" and "slice ns/name"
	owner := map[string]string{} // "ns/slice" -> "ns/service"
	for k := 0; k <= steps; k++ {
		c := Comparison{Step: k, Cleanup: k == steps, Endpoints: 1 + e.cfg.Ballast, Peak: 1 + e.cfg.Ballast}
		var w writeSet
		for _, sc := range scs {
			switch {
			case k < len(sc.Steps):
				st := &sc.Steps[k]
				w.add(writeSet{svcs: st.Services, slices: st.Slices, delSvc: st.DeleteServices, delSl: st.DeleteSlices})
				c.Seeds = append(c.Seeds, sc.Seed)
				c.Endpoints += st.Endpoints
				c.Peak += st.Peak
			case !c.Cleanup:
				c.Endpoints += sc.Steps[len(sc.Steps)-1].Endpoints
				c.Peak += sc.Steps[len(sc.Steps)-1].Endpoints
			default: // the cleanup only deletes
				c.Peak += sc.Steps[len(sc.Steps)-1].Endpoints
			}
		}
		if c.Cleanup {
			w.delSvc, w.delSl = liveObjects(live)
			for _, sc := range scs {
				c.Seeds = append(c.Seeds, sc.Seed)
			}
		}
		rs := []writeSet{w}
		if e.cfg.Rounds {
			rs = rounds(w, live, owner)
		}
		track(live, owner, w)
		if err := e.plantFlows(ctx); err != nil {
			return fmt.Errorf("step %d of seeds %v: %w", k, c.Seeds, err)
		}
		for _, r := range rs {
			if err := e.write(ctx, r); err != nil {
				return fmt.Errorf("step %d of seeds %v: %w", k, c.Seeds, err)
			}
		}
		if err := e.settleStale(ctx); err != nil {
			return fmt.Errorf("step %d of seeds %v: %w", k, c.Seeds, err)
		}
		res, err := e.Compare()
		if err != nil {
			return err
		}
		c.Results = res
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

func track(live map[string]bool, owner map[string]string, w writeSet) {
	for _, s := range w.svcs {
		live["svc "+s.Namespace+"/"+s.Name] = true
	}
	for _, s := range w.slices {
		live["slice "+s.Namespace+"/"+s.Name] = true
		owner[s.Namespace+"/"+s.Name] = s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
	}
	for _, d := range w.delSvc {
		delete(live, "svc "+d.String())
	}
	for _, d := range w.delSl {
		delete(live, "slice "+d.String())
	}
}

func liveObjects(live map[string]bool) (svcs, sls []types.NamespacedName) {
	for _, k := range sortedKeys(live) {
		kind, name, _ := strings.Cut(k, " ")
		ns, n, _ := strings.Cut(name, "/")
		nn := types.NamespacedName{Namespace: ns, Name: n}
		if kind == "svc" {
			svcs = append(svcs, nn)
		} else {
			sls = append(sls, nn)
		}
	}
	return svcs, sls
}

var (
	ipv4Re = regexp.MustCompile(`\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b`)
	nsRe   = regexp.MustCompile(`\bd-(\d+)/`)
)

// Attribute groups a diff's lines by the scenario they belong to: by the
// namespace d-<seed>/ in a comment or a chain name, else by a ClusterIP or
// endpoint address of the scenario. Lines that name neither (shared chains,
// hashed chain names without a comment) go under "" .
func Attribute(diff []string, scs []*Scenario) map[string][]string {
	out := map[string][]string{}
	bySeed := map[string]string{}
	byIP := map[netip.Addr]string{}
	for _, sc := range scs {
		key := fmt.Sprintf("seed %d", sc.Seed)
		bySeed[fmt.Sprint(sc.Seed)] = key
		for ip := range sc.IPs {
			byIP[ip] = key
		}
	}
	for _, l := range diff {
		key := ""
		if m := nsRe.FindStringSubmatch(l); m != nil {
			key = bySeed[m[1]]
		}
		if key == "" {
			for _, s := range ipv4Re.FindAllString(l, -1) {
				if a, err := netip.ParseAddr(s); err == nil && byIP[a] != "" {
					key = byIP[a]
					break
				}
			}
		}
		out[key] = append(out[key], l)
	}
	return out
}

// SortedKeys is the keys of an Attribute result, "" last.
func SortedKeys(m map[string][]string) []string {
	keys := sortedKeys(m)
	if len(keys) > 0 && keys[0] == "" {
		keys = append(keys[1:], "")
	}
	return slices.Clip(keys)
}
