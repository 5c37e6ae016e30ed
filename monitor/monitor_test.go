package monitor

import (
	"encoding/json"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"github.com/safe-run/safe-run/sandbox"
)

const python = "/usr/local/bin/python3.12"

// coldRun is what a cold run of a pure-Python program sends: the agent
// starts, forks and execs the interpreter, which exits.
func coldRun(extra ...proto.Message) []proto.Message {
	pts := []proto.Message{start("/safe-run-agent"), fork(1, 2), execve(2, 1, python, "python3", "-c", "print(1)")}
	pts = append(pts, extra...)
	return append(pts, exited(2, 0))
}

func TestActivityOfAStream(t *testing.T) {
	m := startMonitor(t, Options{})
	s := dial(t, m)
	s.send(coldRun(
		thread(2, 3),
		fork(2, 4), execve(4, 2, "/usr/bin/dash", "sh", "-c", "curl x"),
		fork(4, 5), execve(5, 4, "/usr/bin/curl", "curl", "x"),
		socket(5, unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC),
		connect(5, inet4([4]byte{10, 0, 0, 1}, 443), int64(unix.ENETUNREACH)),
		killed(5, unix.SIGKILL), exited(4, 7),
		openat(2, "/workspace/out.csv", unix.O_WRONLY|unix.O_CREAT, 0),
		openat(2, "notes.txt", unix.O_WRONLY|unix.O_CREAT, 0), // relative to /workspace
		openat(2, "/tmp/x", unix.O_RDWR, 0),
		openat(2, "/dev/null", unix.O_WRONLY, 0),
		openat(2, "/etc/passwd", unix.O_RDONLY, 0),
		openat(2, "/etc/cron.d/job", unix.O_WRONLY|unix.O_CREAT, 0),
		openat(2, "/etc/cron.d/job", unix.O_WRONLY, 0), // once in the list
		openat(2, "/usr/lib/nope", unix.O_WRONLY, int64(unix.EROFS)),
		openat(2, "/proc/self/environ", unix.O_RDONLY, 0),
		openat(2, "/etc/shadow", unix.O_RDONLY, int64(unix.EACCES)),
	)...)
	got := finish(t, m, s)

	want := []sandbox.Process{
		{PID: 2, Parent: 1, Binary: python, Argv: []string{"python3", "-c", "print(1)"}, Exited: true},
		{PID: 4, Parent: 2, Binary: "/usr/bin/dash", Argv: []string{"sh", "-c", "curl x"}, Exited: true, ExitCode: 7},
		{PID: 5, Parent: 4, Binary: "/usr/bin/curl", Argv: []string{"curl", "x"}, Exited: true, Signal: "SIGKILL"},
	}
	if !reflect.DeepEqual(got.Processes, want) {
		t.Errorf("processes:\n got %+v\nwant %+v", got.Processes, want)
	}
	if got.Clones != 3 || got.Threads != 1 {
		t.Errorf("clones %d threads %d, want 3 and 1", got.Clones, got.Threads)
	}
	wantNet := []sandbox.NetworkAttempt{
		{Op: "socket", PID: 5, Family: "inet", Type: "stream", Result: "ok"},
		{Op: "connect", PID: 5, Family: "inet", Address: "10.0.0.1:443", Result: "ENETUNREACH"},
	}
	if !reflect.DeepEqual(got.Network, wantNet) {
		t.Errorf("network:\n got %+v\nwant %+v", got.Network, wantNet)
	}
	if want := []string{"/etc/cron.d/job"}; !reflect.DeepEqual(got.FilesWritten, want) {
		t.Errorf("files written %q, want %q", got.FilesWritten, want)
	}
	if want := []string{"/proc/self/environ", "/etc/shadow (EACCES)"}; !reflect.DeepEqual(got.SensitiveReads, want) {
		t.Errorf("sensitive reads %q, want %q", got.SensitiveReads, want)
	}
	rules := hitNames(got)
	if want := []string{"shell-from-python", "sensitive-read", "sensitive-read"}; !reflect.DeepEqual(rules, want) {
		t.Errorf("rules %q, want %q (%+v)", rules, want, got.Rules)
	}
	if got.Events["sentry_exec"] != 3 || got.Events["open"] != 10 || got.Events["connect"] != 1 {
		t.Errorf("events %v", got.Events)
	}
	if got.Lost != "" || got.Dropped != 0 {
		t.Errorf("lost %q dropped %d", got.Lost, got.Dropped)
	}
	if !got.Notable() {
		t.Error("not notable")
	}
}

