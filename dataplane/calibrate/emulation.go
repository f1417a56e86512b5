package calibrate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/sim/cost"
)

// SizeRatio is the VM/host ratio of one size of a reference calibration.
type SizeRatio struct {
	Services, Endpoints int
	VM, Host, Ratio     float64
}

// EmulationRatio compares the same calibration measured in the VM and on
// the host (the same binaries, the same input; `make calibrate-ipvs` uses
// the nftables fast layout, a netlink transaction that grows linearly on
// both sides): per size, the VM's full sync over the host's, kept size by
// size (a point is divided by the ratio at its size); Ratio is their median,
// Low and High their range. accel says how the VM
// ran ("tcg", "kvm"). Sizes measured on one side only are left out; none in
// common is an error.
func EmulationRatio(vm, host *Calibration, accel string) (*cost.Emulation, []SizeRatio, error) {
	if vm.Mode != host.Mode || vm.Variant != host.Variant {
		return nil, nil, fmt.Errorf("the references differ: %s/%s in the VM, %s/%s on the host", vm.Mode, vm.Variant, host.Mode, host.Variant)
	}
	var rs []SizeRatio
	for _, v := range vm.Points {
		i := slices.IndexFunc(host.Points, func(h Point) bool {
			return h.Services == v.Services && h.EndpointsPerService == v.EndpointsPerService
		})
		if i < 0 {
			continue
		}
		h := host.Points[i]
		if v.FullSeconds <= 0 || h.FullSeconds <= 0 {
			return nil, nil, fmt.Errorf("size %d x %d: a full sync of %g s in the VM, %g s on the host: not a measurement", v.Services, v.EndpointsPerService, v.FullSeconds, h.FullSeconds)
		}
		rs = append(rs, SizeRatio{Services: v.Services, Endpoints: v.EndpointsPerService, VM: v.FullSeconds, Host: h.FullSeconds, Ratio: v.FullSeconds / h.FullSeconds})
	}
	if len(rs) == 0 {
		return nil, nil, fmt.Errorf("the references have no size in common")
	}
	slices.SortFunc(rs, func(a, b SizeRatio) int { return a.Services - b.Services })
	ratios := make([]float64, len(rs))
	var each []string
	var sizes []cost.EmulationSize
	for i, r := range rs {
		ratios[i] = r.Ratio
		each = append(each, fmt.Sprintf("%d x %d: %.2f", r.Services, r.Endpoints, r.Ratio))
		if i > 0 && r.Services == rs[i-1].Services {
			return nil, nil, fmt.Errorf("the references measured %d Services at two endpoint counts: one ratio per size is needed", r.Services)
		}
		sizes = append(sizes, cost.EmulationSize{Services: r.Services, Ratio: r.Ratio})
	}
	e := &cost.Emulation{Ratio: Median(ratios), Low: slices.Min(ratios), High: slices.Max(ratios), Sizes: sizes,
		Method: fmt.Sprintf("%s-%s full sync, VM (%s) over host, medians of %d runs per size (%s); a point is divided by the ratio at its size (interpolated in log Services between sizes, the nearest size's outside them), low/high = the sizes' range",
			vm.Mode, vm.Variant, accel, runsOf(vm), strings.Join(each, ", "))}
	return e, rs, nil
}

func runsOf(c *Calibration) int {
	if len(c.Points) == 0 {
		return 0
	}
	return c.Points[0].Runs
}
