// Command sim models, programs and checks Kubernetes Service load balancing.
// It is a thin shell: every command lives in package app.
package main

import (
	"os"

	"github.com/kpsim/kpsim/cmd/sim/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], app.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}))
}