func hitNames(a sandbox.Activity) []string {
	var names []string
	for _, h := range a.Rules {
		names = append(names, h.Rule)
	}
	return names
}

func TestColdRunIsNotNotable(t *testing.T) {
	m := startMonitor(t, Options{})
	s := dial(t, m)
	s.send(coldRun(thread(2, 3), openat(2, "/usr/lib/python3.12/os.py", unix.O_RDONLY, 0))...)
	got := finish(t, m, s)
	if got.Notable() || len(got.Processes) != 1 || got.Clones != 1 {
		t.Errorf("a pure-Python cold run is notable (%s): %+v", got.Summary(), got)
	}
}

// TestRules checks every default rule against a stream that fires it and
// one that does not.
func TestRules(t *testing.T) {
	storm := func(n int, f func(i int) proto.Message) []proto.Message {
		var pts []proto.Message
		for i := range n {
			pts = append(pts, f(i))
		}
		return pts
	}
	const rw = unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC
	cases := []struct {
		rule     string
		fire, no []proto.Message
	}{
		{"exec-not-in-image",
			coldRun(fork(2, 4), execve(4, 2, "/tmp/a.out", "./a.out")),
			coldRun(fork(2, 4), execve(4, 2, "/usr/bin/ls", "ls"))},
		{"exec-not-in-image", // a memfd (fileless)
			coldRun(fork(2, 4), &pb.ExecveInfo{ContextData: ctx(4, 2), BinaryPath: "/memfd:x (deleted)", BinaryInMemfd: true}),
			coldRun(fork(2, 4), &pb.ExecveInfo{ContextData: ctx(4, 2), BinaryPath: "/usr/bin/ls"})},
		{"exec-written-file",
			coldRun(openat(2, "/workspace/tool", rw, 0), fork(2, 4), execve(4, 2, "/workspace/tool", "./tool")),
			coldRun(openat(2, "/workspace/tool", unix.O_RDONLY, 0), fork(2, 4), execve(4, 2, "/workspace/tool", "./tool"))},
		{"exec-written-file", // written through a relative path, and a failed write does not count
			coldRun(openat(2, "bin/x", rw, 0), fork(2, 4), execve(4, 2, "/workspace/bin/x")),
			coldRun(openat(2, "bin/x", rw, int64(unix.EACCES)), fork(2, 4), execve(4, 2, "/workspace/bin/x"))},
		{"shell-from-python",
			coldRun(fork(2, 4), execve(4, 2, "/usr/bin/dash", "/bin/sh", "-c", "true")),
			coldRun(fork(2, 4), execve(4, 2, "/usr/bin/git", "git", "status"))},
		{"shell-from-python", // python replacing itself with a shell (os.execv)
			coldRun(execve(2, 1, "/bin/sh", "sh")),
			coldRun(execve(2, 1, "/usr/bin/ls", "ls"))},
		{"shell-from-python", // a shell started by the agent is not one
			[]proto.Message{start("/safe-run-agent"), fork(1, 2), execve(2, 1, python), fork(2, 3), execve(3, 2, "/bin/bash")},
			[]proto.Message{start("/safe-run-agent"), fork(1, 2), execve(2, 1, "/bin/bash")}},
		{"shell-from-python", // a restored sandbox: the warm python's start is not in the stream, its name is
			[]proto.Message{fork(7, 9), named(execve(9, 7, "/usr/bin/dash", "sh", "-c", "true"), "python3")},
			[]proto.Message{fork(7, 9), named(execve(9, 7, "/usr/bin/dash", "sh", "-c", "true"), "node")}},
		{"miner-name",
			coldRun(fork(2, 4), execve(4, 2, "/tmp/.x/xmrig-6.21", "xmrig")),
			coldRun(fork(2, 4), execve(4, 2, "/usr/bin/make", "make"))},
		{"miner-pool-port",
			coldRun(connect(2, inet4([4]byte{198, 51, 100, 7}, 3333), int64(unix.ENETUNREACH))),
			coldRun(connect(2, inet4([4]byte{198, 51, 100, 7}, 443), int64(unix.ENETUNREACH)))},
		{"connect-storm",
			coldRun(storm(20, func(i int) proto.Message {
				return connect(2, inet4([4]byte{10, 0, 0, byte(i)}, 80), int64(unix.ENETUNREACH))
			})...),
			coldRun(storm(19, func(i int) proto.Message {
				return connect(2, inet4([4]byte{10, 0, 0, byte(i)}, 80), int64(unix.ENETUNREACH))
			})...)},
		{"connect-storm", // unix connects (glibc's nscd probe) do not count
			coldRun(append(storm(19, func(i int) proto.Message {
				return connect(2, append([]byte{1, 0}, "/run/nscd/socket"...), int64(unix.ENOENT))
			}),
				storm(20, func(i int) proto.Message {
					return connect(2, inet4([4]byte{10, 0, 0, byte(i)}, 80), int64(unix.ENETUNREACH))
				})...)...),
			coldRun(storm(40, func(i int) proto.Message {
				return connect(2, append([]byte{1, 0}, "/run/nscd/socket"...), int64(unix.ENOENT))
			})...)},
		{"fork-storm",
			coldRun(storm(199, func(i int) proto.Message { return fork(2, int32(100+i)) })...),
			coldRun(storm(198, func(i int) proto.Message { return fork(2, int32(100+i)) })...)},
		{"sensitive-read",
			coldRun(openat(2, "/proc/1/environ", unix.O_RDONLY, 0)),
			coldRun(openat(2, "/proc/1/status", unix.O_RDONLY, 0))},
	}
	for _, c := range cases {
		for _, fire := range []bool{true, false} {
			name := c.rule + "/no"
			pts := c.no
			if fire {
				name, pts = c.rule+"/fires", c.fire
			}
			t.Run(name, func(t *testing.T) {
				m := startMonitor(t, Options{})
				s := dial(t, m)
				s.send(pts...)
				got := finish(t, m, s)
				n := 0
				for _, h := range got.Rules {
					if h.Rule == c.rule {
						n++
						if h.Action != "record" || h.Event == "" {
							t.Errorf("hit %+v", h)
						}
					}
				}
				if fire && n != 1 || !fire && n != 0 {
					t.Errorf("rule %s fired %d times, want %v: %+v", c.rule, n, fire, got.Rules)
				}
			})
		}
	}
}

