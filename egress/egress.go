// Package egress is what a sandbox may reach on the network and what it
// did there: the operator's allowlist (host names, wildcards, CIDRs,
// presets, pinned addresses), the ranges no sandbox ever reaches, the
// decisions made on the host for each DNS answer and connection, and the
// parsers of the first bytes of a connection (TLS SNI, HTTP Host) those
// decisions read.
//
// It has a home of its own because three parties speak it and none may
// depend on another: the policy (package sandbox checks a job's network
// against the server's list), the backend that builds the sandbox's
// network namespace, and the network helper (cmd/safe-run-net) that runs
// the user-space TCP/IP stack facing the sandbox. It holds data, parsing
// and decisions only; it opens no socket.
package egress

import (
	"net/netip"
)

// DefaultPorts are the ports an entry without a port allows.
var DefaultPorts = []uint16{80, 443}

// Entry is one line of an allowlist: a host name (or a wildcard of one), or
// a CIDR of IP destinations, with the ports it allows.
type Entry struct {
	// Host is a normalised name (lower case, ASCII/punycode, no trailing
	// dot), or "*." followed by one for a wildcard; empty for a CIDR entry.
	Host string
	// Prefix is the destination range of a CIDR entry.
	Prefix netip.Prefix
	// Ports are the ports the entry allows; empty means DefaultPorts.
	Ports []uint16
	// Pin, when valid, is the address the name is dialled at instead of
	// resolving it on the host: the only way a blocked range (a private
	// mirror, a test server on loopback) is ever reached. Ports is then
	// exactly Pin's port.
	Pin netip.AddrPort
	// Preset names the preset the entry came from, if any.
	Preset string
}

// Allowlist is the destinations a sandbox may reach. The zero Allowlist
// allows nothing.
type Allowlist struct {
	Entries []Entry
}

// Limits cap one sandbox's network. Zero fields take the defaults.
type Limits struct {
	// MaxConnections caps the TCP connections a run may open.
	MaxConnections int `json:"max_connections,omitempty"`
	// MaxBytesOut and MaxBytesIn cap the bytes sent and received, summed
	// over the run's connections.
	MaxBytesOut int64 `json:"max_bytes_out,omitempty"`
	MaxBytesIn  int64 `json:"max_bytes_in,omitempty"`
}

// The defaults of Limits.
const (
	DefaultMaxConnections = 256
	DefaultMaxBytes       = 1 << 30
)

// The decisions of a Connection.
const (
	Allowed = "allowed"
	Denied  = "denied"
)

// The kinds of a Connection.
const (
	KindTCP = "tcp" // a TCP connection attempt
	KindDNS = "dns" // a DNS question
	KindUDP = "udp" // a UDP datagram other than DNS (always dropped)
)

// Connection is one decision the host made for a sandbox: a DNS question
// answered or refused, a TCP connection let through or refused, a datagram
// dropped.
type Connection struct {
	// ID numbers the sandbox's records; a connection's open and close
	// records share it.
	ID uint64 `json:"id"`
	// Kind is one of the Kind constants.
	Kind string `json:"kind"`
	// Name is the host name the sandbox asked for (DNS, SNI or the name its
	// address was handed out for), normalised; empty for an IP destination.
	Name string `json:"name,omitempty"`
	// Port is the destination port.
	Port uint16 `json:"port,omitempty"`
	// Addr is the address dialled from the host, "ip:port", when one was.
	Addr string `json:"addr,omitempty"`
	// Dst is the address the sandbox connected to, "ip:port", as the host
	// saw it on the sandbox's link (for a name, the address its DNS answer
	// handed out); set on TCP records. The monitor's connect attempts are
	// matched to the host's decisions by it.
	Dst string `json:"dst,omitempty"`
	// Decision is Allowed or Denied.
	Decision string `json:"decision"`
	// Reason says why, e.g. "not in the allowlist", "SNI names another
	// host", "connection cap of 256 reached".
	Reason string `json:"reason,omitempty"`
	// BytesOut and BytesIn count what the connection carried, so far if
	// Open.
	BytesOut int64 `json:"bytes_out,omitempty"`
	BytesIn  int64 `json:"bytes_in,omitempty"`
	// Open says the connection was still open when the record was taken.
	Open bool `json:"open,omitempty"`
}

// Report is what a run's network saw.
type Report struct {
	// Allowlist is the run's effective list, as canonical entries.
	Allowlist []string `json:"allowlist"`
	// Connections are the records, in the order decided, up to a cap.
	Connections []Connection `json:"connections"`
	// Dropped counts the records beyond the cap.
	Dropped int `json:"dropped,omitempty"`
	// Failure says the network failed during the run (its helper died):
	// from then on the sandbox had none.
	Failure string `json:"failure,omitempty"`
}

// HelperConfig is what the backend tells the network helper
// (safe-run-net) on its standard input, as JSON, in one line. Each later
// line asks for a HelperEvent with Synced; the end of the input asks the
// helper to finish.
type HelperConfig struct {
	// Allow are the sandbox's allowlist entries, canonical (see Parse).
	Allow []string `json:"allow"`
	// Limits cap the sandbox's network.
	Limits Limits `json:"limits"`
	// Link is "tap" (fd 3 is a TAP device, IFF_TAP|IFF_NO_PI) or "packet"
	// (fd 3 is an AF_PACKET socket bound to a veth end with no address).
	Link string `json:"link"`
	// MTU is the link's MTU.
	MTU int `json:"mtu"`
	// Gateway is the helper's own address on the link, which the sandbox
	// routes through and asks for DNS; Sandbox is the sandbox's; PrefixLen
	// their subnet's.
	Gateway   netip.Addr `json:"gateway"`
	Sandbox   netip.Addr `json:"sandbox"`
	PrefixLen int        `json:"prefix_len"`
	// HostAddrs are the host's own addresses, always blocked.
	HostAddrs []netip.Addr `json:"host_addrs,omitempty"`
}

// HelperEvent is one line the network helper writes on its event stream
// (fd 4), as JSON.
type HelperEvent struct {
	// Ready says the stack is up: the sandbox may start.
	Ready bool `json:"ready,omitempty"`
	// Conn is a record (see Connection): a denial, a connection opened, or
	// its close with the final byte counts.
	Conn *Connection `json:"conn,omitempty"`
	// Error is why the helper is giving up; it exits next.
	Error string `json:"error,omitempty"`
	// Synced answers a line on the helper's stdin: every record of a
	// decision made before that line came is ahead of it in the stream.
	Synced bool `json:"synced,omitempty"`
}

// The addresses of a sandbox's link, the same in every sandbox (each has
// a network namespace of its own): the sandbox at SandboxAddr, the helper
// at GatewayAddr, answering DNS there and routing everything else; names
// are handed out addresses from SyntheticPrefix, which the helper maps
// back to the names. All are in 198.18.0.0/15, which RFC 2544 reserves
// for benchmarks: no real destination has them.
var (
	GatewayAddr     = netip.MustParseAddr("198.18.0.1")
	SandboxAddr     = netip.MustParseAddr("198.18.0.2")
	LinkPrefixLen   = 24
	SyntheticPrefix = netip.MustParsePrefix("198.19.0.0/16")
)
