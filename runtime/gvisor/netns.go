package gvisor

// A networked sandbox lives in a network namespace of its own, which
// safe-run creates before runsc starts: the namespace thread unshares it,
// brings up its loopback, creates the link the sandbox's traffic leaves
// through and bind-mounts the namespace to a file in the run directory
// (runsc joins it by that path). The link is a TAP device, or, where
// /dev/net/tun cannot be opened (0600 on some hosts, so not for an ordinary
// user), a veth pair whose end without an address is read through an
// AF_PACKET socket. Its other side, the fd, goes to the network helper.
//
// The namespace thread is one OS thread, locked for the life of the
// process, that does nothing else; between sandboxes it waits in a parking
// namespace (the host's for root; an empty one of its own for the root of
// a user namespace, which may not return to the host's). It must never
// end: a parent-death signal follows the thread that forked a child, so a
// thread that ended would kill every runsc and helper it had ever started
// (a thread that was locked and discarded after each namespace killed other
// sandboxes that way), and it must not go back to the runtime while in a
// namespace not the process's own.
//
// A bind mount rather than a thread parked in each namespace: it costs no
// thread per sandbox, and a safe-run that dies leaves it in the run
// directory, where the reaper unmounts it (in a user namespace it dies with
// the mount namespace); once runsc and the helper are gone, the namespace
// and its links go with it.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/egress"
)

// The links a networked sandbox can have (Config.NetLink).
const (
	LinkTap  = "tap"
	LinkVeth = "veth"
)

// Names and sizes of the link inside the sandbox's network namespace.
const (
	linkName = "eth0"  // the sandbox's side: runsc copies its address and route
	peerName = "peer0" // the helper's side of a veth, without an address
	// linkMTU is large because throughput grows with it: a 64 MiB
	// download over veth took 18.5 MiB/s at 1500 and 50–124 at 65000 on
	// this loaded host (the probe: 85–107 vs 520–585 MiB/s over a TAP).
	linkMTU = 65000
	// netnsFile is the run directory's bind mount of the namespace.
	netnsFile = "netns"
)

// sandboxNet is a sandbox's network namespace and link, until removed.
type sandboxNet struct {
	kind   string   // LinkTap or LinkVeth
	nsPath string   // the bind mount runsc joins
	file   *os.File // the TAP fd or the AF_PACKET socket, for the helper
	mtu    int
}

// openTun opens /dev/net/tun, which decides between the links.
func openTun() (*os.File, error) {
	return os.OpenFile("/dev/net/tun", os.O_RDWR|unix.O_CLOEXEC, 0)
}

// chooseLink resolves Config.NetLink: "" is a TAP if /dev/net/tun opens.
func chooseLink(want string) (string, error) {
	switch want {
	case LinkTap, LinkVeth:
		return want, nil
	case "", "auto":
		f, err := openTun()
		if err != nil {
			return LinkVeth, nil
		}
		f.Close()
		return LinkTap, nil
	}
	return "", fmt.Errorf("network link %q is not one of auto, tap, veth", want)
}

// createNet creates the network namespace of a sandbox with its run
// directory dir and a link of kind. On error nothing is left behind, and
// the error says what to fix.
func createNet(dir, kind string) (*sandboxNet, error) {
	n := &sandboxNet{kind: kind, nsPath: filepath.Join(dir, netnsFile), mtu: linkMTU}
	if err := os.WriteFile(n.nsPath, nil, 0o600); err != nil {
		return nil, fmt.Errorf("create network namespace file: %w", err)
	}
	if err := onNamespaceThread(n.setUp); err != nil {
		n.remove()
		return nil, fmt.Errorf("%w; %s", err, networkFix(kind, err))
	}
	return n, nil
}

// namespaceThread is the namespace thread's queue of work, started once.
var namespaceThread struct {
	once sync.Once
	work chan threadWork
}

// threadWork is a function for the namespace thread and where its error goes.
type threadWork struct {
	f    func() error
	done chan<- error
}

// onNamespaceThread runs f on the namespace thread and returns its error.
func onNamespaceThread(f func() error) error {
	namespaceThread.once.Do(func() {
		namespaceThread.work = make(chan threadWork)
		go runNamespaceThread(namespaceThread.work)
	})
	done := make(chan error, 1)
	namespaceThread.work <- threadWork{f, done}
	return <-done
}