func TestMonitorIncompleteRule(t *testing.T) {
	m := startMonitor(t, Options{})
	s := dial(t, m)
	s.send(coldRun()...)
	s.raw(frame(pb.MessageType_MESSAGE_SENTRY_CLONE, 5, fork(2, 9)))
	s.raw(frame(pb.MessageType_MESSAGE_SENTRY_CLONE, 7, fork(2, 10)))
	got := finish(t, m, s)
	if got.Dropped != 7 {
		t.Errorf("dropped %d, want 7", got.Dropped)
	}
	if names := hitNames(got); !slices.Contains(names, "monitor-incomplete") {
		t.Errorf("monitor-incomplete did not fire: %q", names)
	}
}

func TestKillAction(t *testing.T) {
	rules, err := ParseRules([]byte(`[{"name": "shell-from-python", "action": "kill"}]`))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	hits := make(chan sandbox.RuleHit, 4)
	m := startMonitor(t, Options{Rules: rules, OnKill: func(h sandbox.RuleHit) { calls.Add(1); hits <- h }})
	s := dial(t, m)
	s.send(coldRun(fork(2, 4), execve(4, 2, "/bin/sh"), fork(2, 5), execve(5, 2, "/bin/bash"))...)
	select {
	case h := <-hits:
		if h.Rule != "shell-from-python" || h.Action != "kill" || !strings.Contains(h.Event, "/bin/sh") {
			t.Errorf("kill hit %+v", h)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnKill not called")
	}
	got := finish(t, m, s)
	if n := calls.Load(); n != 1 {
		t.Errorf("OnKill called %d times, want once", n)
	}
	if names := hitNames(got); len(names) != 2 {
		t.Errorf("hits %q, want both shells recorded", names)
	}
}

func TestTakeAndTotal(t *testing.T) {
	m := startMonitor(t, Options{})
	s := dial(t, m)
	// A pooled sandbox's warm-up: the interpreter starts.
	s.send(start("/safe-run-agent"), fork(1, 2), execve(2, 1, python))
	warm := m.Take()
	if len(warm.Processes) != 1 {
		t.Fatalf("warm-up: %+v", warm)
	}
	// The first call starts a shell.
	s.send(fork(2, 4), execve(4, 2, "/bin/sh"), exited(4, 0))
	first := m.Take()
	if len(first.Processes) != 1 || first.Processes[0].Binary != "/bin/sh" || !first.Processes[0].Exited {
		t.Errorf("first call processes %+v", first.Processes)
	}
	if names := hitNames(first); !reflect.DeepEqual(names, []string{"shell-from-python"}) {
		t.Errorf("first call rules %q (the parent from the warm-up must be known)", names)
	}
	// The second does nothing notable.
	second := m.Take()
	if second.Notable() {
		t.Errorf("second call: %+v", second)
	}
	total := finish(t, m, s)
	if len(total.Processes) != 2 || total.Clones != 2 {
		t.Errorf("total %+v", total)
	}
}

// TestHostileStreams feeds what a compromised sandbox could make its sink
// send: the monitor ends monitoring with a reason, or bounds what it keeps,
// and never stalls.
func TestHostileStreams(t *testing.T) {
	hugeArgv := make([]string, 1500) // 150 KB: a unix socket takes no message over its send buffer (~208 KiB)
	for i := range hugeArgv {
		hugeArgv[i] = strings.Repeat("A", 100)
	}
	cases := []struct {
		name string
		// lim are the limits the monitor runs with.
		lim Limits
		// feed sends the stream.
		feed func(s *testSink)
		// lost is a part of Activity.Lost, "" for monitoring to go on.
		lost string
		// check looks at the activity.
		check func(t *testing.T, a sandbox.Activity)
	}{
		{name: "shorter than a header", lost: "shorter than the 8-byte header",
			feed: func(s *testSink) { s.raw([]byte{8, 0, 3}) }},
		{name: "header size past the message", lost: "header claims",
			feed: func(s *testSink) { s.raw([]byte{200, 0, 3, 0, 0, 0, 0, 0, 1}) }},
		{name: "header size too small", lost: "header claims",
			feed: func(s *testSink) { s.raw([]byte{2, 0, 3, 0, 0, 0, 0, 0}) }},
		{name: "unknown type", lost: "unknown type",
			feed: func(s *testSink) { s.raw(frame(pb.MessageType(999), 0, &pb.Start{})) }},
		{name: "garbage protobuf", lost: "does not decode",
			feed: func(s *testSink) {
				b := frame(pb.MessageType_MESSAGE_SENTRY_EXEC, 0, &pb.ExecveInfo{})
				s.raw(append(b, 0xff, 0xff, 0xff, 0xff, 0xff))
			}},
		{name: "truncated protobuf", lost: "does not decode",
			feed: func(s *testSink) {
				b := frame(pb.MessageType_MESSAGE_SENTRY_EXEC, 0, execve(4, 2, "/bin/sh", "sh", "-c", "long enough"))
				s.raw(b[:len(b)-3])
			}},
		{name: "garbage after the stream ends monitoring", lost: "does not decode",
			feed: func(s *testSink) {
				s.send(coldRun()...)
				s.raw(append(frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{}), 0x0a, 0x7f))
				// The monitor closes its end: the sink's writes fail
				// (runsc drops them), or are not read.
				for _, p := range []proto.Message{fork(2, 4), execve(4, 2, "/bin/sh")} {
					unix.Write(s.fd, frame(typeOf(p), 0, p))
				}
			},
			check: func(t *testing.T, a sandbox.Activity) {
				if len(a.Processes) != 1 {
					t.Errorf("events after the garbage were applied: %+v", a.Processes)
				}
				if !slices.Contains(hitNames(a), "monitor-incomplete") {
					t.Errorf("monitor-incomplete did not fire: %+v", a.Rules)
				}
			}},
		{name: "oversized execve keeps its start", lim: Limits{MaxMessage: 64 << 10},
			feed: func(s *testSink) {
				s.send(coldRun(fork(2, 4), execve(4, 2, "/usr/bin/dash", append([]string{"sh", "-c"}, hugeArgv...)...))...)
			},
			check: func(t *testing.T, a sandbox.Activity) {
				if len(a.Processes) != 2 || a.Processes[1].Binary != "/usr/bin/dash" || !a.Processes[1].ArgvTruncated ||
					len(a.Processes[1].Argv) != 16 || a.Processes[1].Argv[0] != "sh" {
					t.Errorf("processes %+v", a.Processes)
				}
				if a.Events["cut"] != 1 || !slices.Contains(hitNames(a), "shell-from-python") {
					t.Errorf("events %v rules %+v", a.Events, a.Rules)
				}
			}},
		{name: "caps hold", lim: Limits{MaxProcesses: 5, MaxList: 3, MaxArgs: 2, MaxArgLen: 8, MaxPathLen: 16},
			feed: func(s *testSink) {
				for i := range int32(50) {
					s.send(fork(1, 100+i), execve(100+i, 1, "/usr/bin/"+strings.Repeat("x", 40), "a", "bbbbbbbbbbbbbb", "c"),
						connect(100+i, inet4([4]byte{10, 0, 0, 1}, 80), 0),
						openat(100+i, "/etc/f"+strings.Repeat("y", int(i)), unix.O_WRONLY, 0),
						openat(100+i, "/proc/"+string(rune('a'+i))+"/environ", unix.O_RDONLY, 0))
				}
			},
			check: func(t *testing.T, a sandbox.Activity) {
				if len(a.Processes) != 5 || !a.ProcessesTruncated || len(a.Network) != 3 || !a.NetworkTruncated ||
					len(a.FilesWritten) != 3 || !a.FilesWrittenTruncated || len(a.SensitiveReads) != 3 ||
					!a.SensitiveReadsTruncated || len(a.Rules) != 3 || !a.RulesTruncated {
					t.Errorf("caps: %d processes, %d network, %d files, %d sensitive, %d rules",
						len(a.Processes), len(a.Network), len(a.FilesWritten), len(a.SensitiveReads), len(a.Rules))
				}
				p := a.Processes[0]
				if len(p.Argv) != 2 || p.Argv[1] != "bbbbbbbb…" || !p.ArgvTruncated || len(p.Binary) > 16+len("…") {
					t.Errorf("process %+v", p)
				}
				if a.Events["sentry_exec"] != 50 || a.Events["open"] != 100 {
					t.Errorf("events %v", a.Events)
				}
			}},
		{name: "total bound", lim: Limits{MaxEvents: 100}, lost: "more than 100 events",
			feed: func(s *testSink) {
				for i := range int32(150) {
					unix.Write(s.fd, frame(pb.MessageType_MESSAGE_SENTRY_CLONE, 0, fork(2, 10+i))) // fails once monitoring ends
				}
			},
			check: func(t *testing.T, a sandbox.Activity) {
				if a.Clones != 100 {
					t.Errorf("clones %d, want the 100 before the bound", a.Clones)
				}
			}},
		{name: "not a handshake", lost: "handshake",
			feed: func(s *testSink) { s.raw([]byte{0xff, 0xff, 0xff}) }},
		{name: "handshake version 0", lost: "handshake: sink version 0",
			feed: func(s *testSink) { s.raw([]byte{0x08, 0x00}) }},
		{name: "empty message", lost: "an empty message",
			feed: func(s *testSink) {
				s.send(coldRun()...)
				s.raw([]byte{})
			}},
		{name: "control characters are escaped",
			feed: func(s *testSink) {
				s.send(coldRun(openat(2, "/etc/a\nb\x1b[31m", unix.O_WRONLY, 0))...)
			},
			check: func(t *testing.T, a sandbox.Activity) {
				if want := []string{`/etc/a\nb\x1b[31m`}; !reflect.DeepEqual(a.FilesWritten, want) {
					t.Errorf("files written %q, want %q", a.FilesWritten, want)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := startMonitor(t, Options{Limits: c.lim})
			var s *testSink
			if strings.HasPrefix(c.name, "not a handshake") || strings.HasPrefix(c.name, "handshake") {
				s = dialRaw(t, m)
			} else {
				s = dial(t, m)
			}
			c.feed(s)
			if c.lost != "" {
				// Wait for the monitor to see it (it may not even have
				// accepted a connection that did no handshake yet).
				for deadline := time.Now().Add(5 * time.Second); m.Total().Lost == "" && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			}
			got := finish(t, m, s)
			if c.lost == "" && got.Lost != "" || !strings.Contains(got.Lost, c.lost) {
				t.Errorf("lost %q, want %q", got.Lost, c.lost)
			}
			if c.check != nil {
				c.check(t, got)
			}
		})
	}
}

// TestFloodAndClose floods the monitor the way a busy sandbox would (a
// non-blocking sink that drops on a full socket, as runsc's does) and
// checks that Close returns promptly while the flood goes on.
func TestFloodAndClose(t *testing.T) {
	// The limiter fills from the monitor's start: the bound counts from it.
	began := time.Now()
	m := startMonitor(t, Options{Limits: Limits{EventsPerSecond: 1000, Settle: 50 * time.Millisecond}})
	s := dial(t, m)
	if err := unix.SetNonblock(s.fd, true); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	sent, dropped := atomic.Int64{}, atomic.Int64{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		msg := frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, openat(2, "/etc/x", unix.O_WRONLY, 0))
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := unix.Write(s.fd, msg); err == nil {
				sent.Add(1)
			} else if err == unix.EAGAIN {
				dropped.Add(1)
				time.Sleep(100 * time.Microsecond)
			} else {
				return
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	mid := m.Total().Events["open"]
	bound := 2000 + int(1000*time.Since(began).Seconds()) + 1
	if mid > bound {
		t.Errorf("decoded %d of %d sent at 1000/s (burst 2000), more than %d", mid, sent.Load(), bound)
	}
	if err := closeWithin(m, 2*time.Second); err != nil {
		t.Error(err)
	}
	close(stop)
	<-done
	got := m.Total()
	if dropped.Load() == 0 {
		t.Errorf("the sink never found the socket full (sent %d): the rate bound did not hold", sent.Load())
	}
	if n := got.Events["open"]; int64(n) > sent.Load() || n < mid {
		t.Errorf("decoded %d of %d sent in all, %d before Close", n, sent.Load(), mid)
	}
	if len(got.FilesWritten) != 1 {
		t.Errorf("files %q", got.FilesWritten)
	}
}

func TestExtraConnections(t *testing.T) {
	m := startMonitor(t, Options{Limits: Limits{MaxConnections: 1}})
	s := dial(t, m)
	s.send(coldRun()...)
	extra := dialRaw(t, m)
	extra.close()
	// The extra connection is refused when the monitor accepts it, which
	// may come after Close stops listening: wait for it first.
	for deadline := time.Now().Add(10 * time.Second); m.Total().Lost == "" && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	got := finish(t, m, s)
	if !strings.Contains(got.Lost, "more than 1 trace connections") {
		t.Errorf("lost %q", got.Lost)
	}
}

func TestSessionConfig(t *testing.T) {
	seccheck.Initialize()
	for _, level := range []Level{LevelDefault, LevelFull} {
		t.Run(string(level), func(t *testing.T) {
			m := startMonitor(t, Options{Level: level})
			var conf struct {
				TraceSession seccheck.SessionConfig `json:"trace_session"`
			}
			dec := json.NewDecoder(strings.NewReader(string(m.SessionConfig())))
			dec.DisallowUnknownFields() // as runsc reads it
			if err := dec.Decode(&conf); err != nil {
				t.Fatal(err)
			}
			ts := conf.TraceSession
			if ts.Name != seccheck.DefaultSessionName || len(ts.Sinks) != 1 || ts.Sinks[0].Name != "remote" ||
				ts.Sinks[0].Config["endpoint"] != m.path || ts.IgnoreMissing {
				t.Errorf("session %+v", ts)
			}
			names := map[string]bool{}
			for _, p := range ts.Points {
				desc, ok := seccheck.Points[p.Name]
				if !ok {
					t.Errorf("point %q is not runsc's", p.Name)
					continue
				}
				names[p.Name] = true
				for _, f := range p.OptionalFields {
					if !slices.ContainsFunc(desc.OptionalFields, func(d seccheck.FieldDesc) bool { return d.Name == f }) {
						t.Errorf("point %s has no optional field %q", p.Name, f)
					}
				}
				for _, f := range p.ContextFields {
					if !slices.ContainsFunc(desc.ContextFields, func(d seccheck.FieldDesc) bool { return d.Name == f }) {
						t.Errorf("point %s has no context field %q", p.Name, f)
					}
				}
			}
			for _, must := range []string{"sentry/execve", "sentry/clone", "sentry/exit_notify_parent", "syscall/connect/exit", "syscall/openat/exit"} {
				if !names[must] {
					t.Errorf("no %s", must)
				}
			}
			if full := names["syscall/listen/exit"]; full != (level == LevelFull) {
				t.Errorf("listen point at level %s: %v", level, full)
			}
		})
	}
}

// TestPointsInRegistry: the points a level's session names are exactly
// those of its list that runsc's registry has, whether points filled the
// registry (other architectures) or trusted registryHasAll (amd64).
func TestPointsInRegistry(t *testing.T) {
	seccheck.Initialize()
	for _, level := range []Level{LevelDefault, LevelFull} {
		all := defaultPoints
		if level == LevelFull {
			all = append(append([]pointSpec(nil), defaultPoints...), fullPoints...)
		}
		var want []string
		for _, p := range all {
			if _, ok := seccheck.Points[p.name]; ok {
				want = append(want, p.name)
			}
		}
		var got []string
		for _, p := range points(level) {
			got = append(got, p.name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("level %s: points %v, registry has %v", level, got, want)
		}
		if registryHasAll && len(want) != len(all) {
			t.Errorf("level %s: registryHasAll on %s, but the registry lacks %d of its %d points", level, runtime.GOARCH, len(all)-len(want), len(all))
		}
	}
}

func TestStartRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Level: LevelOff}, "level off"},
		{Options{Level: "most"}, `monitor level "most"`},
		{Options{Rules: []Rule{{Name: "x", Event: "exec", Ports: []int{1}}}}, "ports applies only"},
	} {
		if _, err := Start(dir+"/s", c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Start(%+v) = %v, want %q", c.opts, err, c.want)
		}
	}
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]Level{"": LevelDefault, "off": LevelOff, "default": LevelDefault, "full": LevelFull} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseLevel("Full"); err == nil || !strings.Contains(err.Error(), "off, default and full") {
		t.Errorf("ParseLevel(Full) = %v", err)
	}
}

