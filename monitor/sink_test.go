package monitor

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"

	"github.com/safe-run/safe-run/sandbox"
)

// testSink plays runsc's remote sink: a SOCK_SEQPACKET client that does the
// handshake and sends points as wire.Header + protobuf, as remote.go does.
type testSink struct {
	t  testing.TB
	fd int
}

// startMonitor starts a monitor on a socket in a test directory.
func startMonitor(t testing.TB, opts Options) *Monitor {
	t.Helper()
	m, err := Start(filepath.Join(t.TempDir(), "trace.sock"), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// dialRaw connects to the monitor without the handshake.
func dialRaw(t testing.TB, m *Monitor) *testSink {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: m.path}); err != nil {
		unix.Close(fd)
		t.Fatalf("connect %s: %v", m.path, err)
	}
	s := &testSink{t: t, fd: fd}
	t.Cleanup(s.close)
	return s
}

// dial connects and does the sink's handshake, checking the answer.
func dial(t testing.TB, m *Monitor) *testSink {
	t.Helper()
	s := dialRaw(t, m)
	out, _ := proto.Marshal(&pb.Handshake{Version: wire.CurrentVersion})
	s.raw(out)
	unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	in := make([]byte, 10240)
	n, err := unix.Read(s.fd, in)
	if err != nil {
		t.Fatalf("read handshake answer: %v", err)
	}
	var hs pb.Handshake
	if err := proto.Unmarshal(in[:n], &hs); err != nil || hs.Version < 1 {
		t.Fatalf("handshake answer %x: %v (version %d)", in[:n], err, hs.Version)
	}
	return s
}

// raw sends one message as is.
func (s *testSink) raw(b []byte) {
	s.t.Helper()
	if _, err := unix.Write(s.fd, b); err != nil {
		s.t.Fatalf("write: %v", err)
	}
}

// frame is a point as the sink frames it.
func frame(typ pb.MessageType, dropped uint32, msg proto.Message) []byte {
	out, err := proto.Marshal(msg)
	if err != nil {
		panic(err)
	}
	h := wire.Header{HeaderSize: wire.HeaderStructSize, MessageType: uint16(typ), DroppedCount: dropped}
	buf := make([]byte, wire.HeaderStructSize, wire.HeaderStructSize+len(out))
	h.MarshalBytes(buf)
	return append(buf, out...)
}

// send sends points (a message type is inferred from the point's type).
func (s *testSink) send(points ...proto.Message) {
	s.t.Helper()
	for _, p := range points {
		s.raw(frame(typeOf(p), 0, p))
	}
}

// close ends the stream, as runsc does when the sandbox ends.
func (s *testSink) close() {
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// typeOf is the message type the sink sends a point as.
func typeOf(p proto.Message) pb.MessageType {
	switch p.(type) {
	case *pb.Start:
		return pb.MessageType_MESSAGE_CONTAINER_START
	case *pb.ExecveInfo:
		return pb.MessageType_MESSAGE_SENTRY_EXEC
	case *pb.CloneInfo:
		return pb.MessageType_MESSAGE_SENTRY_CLONE
	case *pb.ExitNotifyParentInfo:
		return pb.MessageType_MESSAGE_SENTRY_EXIT_NOTIFY_PARENT
	case *pb.Open:
		return pb.MessageType_MESSAGE_SYSCALL_OPEN
	case *pb.Connect:
		return pb.MessageType_MESSAGE_SYSCALL_CONNECT
	case *pb.Socket:
		return pb.MessageType_MESSAGE_SYSCALL_SOCKET
	case *pb.Bind:
		return pb.MessageType_MESSAGE_SYSCALL_BIND
	case *pb.Listen:
		return pb.MessageType_MESSAGE_SYSCALL_LISTEN
	case *pb.Accept:
		return pb.MessageType_MESSAGE_SYSCALL_ACCEPT
	case *pb.Syscall:
		return pb.MessageType_MESSAGE_SYSCALL_RAW
	case *pb.Read:
		return pb.MessageType_MESSAGE_SYSCALL_READ
	}
	panic("no message type for the point")
}

// finish ends the stream and the monitor, and returns the whole activity.
func finish(t testing.TB, m *Monitor, s *testSink) sandbox.Activity {
	t.Helper()
	s.close()
	if err := closeWithin(m, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return m.Total()
}

// closeWithin closes m and fails when that takes longer than d.
func closeWithin(m *Monitor, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return errors.New("Close did not return within " + d.String())
	}
}

// The points of a synthetic stream.

func ctx(pid, ppid int32) *pb.ContextData {
	return &pb.ContextData{ThreadGroupId: pid, ParentThreadGroupId: ppid, Cwd: "/workspace"}
}

func start(args ...string) *pb.Start {
	return &pb.Start{ContextData: ctx(1, 0), Id: "c", Args: args}
}

func execve(pid, ppid int32, binary string, argv ...string) *pb.ExecveInfo {
	return &pb.ExecveInfo{ContextData: ctx(pid, ppid), BinaryPath: binary, Argv: argv}
}

// named gives an execve point the caller's process name (its comm).
func named(e *pb.ExecveInfo, name string) *pb.ExecveInfo {
	e.ContextData.ProcessName = name
	return e
}

func fork(parent, child int32) *pb.CloneInfo {
	return &pb.CloneInfo{ContextData: ctx(parent, 0), CreatedThreadId: child, CreatedThreadGroupId: child}
}

func thread(parent, tid int32) *pb.CloneInfo {
	return &pb.CloneInfo{ContextData: ctx(parent, 0), CreatedThreadId: tid, CreatedThreadGroupId: parent,
		Flags: unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND}
}

func exited(pid int32, code int) *pb.ExitNotifyParentInfo {
	return &pb.ExitNotifyParentInfo{ContextData: ctx(pid, 0), ExitStatus: int32(code << 8)}
}

func killed(pid int32, sig unix.Signal) *pb.ExitNotifyParentInfo {
	return &pb.ExitNotifyParentInfo{ContextData: ctx(pid, 0), ExitStatus: int32(sig)}
}

func openat(pid int32, name string, flags uint32, errno int64) *pb.Open {
	return &pb.Open{ContextData: ctx(pid, 0), Sysno: unix.SYS_OPENAT, Fd: -100, Pathname: name, Flags: flags,
		Exit: &pb.Exit{Result: 3, Errorno: errno}}
}

func inet4(ip [4]byte, port uint16) []byte {
	b := make([]byte, 16)
	binary.NativeEndian.PutUint16(b, unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], port)
	copy(b[4:], ip[:])
	return b
}

func connect(pid int32, addr []byte, errno int64) *pb.Connect {
	return &pb.Connect{ContextData: ctx(pid, 0), Sysno: unix.SYS_CONNECT, Fd: 3, Address: addr,
		Exit: &pb.Exit{Result: -1, Errorno: errno}}
}

func bind(pid int32, addr []byte) *pb.Bind {
	return &pb.Bind{ContextData: ctx(pid, 0), Sysno: unix.SYS_BIND, Fd: 3, Address: addr, Exit: &pb.Exit{}}
}

func socket(pid int32, domain, typ int32) *pb.Socket {
	return &pb.Socket{ContextData: ctx(pid, 0), Sysno: unix.SYS_SOCKET, Domain: domain, Type: typ, Exit: &pb.Exit{Result: 3}}
}
