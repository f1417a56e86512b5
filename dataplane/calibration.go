package dataplane

import "slices"

// CalibrationPoint is one measured size, in the JSON shape the simulator's
// cost model reads (sim/cost.Point), plus the raw-restore comparison.
type CalibrationPoint struct {
	Services            int     `json:"services"`
	EndpointsPerService int     `json:"endpointsPerService"`
	Objects             int     `json:"objects"`
	FullSeconds         float64 `json:"fullSyncSeconds"`
	PartialSeconds      float64 `json:"partialSyncSeconds,omitempty"`
	// RawRestoreSeconds is the raw load of the full sync's exact text into
	// a fresh namespace (`iptables-restore --noflush`, `nft -f`): the floor
	// a sync is held to.
	RawRestoreSeconds float64 `json:"rawRestoreSeconds"`
	Ratio             float64 `json:"fullOverRaw"`
	PartialOverFull   float64 `json:"partialOverFull"`
	RestoreBytes      int     `json:"restoreBytes"`
	Runs              int     `json:"runs"`
}

// Calibration is sync time against size for one variant.
type Calibration struct {
	Mode    string             `json:"mode"`
	Variant string             `json:"variant"`
	Kernel  string             `json:"kernel,omitempty"`
	Source  string             `json:"source"`
	Points  []CalibrationPoint `json:"points"`
}

// Median is the median of v (the upper one for an even count).
func Median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}
