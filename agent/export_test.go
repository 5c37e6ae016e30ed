//go:build linux

package agent

// RunMessage exposes runMessage to the external tests, which play the
// agent's part to a driver run by hand.
var RunMessage = runMessage
