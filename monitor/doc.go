// Package monitor consumes the stream of gVisor's trace points (runsc's
// "remote" sink) for one sandbox and turns it into a sandbox.Activity: the
// processes a run started, its network attempts, the files it wrote and the
// sensitive files it read, and the rules over them that fired (which may end
// the run). It has its own home because it is neither a backend nor the
// engine: it is the consumer of a hostile byte stream and the rules over it,
// independent of how runsc is started (the gVisor backend starts runsc with
// SessionConfig and hands the results on; any other runsc-based backend
// could do the same).
//
// Every byte on the socket is treated as hostile, since the sandbox may be
// compromised: messages are bounded in size, the stream in rate and total,
// every list and map is capped, and a stream that does not decode ends
// monitoring of that run (Activity.Lost says so) without ever crashing or
// stalling the caller.
package monitor
