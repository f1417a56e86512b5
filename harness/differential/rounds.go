package differential

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// writeSet is the objects of one Env.Write.
type writeSet struct {
	svcs   []*corev1.Service
	slices []*discoveryv1.EndpointSlice
	delSvc []types.NamespacedName
	delSl  []types.NamespacedName
}

func (w *writeSet) add(o writeSet) {
	w.svcs = append(w.svcs, o.svcs...)
	w.slices = append(w.slices, o.slices...)
	w.delSvc = append(w.delSvc, o.delSvc...)
	w.delSl = append(w.delSl, o.delSl...)
}

func (w *writeSet) empty() bool {
	return len(w.svcs)+len(w.slices)+len(w.delSvc)+len(w.delSl) == 0
}

// rounds splits a step's writes so that no round changes the rules of one
// Service twice (Config.Rounds): kube-proxy syncs per event, ours once per
// round, so each Service's rules go through the same states on both sides
// whatever kube-proxy coalesces. Per Service (ns/name):
//   - deleted in the step: its deletion first, then its slices' writes
//     (which no longer change any rule) together;
//   - created in the step (not in live): its slices together, then the
//     Service (its rules appear once, with every slice);
//   - otherwise: its update if any, then one slice write per round.
//
// owner maps "ns/slice" to "ns/service" for slices being deleted.
func rounds(w writeSet, live map[string]bool, owner map[string]string) []writeSet {
	units := map[string][]writeSet{}
	svcWrite := map[string]*corev1.Service{}
	deleted := map[string]bool{}
	for _, s := range w.svcs {
		svcWrite[s.Namespace+"/"+s.Name] = s
	}
	for _, d := range w.delSvc {
		deleted[d.String()] = true
	}
	sliceWrites := map[string][]writeSet{}
	for _, s := range w.slices {
		k := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		sliceWrites[k] = append(sliceWrites[k], writeSet{slices: []*discoveryv1.EndpointSlice{s}})
	}
	for _, d := range w.delSl {
		k := owner[d.String()]
		sliceWrites[k] = append(sliceWrites[k], writeSet{delSl: []types.NamespacedName{d}})
	}
	keys := map[string]bool{}
	for k := range svcWrite {
		keys[k] = true
	}
	for k := range deleted {
		keys[k] = true
	}
	for k := range sliceWrites {
		keys[k] = true
	}
	for k := range keys {
		var together writeSet
		for _, u := range sliceWrites[k] {
			together.add(u)
		}
		ns, name, _ := strings.Cut(k, "/")
		switch {
		case deleted[k]:
			units[k] = []writeSet{{delSvc: []types.NamespacedName{{Namespace: ns, Name: name}}}, together}
		case svcWrite[k] != nil && !live["svc "+k]:
			units[k] = []writeSet{together, {svcs: []*corev1.Service{svcWrite[k]}}}
		case !live["svc "+k]: // slices of no Service: no rule changes
			units[k] = []writeSet{together}
		default:
			if s := svcWrite[k]; s != nil {
				units[k] = append(units[k], writeSet{svcs: []*corev1.Service{s}})
			}
			units[k] = append(units[k], sliceWrites[k]...)
		}
	}
	var out []writeSet
	for _, k := range sortedKeys(units) {
		r := 0
		for _, u := range units[k] {
			if u.empty() {
				continue
			}
			if r == len(out) {
				out = append(out, writeSet{})
			}
			out[r].add(u)
			r++
		}
	}
	return slices.Clip(out)
}
