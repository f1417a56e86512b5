//go:build !linux

package engine

// adviseHuge does nothing outside Linux.
func adviseHuge([]ctSlot) {}
