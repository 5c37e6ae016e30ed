//go:build tools

// Package runsc records the gVisor dependency so `go mod tidy` keeps its pin.
package runsc

import _ "gvisor.dev/gvisor/runsc"
