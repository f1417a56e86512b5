package app

import "github.com/kpsim/kpsim/sim/cluster"

// modeFlag is a --mode flag, parsed once, by cluster.ParseMode, when it is
// set: a bad value is a flag error, so a usage error (exit 2). The zero
// value is "no mode given".
type modeFlag struct{ m cluster.Mode }

// String is the mode as given ("" when none was).
func (f *modeFlag) String() string { return string(f.m) }

// Set parses s as a mode.
func (f *modeFlag) Set(s string) error {
	m, err := cluster.ParseMode(s)
	if err != nil {
		return err
	}
	f.m = m
	return nil
}

// Type is the value's name in --help; "string" as before the flag was typed.
func (f *modeFlag) Type() string { return "string" }