// runNamespaceThread locks itself to its thread for good and runs work
// there, each piece from the parking namespace.
func runNamespaceThread(work <-chan threadWork) {
	goruntime.LockOSThread() // never unlocked: see the top of this file
	park, err := parkingNamespace()
	for w := range work {
		if err != nil {
			w.done <- fmt.Errorf("network namespace thread: %w", err)
			continue
		}
		ferr := w.f()
		// Back in the parking namespace, the thread does not keep the
		// sandbox's namespace (and its links) until the next one. It may
		// always return to where it was; if it ever could not, later
		// sandboxes would start from a namespace that is not empty.
		if e := unix.Setns(park, unix.CLONE_NEWNET); e != nil {
			err = fmt.Errorf("return to the parking namespace: %w", e)
		}
		w.done <- ferr
	}
}

// parkingNamespace opens the namespace the thread waits in: the one it
// started in if it may return there, else a new empty one.
func parkingNamespace() (int, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open this thread's network namespace: %w", err)
	}
	if unix.Setns(fd, unix.CLONE_NEWNET) == nil {
		return fd, nil
	}
	unix.Close(fd)
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return -1, fmt.Errorf("create the parking network namespace: %w", err)
	}
	if fd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return -1, fmt.Errorf("open the parking network namespace: %w", err)
	}
	return fd, nil
}

// setUp runs on the namespace thread: it moves the thread into a new
// network namespace and builds the link there.
func (n *sandboxNet) setUp() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("create network namespace: %w", err)
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), n.nsPath, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind network namespace: %w", err)
	}
	// runsc would copy IPv6 link-local addresses into the sandbox; the
	// helper drops IPv6 anyway. /proc/sys/net is the opener's namespace.
	// Where /proc/sys is read-only (systemd's ProtectKernelTunables=), the
	// links get no IPv6 address generation instead (noLinkLocal).
	for _, conf := range []string{"all", "default"} {
		err := os.WriteFile("/proc/sys/net/ipv6/conf/"+conf+"/disable_ipv6", []byte("1"), 0)
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EROFS) {
			return fmt.Errorf("disable IPv6 in the network namespace: %w", err)
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bring up loopback: %w", err)
	}
	var link netlink.Link
	if n.kind == LinkTap {
		link, err = n.tap()
	} else {
		link, err = n.veth()
	}
	if err != nil {
		return err
	}
	if err := noLinkLocal(link); err != nil {
		return fmt.Errorf("turn off IPv6 addresses of %s: %w", linkName, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: egress.SandboxAddr.AsSlice(), Mask: net.CIDRMask(egress.LinkPrefixLen, 32)}}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address %s: %w", linkName, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up %s: %w", linkName, err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: egress.GatewayAddr.AsSlice()}
	if err := netlink.RouteAdd(route); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// tap creates the TAP device; its fd is the helper's side.
func (n *sandboxNet) tap() (netlink.Link, error) {
	f, err := openTun()
	if err != nil {
		return nil, err
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:], linkName)
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		f.Close()
		return nil, fmt.Errorf("create TAP device: %w", errno)
	}
	n.file = f
	link, err := netlink.LinkByName(linkName)
	if err == nil {
		err = netlink.LinkSetMTU(link, n.mtu)
	}
	if err != nil {
		return nil, fmt.Errorf("set up TAP device: %w", err)
	}
	return link, nil
}

// veth creates the veth pair and an AF_PACKET socket bound to its end
// without an address, the helper's side.
func (n *sandboxNet) veth() (netlink.Link, error) {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: linkName, MTU: n.mtu}, PeerName: peerName}
	if err := netlink.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("create veth pair: %w", err)
	}
	link, err := netlink.LinkByName(linkName)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", linkName, err)
	}
	peer, err := netlink.LinkByName(peerName)
	if err == nil {
		err = netlink.LinkSetMTU(peer, n.mtu)
	}
	if err == nil {
		err = noLinkLocal(peer)
	}
	if err == nil {
		err = netlink.LinkSetUp(peer)
	}
	if err != nil {
		return nil, fmt.Errorf("bring up %s: %w", peerName, err)
	}
	proto := htons(unix.ETH_P_ALL)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return nil, fmt.Errorf("open packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: peer.Attrs().Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind packet socket to %s: %w", peerName, err)
	}
	n.file = os.NewFile(uintptr(fd), "packet:"+peerName)
	return link, nil
}