func TestParseRules(t *testing.T) {
	defaults := len(DefaultRules())
	cases := []struct {
		in   string
		want string // error part, or "" for success
		n    int    // rules in effect
		test func(t *testing.T, rules []Rule)
	}{
		{in: `[]`, n: defaults},
		{in: `[{"name": "shell-from-python", "action": "kill"}]`, n: defaults, test: func(t *testing.T, rules []Rule) {
			i := slices.IndexFunc(rules, func(r Rule) bool { return r.Name == "shell-from-python" })
			if rules[i].Action != ActionKill || len(rules[i].Names) == 0 {
				t.Errorf("rule %+v", rules[i])
			}
		}},
		{in: `[{"name": "fork-storm", "action": "off"}]`, n: defaults - 1},
		{in: `[{"name": "no-gcc", "event": "exec", "names": ["gcc", "cc1"], "action": "deny-future-calls"}]`, n: defaults + 1,
			test: func(t *testing.T, rules []Rule) {
				if r := rules[len(rules)-1]; r.Name != "no-gcc" || r.Action != ActionDenyFutureCalls {
					t.Errorf("rule %+v", r)
				}
			}},
		{in: `[{"name": "c", "event": "connect", "count": 5}]`, n: defaults + 1, test: func(t *testing.T, rules []Rule) {
			if r := rules[len(rules)-1]; r.Action != ActionRecord {
				t.Errorf("default action %q", r.Action)
			}
		}},
		{in: `{"rules": []}`, want: "JSON array of rules"},
		{in: `[{"name": "x", "evnt": "exec"}]`, want: `unknown field "evnt"; a rule's fields are`},
		{in: `[{"event": "exec"}]`, want: "rule 1 has no name"},
		{in: `[{"name": "a", "event": "exec"}, {"name": "a", "event": "exec"}]`, want: `rule 2 ("a"): the name is given twice`},
		{in: `[{"name": "a", "event": "exec", "action": "kil"}]`, want: `unknown action "kil"`},
		{in: `[{"name": "a", "event": "exe"}]`, want: `unknown event "exe"`},
		{in: `[{"name": "a"}]`, want: "no event, and no default rule has that name"},
		{in: `[{"name": "fork-storm"}]`, want: "neither an event nor an action"},
		{in: `[{"name": "a", "event": "open", "ports": [80]}]`, want: "ports applies only to the event connect or bind"},
		{in: `[{"name": "a", "event": "connect", "ports": [70000]}]`, want: "port 70000 is out of range"},
		{in: `[{"name": "a", "event": "connect", "families": ["ipv4"]}]`, want: `family "ipv4" is not one of inet, inet6`},
		{in: `[{"name": "a", "event": "exec", "families": ["inet"]}]`, want: "families applies only to the event connect or bind"},
		{in: `[{"name": "a", "event": "exec", "names": ["[x"]}]`, want: `pattern "[x" is not a valid glob`},
		{in: `[{"name": "a", "event": "clone", "count": -1}]`, want: "count -1 is negative"},
		{in: `[{"name": "a", "event": "exec", "action": "off"}]`, want: "action off with an event"},
		{in: `[] []`, want: "more than one JSON value"},
	}
	for _, c := range cases {
		rules, err := ParseRules([]byte(c.in))
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("ParseRules(%s) = %v, want one line with %q", c.in, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseRules(%s): %v", c.in, err)
			continue
		}
		if len(rules) != c.n {
			t.Errorf("ParseRules(%s): %d rules, want %d", c.in, len(rules), c.n)
		}
		if c.test != nil {
			c.test(t, rules)
		}
	}
}

