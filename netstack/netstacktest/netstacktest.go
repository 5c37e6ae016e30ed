// Package netstacktest is test support: the sandbox's side of a link to
// the network helper, a second gVisor stack at egress.SandboxAddr that
// asks the helper's DNS and connects through it, as the sandbox's kernel
// (runsc's netstack) does. It exists so that the stack's in-process tests
// and the helper binary's end-to-end test drive the helper the same way,
// without root (a socketpair stands in for the TAP device).
package netstacktest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/safe-run/safe-run/egress"
)

// SandboxMAC is the client's link address.
var SandboxMAC = tcpip.LinkAddress("\x02\x00\xc6\x12\x00\x02")

// Socketpair is a link: one frame per message, as a TAP fd or a packet
// socket gives them.
func Socketpair() ([2]int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return [2]int{}, fmt.Errorf("socketpair: %w", err)
	}
	return [2]int{fds[0], fds[1]}, nil
}

// Link is an ethernet endpoint on fd.
func Link(fd int, mtu uint32, mac tcpip.LinkAddress) (stack.LinkEndpoint, error) {
	return fdbased.New(&fdbased.Options{FDs: []int{fd}, MTU: mtu, EthernetHeader: true, Address: mac, PacketDispatchMode: fdbased.RecvMMsg})
}

// Client is the sandbox's stack.
type Client struct {
	S *stack.Stack
}

// NewClient is a stack at egress.SandboxAddr on fd, routing everything
// through egress.GatewayAddr.
func NewClient(fd int) (*Client, error) {
	ep, err := Link(fd, 1500, SandboxMAC)
	if err != nil {
		return nil, err
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if err := s.CreateNIC(1, ep); err != nil {
		s.Close()
		return nil, fmt.Errorf("create NIC: %s", err)
	}
	s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: tcpip.AddressWithPrefix{
		Address: tcpip.AddrFrom4(egress.SandboxAddr.As4()), PrefixLen: egress.LinkPrefixLen}}, stack.AddressProperties{})
	any4, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	s.SetRouteTable([]tcpip.Route{{Destination: any4, Gateway: tcpip.AddrFrom4(egress.GatewayAddr.As4()), NIC: 1}})
	return &Client{S: s}, nil
}

// Close stops the stack.
func (c *Client) Close() {
	c.S.Close()
	c.S.Wait()
}

// Lookup asks the gateway's DNS for name's A record: the address, or
// false on NXDOMAIN.
func (c *Client) Lookup(name string) (netip.Addr, bool, error) {
	gw := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(egress.GatewayAddr.As4()), Port: 53}
	u, err := gonet.DialUDP(c.S, nil, &gw, ipv4.ProtocolNumber)
	if err != nil {
		return netip.Addr{}, false, err
	}
	defer u.Close()
	n, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return netip.Addr{}, false, err
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: n, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	u.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := u.Write(q); err != nil {
		return netip.Addr{}, false, err
	}
	buf := make([]byte, 1500)
	k, err := u.Read(buf)
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("DNS %s: %w", name, err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:k]); err != nil {
		return netip.Addr{}, false, err
	}
	if m.RCode == dnsmessage.RCodeNameError {
		return netip.Addr{}, false, nil
	}
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			return netip.AddrFrom4(r.A), true, nil
		}
	}
	return netip.Addr{}, false, fmt.Errorf("DNS %s: no answer, rcode %v", name, m.RCode)
}

// Dial connects to addr:port through the link.
func (c *Client) Dial(addr netip.Addr, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return gonet.DialContextTCP(ctx, c.S, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(addr.As4()), Port: port}, ipv4.ProtocolNumber)
}

// ReportLatency reports the median and 99th percentile of took.
func ReportLatency(b *testing.B, took []time.Duration) {
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}

// Seen collects what a helper reports (records, events) for a test to
// wait on; safe for concurrent use.
type Seen[T any] struct {
	mu    sync.Mutex
	items []T
}

// Add appends v.
func (s *Seen[T]) Add(v T) {
	s.mu.Lock()
	s.items = append(s.items, v)
	s.mu.Unlock()
}

// All is what was added so far.
func (s *Seen[T]) All() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.items)
}

// Wait waits up to 20 s for an item matching ok and returns it; else the
// test fails, listing what was seen and extra.
func (s *Seen[T]) Wait(tb testing.TB, what string, ok func(T) bool, extra ...any) T {
	tb.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, v := range s.All() {
			if ok(v) {
				return v
			}
		}
	}
	tb.Fatalf("no %s among %+v %v", what, s.All(), extra)
	var zero T
	return zero
}