// noLinkLocal sets a link's IPv6 address generation to none (before it is
// up), so it never gets a link-local address, whatever /proc/sys allows.
// A kernel without IPv6 has nothing to turn off.
func noLinkLocal(link netlink.Link) error {
	const addrGenModeNone = 1 // IN6_ADDR_GEN_MODE_NONE, include/uapi/linux/if_link.h
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(link.Attrs().Index)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	inet6 := spec.AddRtAttr(unix.AF_INET6, nil)
	inet6.AddRtAttr(unix.IFLA_INET6_ADDR_GEN_MODE, []byte{addrGenModeNone})
	req.AddData(spec)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		return nil
	}
	return err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// remove closes the link's fd and unmounts and removes the namespace file;
// the namespace and its links vanish when runsc and the helper are gone.
func (n *sandboxNet) remove() {
	if n == nil {
		return
	}
	if n.file != nil {
		n.file.Close()
		n.file = nil
	}
	unmountNetNS(n.nsPath)
}

// unmountNetNS removes a run directory's namespace bind mount, if any.
func unmountNetNS(path string) {
	for unix.Unmount(path, unix.MNT_DETACH) == nil {
	}
	_ = os.Remove(path)
}

// NetworkCheck says whether networked sandboxes (--allow-net) can run
// here, and with which link (LinkTap or LinkVeth): it creates a throw-away
// network namespace with that link and finds the helper. The error says
// what to fix.
func NetworkCheck(cfg Config) (link string, err error) {
	if err := CheckPrivileges(); err != nil {
		return "", err
	}
	link, err = chooseLink(cfg.NetLink)
	if err != nil {
		return "", err
	}
	helper, err := cfg.netHelper()
	if err != nil {
		return link, err
	}
	if err := checkExecutable(helper, ErrNetHelper); err != nil {
		return link, fmt.Errorf("%w; build it with make build, or name it with the network helper setting", err)
	}
	if HostRoot() {
		if err := othersCanExec(helper); err != nil {
			return link, partError(ErrNetHelper, "host root runs the network helper as nobody (uid 65534), who cannot run %s: %v; install it where every user may run it (e.g. /usr/local/libexec/safe-run/)", helper, err)
		}
	}
	dir, err := os.MkdirTemp("", "safe-run-netcheck-")
	if err != nil {
		return link, fmt.Errorf("network check: %w", err)
	}
	defer os.RemoveAll(dir)
	n, err := createNet(dir, link)
	if err != nil {
		return link, err
	}
	n.remove()
	return link, nil
}

// othersCanExec reports whether a user who owns none of path's
// directories can run it: every directory searchable, the file executable.
func othersCanExec(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o001 == 0 {
		return fmt.Errorf("%s is not executable by others (mode %v)", path, fi.Mode().Perm())
	}
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("directory %s is not searchable by others (mode %v)", dir, fi.Mode().Perm())
		}
		if dir == "/" {
			return nil
		}
	}
}

// networkFix says how to make networked sandboxes work after err.
func networkFix(link string, err error) string {
	switch {
	case link == LinkTap && errors.Is(err, os.ErrPermission):
		return "/dev/net/tun cannot be opened by this user: use the veth link (--net-link veth), or as root: chmod 0666 /dev/net/tun"
	case errors.Is(err, unix.EPERM):
		return "this process may not create network namespaces or links: run safe-run as root, or as an ordinary user with user namespaces enabled (see doctor)"
	case link == LinkVeth && errors.Is(err, unix.EOPNOTSUPP):
		return "the kernel lacks veth (CONFIG_VETH): load it as root with modprobe veth, or use the TAP link"
	}
	return "check that the kernel supports network namespaces (CONFIG_NET_NS) and " + link + " devices"
}

// ErrNetHelper is the network helper (safe-run-net), which NetworkCheck
// looks for.
var ErrNetHelper = errors.New("safe-run-net")

// netHelper is the path of the network helper: Config.NetHelper, else
// safe-run-net beside the agent.
func (cfg Config) netHelper() (string, error) {
	if cfg.NetHelper != "" {
		return filepath.Abs(cfg.NetHelper)
	}
	if cfg.Agent == "" {
		return "", partError(ErrNetHelper, "safe-run-net not found: no agent path to look beside")
	}
	agent, err := filepath.Abs(cfg.Agent)
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(agent), "safe-run-net"), nil
}