func TestDefaultRulesAreValid(t *testing.T) {
	for _, r := range DefaultRules() {
		if err := r.check(); err != nil || r.Action != ActionRecord || r.Description == "" {
			t.Errorf("rule %s: %v (action %q)", r.Name, err, r.Action)
		}
	}
}

func TestSilentSession(t *testing.T) {
	cases := []struct {
		name   string
		expect bool
		feed   func(t *testing.T, m *Monitor)
		lost   string
	}{
		{"never connected", false, func(*testing.T, *Monitor) {}, "runsc never connected"},
		{"refused session: connected, silent", true, func(t *testing.T, m *Monitor) { dial(t, m) }, "no container/start point"},
		{"fresh run", true, func(t *testing.T, m *Monitor) { dial(t, m).send(coldRun()...) }, ""},
		{"restored run: no container/start", false, func(t *testing.T, m *Monitor) {
			dial(t, m).send(fork(2, 4), execve(4, 2, "/bin/ls"))
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := startMonitor(t, Options{ExpectStart: c.expect})
			c.feed(t, m)
			got := m.Take()
			if c.lost == "" && got.Lost != "" || !strings.Contains(got.Lost, c.lost) {
				t.Errorf("lost %q, want %q", got.Lost, c.lost)
			}
			if c.lost != "" && !slices.Contains(hitNames(got), "monitor-incomplete") {
				t.Errorf("monitor-incomplete did not fire: %+v", got.Rules)
			}
		})
	}
}

