// Command safe-run-net is a networked sandbox's network, run by the
// backend beside the sandbox: a user-space TCP/IP stack (package netstack)
// on the sandbox's link that lets through only what the allowlist allows.
//
// Protocol: fd 3 is the link (a TAP fd opened IFF_TAP|IFF_NO_PI, or an
// AF_PACKET socket bound to a veth end without address); fd 4 is the write
// end of the event pipe (egress.HelperEvent JSON lines: {"ready":true}
// first, then {"conn":…} records); stdin carries one egress.HelperConfig
// JSON line and then stays open: EOF on stdin means finish (every
// connection closed, its last record written, exit 0). stderr is its log.
// Before it reads a frame it drops every capability, sets no_new_privs and
// installs a seccomp filter (lockdown_linux.go).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/netstack"
)

// The file descriptors of the protocol.
const (
	linkFD   = 3
	eventsFD = 4
)

func main() {
	selftest := flag.String("selftest", "", "after the lockdown, try `what` (execve) and report whether it was refused; for tests")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *selftest != "" {
		os.Exit(runSelftest(*selftest, log))
	}
	ev := &events{enc: json.NewEncoder(os.NewFile(eventsFD, "events"))}
	if err := run(os.Stdin, ev, log); err != nil {
		fmt.Fprintf(os.Stderr, "safe-run-net: %v\n", err)
		ev.emit(egress.HelperEvent{Error: err.Error()})
		os.Exit(1)
	}
}

// events writes HelperEvent lines, one at a time.
type events struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error
}

func (e *events) emit(ev egress.HelperEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err == nil {
		e.err = e.enc.Encode(ev)
	}
}

func run(stdin io.Reader, ev *events, log *slog.Logger) error {
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		return fmt.Errorf("read the configuration line on stdin: %w", err)
	}
	var cfg egress.HelperConfig
	if err := json.Unmarshal(line, &cfg); err != nil {
		return fmt.Errorf("parse the configuration line on stdin: %w", err)
	}
	allow, err := egress.Parse(cfg.Allow)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if cfg.MTU <= 0 || cfg.MTU > 65535 {
		return fmt.Errorf("configuration: mtu %d is out of range 1..65535", cfg.MTU)
	}
	if cfg.Link != "tap" && cfg.Link != "packet" {
		return fmt.Errorf("configuration: link %q is neither \"tap\" nor \"packet\"", cfg.Link)
	}
	if !cfg.Gateway.IsValid() {
		cfg.Gateway, cfg.PrefixLen = egress.GatewayAddr, egress.LinkPrefixLen
	}
	if len(cfg.HostAddrs) == 0 {
		cfg.HostAddrs, err = hostAddrs()
		if err != nil {
			return fmt.Errorf("read the host's addresses: %w", err)
		}
	}
	// The resolver reads its files before the filter forbids opening any.
	warmResolver()
	if err := lockdown(); err != nil {
		return fmt.Errorf("lock down: %w", err)
	}
	ep, err := fdbased.New(&fdbased.Options{
		FDs:                []int{linkFD},
		MTU:                uint32(cfg.MTU),
		EthernetHeader:     true,
		Address:            netstack.HelperMAC,
		PacketDispatchMode: fdbased.RecvMMsg, // sockets only; a TAP fd is read with readv
		// A veth's kernel side hands an AF_PACKET reader checksums left to
		// the (absent) hardware; the link is a memory copy, which corrupts
		// nothing, so received checksums are not verified (runsc's own
		// default on its side of the link).
		RXChecksumOffload: true,
	})
	if err != nil {
		return fmt.Errorf("open the link on fd %d: %w", linkFD, err)
	}
	st, err := netstack.New(ep, netstack.Config{
		Allow: allow, Limits: cfg.Limits,
		Gateway: cfg.Gateway, PrefixLen: cfg.PrefixLen, HostAddrs: cfg.HostAddrs,
		Record: func(c egress.Connection) { ev.emit(egress.HelperEvent{Conn: &c}) },
		Log:    log,
	})
	if err != nil {
		return err
	}
	ev.emit(egress.HelperEvent{Ready: true})
	// Each further line asks for a mark in the event stream: every record
	// of a decision made before it is ahead of it (records are written as
	// they are decided). EOF means finish.
	for {
		if _, err := in.ReadBytes('\n'); err != nil {
			break
		}
		ev.emit(egress.HelperEvent{Synced: true})
	}
	st.Close()
	return nil
}

// hostAddrs are the addresses of the host's interfaces.
func hostAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// warmResolver makes Go's resolver read /etc/nsswitch.conf, /etc/hosts
// and /etc/resolv.conf now (it keeps them; a later change it cannot
// reopen is ignored, as is the file it failed to open).
func warmResolver() {
	net.LookupHost("localhost")
}

func runSelftest(what string, log *slog.Logger) int {
	if err := lockdown(); err != nil {
		log.Error("lockdown", "err", err)
		return 2
	}
	switch what {
	case "execve":
		err := syscall.Exec("/bin/true", []string{"true"}, nil)
		fmt.Fprintf(os.Stderr, "execve: %v\n", err)
		if errors.Is(err, syscall.EPERM) {
			return 0
		}
		return 1
	case "open":
		f, err := os.Open("/etc/hostname")
		fmt.Fprintf(os.Stderr, "open: %v\n", err)
		if errors.Is(err, syscall.EPERM) {
			return 0
		}
		f.Close()
		return 1
	}
	fmt.Fprintf(os.Stderr, "selftest %q: unknown; use execve or open\n", what)
	return 2
}