// TestSignals checks the signals of the full level's raw kill, tkill and
// tgkill points: a probe (signal 0), a process's SIGURG to itself (the Go
// runtime's preemption) and the signals of safe-run's agent (PID 1: its
// SIGKILL to the finished run's group) are left out; every other signal
// is recorded with its sender and target.
func TestSignals(t *testing.T) {
	raw := func(pid int32, sysno, a1, a2, a3 uint64) *pb.Syscall {
		return &pb.Syscall{ContextData: ctx(pid, 0), Sysno: sysno, Arg1: a1, Arg2: a2, Arg3: a3}
	}
	m := startMonitor(t, Options{Level: LevelFull})
	s := dial(t, m)
	s.send(coldRun(
		raw(1, unix.SYS_TGKILL, 1, 1, uint64(unix.SIGURG)),
		raw(2, unix.SYS_TGKILL, 2, 2, uint64(unix.SIGURG)),
		raw(2, unix.SYS_KILL, 9, 0, 0),
		raw(2, unix.SYS_KILL, 9, uint64(unix.SIGTERM), 0),
		raw(2, unix.SYS_TGKILL, 2, 3, uint64(unix.SIGUSR1)),
		raw(2, unix.SYS_TKILL, 1, uint64(unix.SIGURG), 0), // another process's: kept
		raw(1, unix.SYS_KILL, uint64(0x100000000-2), uint64(unix.SIGKILL), 0),
	)...)
	got := finish(t, m, s)
	want := []sandbox.SignalSent{{PID: 2, Target: 9, Signal: "SIGTERM"}, {PID: 2, Target: 2, Signal: "SIGUSR1"}, {PID: 2, Target: 1, Signal: "SIGURG"}}
	if !reflect.DeepEqual(got.Signals, want) {
		t.Errorf("signals %+v, want %+v", got.Signals, want)
	}
	if got.Events["raw"] != 7 {
		t.Errorf("events %v: every raw point counts", got.Events)
	}
}
