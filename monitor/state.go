package monitor

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"github.com/safe-run/safe-run/sandbox"
)

// state is what the monitor knows of one sandbox: the activity since the
// last Take (cur), over the whole life (tot), and what the rules remember.
// Everything in it is bounded by Limits. Not safe for concurrent use.
type state struct {
	rules []Rule
	lim   Limits
	cur   *acc
	tot   *acc

	// procs maps a live process's PID to its binary, for the parent's name
	// of a later execve.
	procs map[int32]string
	// written holds the paths opened for writing, for exec-written-file.
	written map[string]bool
	// counts are the matching events of each counting rule so far.
	counts []int
	// fired holds the hits already reported, so each fires once.
	fired map[string]bool

	// started says the container/start point came.
	started bool

	events      int64
	lastDropped uint32
	lost        string
	killed      bool
	kill        *sandbox.RuleHit
}

// acc accumulates one Activity.
type acc struct {
	a sandbox.Activity
	// procIdx is the index of each PID's latest entry in a.Processes.
	procIdx map[int32]int
	// files and sens are the paths already in FilesWritten and
	// SensitiveReads.
	files, sens map[string]bool
}

func newAcc(lost string) *acc {
	return &acc{
		a:       sandbox.Activity{Events: map[string]int{}, Lost: lost},
		procIdx: map[int32]int{}, files: map[string]bool{}, sens: map[string]bool{},
	}
}

func newState(rules []Rule, lim Limits) *state {
	return &state{
		rules: rules, lim: lim, cur: newAcc(""), tot: newAcc(""),
		procs: map[int32]string{}, written: map[string]bool{},
		counts: make([]int, len(rules)), fired: map[string]bool{},
	}
}

// both applies f to the per-Take and the whole-life activity.
func (s *state) both(f func(*acc)) {
	f(s.cur)
	f(s.tot)
}

// take returns the activity since the previous take and starts anew.
func (s *state) take() sandbox.Activity {
	a := s.cur.a
	s.cur = newAcc(s.lost)
	return a
}

// total returns a copy of the whole-life activity.
func (s *state) total() sandbox.Activity {
	a := s.tot.a
	a.Processes = append([]sandbox.Process(nil), a.Processes...)
	a.Network = append([]sandbox.NetworkAttempt(nil), a.Network...)
	a.FilesWritten = append([]string(nil), a.FilesWritten...)
	a.SensitiveReads = append([]string(nil), a.SensitiveReads...)
	a.Signals = append([]sandbox.SignalSent(nil), a.Signals...)
	a.Rules = append([]sandbox.RuleHit(nil), a.Rules...)
	a.Events = make(map[string]int, len(s.tot.a.Events))
	for k, v := range s.tot.a.Events {
		a.Events[k] = v
	}
	return a
}

// takeKill returns the kill hit not yet handed out, once.
func (s *state) takeKill() *sandbox.RuleHit {
	k := s.kill
	s.kill = nil
	return k
}

// lose ends monitoring with a reason (the first one stays).
func (s *state) lose(why string) {
	if s.lost != "" {
		return
	}
	s.lost = why
	s.both(func(a *acc) { a.a.Lost = why })
	s.fire(EventMonitorIncomplete, func() string { return "monitoring ended early: " + why }, nil)
}

// apply adds one message; false means monitoring has ended.
func (s *state) apply(m message) bool {
	if s.lost != "" {
		return false
	}
	s.events++
	if s.events > s.lim.MaxEvents {
		s.lose(fmt.Sprintf("more than %d events", s.lim.MaxEvents))
		return false
	}
	k := kind(m.typ)
	s.both(func(a *acc) {
		a.a.Events[k]++
		if m.cut {
			a.a.Events["cut"]++
		}
	})
	if d := m.dropped - s.lastDropped; d > 0 { // wraps as the sink's counter does
		s.lastDropped = m.dropped
		s.both(func(a *acc) { a.a.Dropped += int64(d) })
		s.fire(EventMonitorIncomplete, func() string { return fmt.Sprintf("%d trace points dropped by runsc (socket full)", d) }, nil)
	}
	switch p := m.point.(type) {
	case *pb.Start:
		s.started = true
		// The container's first process (safe-run's agent) has no execve
		// point; its args name it for its children's parent_names.
		if args := p.GetArgs(); len(args) > 0 {
			id := pid(p)
			if id == 0 {
				id = 1
			}
			s.track(id, args[0])
		}
	case *pb.ExecveInfo:
		s.exec(p, m.cut)
	case *pb.CloneInfo:
		s.clone(p)
	case *pb.ExitNotifyParentInfo:
		s.exit(p)
	case *pb.Open:
		s.open(p)
	case *pb.Socket:
		s.network(sandbox.NetworkAttempt{Op: "socket", PID: int(pid(p)), Family: familyName(p.GetDomain()),
			Type: typeName(p.GetType()), Result: result(p.GetExit())}, 0)
	case *pb.Connect:
		s.sockaddr("connect", pid(p), p.GetAddress(), p.GetExit())
	case *pb.Bind:
		s.sockaddr("bind", pid(p), p.GetAddress(), p.GetExit())
	case *pb.Listen:
		s.sockaddr("listen", pid(p), p.GetAddress(), p.GetExit())
	case *pb.Accept:
		s.sockaddr("accept", pid(p), p.GetAddress(), p.GetExit())
	case *pb.Syscall:
		s.signal(p)
	}
	return true
}

// contexted is every point with a ContextData.
type contexted interface {
	GetContextData() *pb.ContextData
}

// pid is the thread group (process) of a point.
func pid(p contexted) int32 { return p.GetContextData().GetThreadGroupId() }

// track remembers a live process's binary, within MaxTracked.
func (s *state) track(pid int32, binary string) {
	if _, ok := s.procs[pid]; ok || len(s.procs) < s.lim.MaxTracked {
		s.procs[pid] = binary
	}
}

// writablePlaces are where a sandboxed program can put a binary of its own;
// the image's files are elsewhere.
var writablePlaces = []string{"/workspace/**", "/tmp/**", "/dev/shm/**", "/run/**", "/var/tmp/**"}

func (s *state) exec(p *pb.ExecveInfo, cut bool) {
	cd := p.GetContextData()
	pid, ppid := cd.GetThreadGroupId(), cd.GetParentThreadGroupId()
	rawArgv := p.GetArgv()
	binary := p.GetBinaryPath()
	if binary == "" && len(rawArgv) > 0 {
		binary = rawArgv[0]
	}
	argv := make([]string, 0, min(len(rawArgv), s.lim.MaxArgs))
	for i, a := range rawArgv {
		if i == s.lim.MaxArgs {
			cut = true
			break
		}
		c := clean(a, s.lim.MaxArgLen)
		cut = cut || c != a
		argv = append(argv, c)
	}
	proc := sandbox.Process{
		PID: int(pid), Parent: int(ppid), Binary: clean(binary, s.lim.MaxPathLen),
		Argv: argv, ArgvTruncated: cut,
	}
	if h := p.GetBinarySha256(); len(h) == 32 {
		proc.SHA256 = hex.EncodeToString(h)
	}
	s.both(func(a *acc) {
		if len(a.a.Processes) >= s.lim.MaxProcesses {
			a.a.ProcessesTruncated = true
			delete(a.procIdx, pid) // its exit must not land on an older entry
			return
		}
		a.procIdx[pid] = len(a.a.Processes)
		a.a.Processes = append(a.a.Processes, proc)
	})
	parent, parentKnown := s.procs[ppid]
	previous, hadPrevious := s.procs[pid]
	s.track(pid, binary)

	by := fmt.Sprintf("pid %d", ppid)
	if parentKnown {
		by = path.Base(clean(parent, s.lim.MaxPathLen))
	}
	desc := func() string { return fmt.Sprintf("execve %s by %s (pid %d)", proc.Binary, by, pid) }
	names := []string{path.Base(binary)}
	if len(rawArgv) > 0 {
		names = append(names, path.Base(rawArgv[0]))
	}
	written := s.written[path.Clean(binary)]
	notInImage := written || p.GetBinaryInMemfd() || p.GetBinaryOverlayfsUpper() || match(writablePlaces, path.Clean(binary))
	// In a sandbox restored from a checkpoint, the processes that started
	// before it (the warm interpreter) have no execve in the stream. The
	// caller's own name then stands in for its parent's binary: the point
	// is sent before the new image replaces it, so it is the name the
	// caller inherited at fork (or its own, for an execve in place).
	caller := ""
	if !parentKnown && !hadPrevious {
		caller = clean(cd.GetProcessName(), s.lim.MaxPathLen)
	}
	s.fire(EventExec, desc, func(r Rule) bool {
		return (len(r.Names) == 0 || matchAny(r.Names, names)) &&
			(len(r.ParentNames) == 0 || parentKnown && match(r.ParentNames, path.Base(parent)) ||
				hadPrevious && match(r.ParentNames, path.Base(previous)) ||
				caller != "" && match(r.ParentNames, caller)) &&
			(len(r.Paths) == 0 || match(r.Paths, path.Clean(binary))) &&
			(!r.NotInImage || notInImage) &&
			(!r.Written || written)
	})
}

// matchAny reports whether one of names matches the patterns.
func matchAny(patterns, names []string) bool {
	for _, n := range names {
		if match(patterns, n) {
			return true
		}
	}
	return false
}

func (s *state) clone(p *pb.CloneInfo) {
	if p.GetFlags()&unix.CLONE_THREAD != 0 {
		s.both(func(a *acc) { a.a.Threads++ })
		return
	}
	s.both(func(a *acc) { a.a.Clones++ })
	s.fire(EventClone, func() string { return fmt.Sprintf("clone by pid %d (new pid %d)", pid(p), p.GetCreatedThreadGroupId()) }, nil)
}

func (s *state) exit(p *pb.ExitNotifyParentInfo) {
	id := pid(p)
	ws := linux.WaitStatus(uint32(p.GetExitStatus()))
	s.both(func(a *acc) {
		i, ok := a.procIdx[id]
		if !ok {
			return
		}
		delete(a.procIdx, id)
		proc := &a.a.Processes[i]
		proc.Exited = true
		switch {
		case ws.Signaled():
			proc.Signal = unix.SignalName(syscall.Signal(ws.TerminationSignal()))
			if proc.Signal == "" {
				proc.Signal = fmt.Sprintf("signal %d", ws.TerminationSignal())
			}
		default:
			proc.ExitCode = int(ws.ExitStatus())
		}
	})
	delete(s.procs, id)
}

// quietDevices are opened for writing by ordinary programs all the time.
var quietDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/stdout", "/dev/stderr", "/dev/pts/**", "/proc/self/fd/**"}

// expectedWrites are where a program is expected to write.
var expectedWrites = []string{"/workspace/**", "/tmp/**"}

func (s *state) open(p *pb.Open) {
	name := openPath(p)
	flags := p.GetFlags()
	write := flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_CREAT != 0
	res := result(p.GetExit())
	ok := res == "ok"
	if write && ok {
		if len(s.written) < s.lim.MaxTracked {
			s.written[name] = true
		}
		if !match(expectedWrites, name) && !match(quietDevices, name) {
			shown := clean(name, s.lim.MaxPathLen)
			s.both(func(a *acc) {
				if a.files[shown] {
					return
				}
				if len(a.a.FilesWritten) >= s.lim.MaxList {
					a.a.FilesWrittenTruncated = true
					return
				}
				a.files[shown] = true
				a.a.FilesWritten = append(a.a.FilesWritten, shown)
			})
		}
	}
	if match(SensitivePaths, name) {
		entry := clean(name, s.lim.MaxPathLen)
		if !ok {
			entry += " (" + res + ")"
		}
		s.both(func(a *acc) {
			if a.sens[entry] {
				return
			}
			if len(a.a.SensitiveReads) >= s.lim.MaxList {
				a.a.SensitiveReadsTruncated = true
				return
			}
			a.sens[entry] = true
			a.a.SensitiveReads = append(a.a.SensitiveReads, entry)
		})
	}
	mode := "read"
	if write {
		mode = "write"
	}
	desc := func() string {
		return fmt.Sprintf("open %s for %s by pid %d: %s", clean(name, s.lim.MaxPathLen), mode, pid(p), res)
	}
	s.fire(EventOpen, desc, func(r Rule) bool {
		return (len(r.Paths) == 0 || match(r.Paths, name)) && (!r.Write || write && ok)
	})
}

// openPath is the absolute path an open names, as far as the point tells:
// relative to the directory descriptor of openat, or to the cwd.
func openPath(p *pb.Open) string {
	name := p.GetPathname()
	if strings.HasPrefix(name, "/") {
		return path.Clean(name)
	}
	base := p.GetContextData().GetCwd()
	if p.GetFd() != linux.AT_FDCWD {
		base = p.GetFdPath()
	}
	if base == "" || !strings.HasPrefix(base, "/") {
		return path.Clean(name)
	}
	return path.Join(base, name)
}

// sockaddr records a call that names a socket address.
func (s *state) sockaddr(op string, pid int32, raw []byte, exit *pb.Exit) {
	family, addr, port := parseSockaddr(raw)
	s.network(sandbox.NetworkAttempt{Op: op, PID: int(pid), Family: family,
		Address: clean(addr, s.lim.MaxPathLen), Result: result(exit)}, port)
}

// network records one attempt and applies the rules of its call.
func (s *state) network(n sandbox.NetworkAttempt, port int) {
	s.both(func(a *acc) {
		if len(a.a.Network) >= s.lim.MaxList {
			a.a.NetworkTruncated = true
			return
		}
		a.a.Network = append(a.a.Network, n)
	})
	var event string
	switch n.Op {
	case "connect":
		event = EventConnect
	case "bind":
		event = EventBind
	default:
		return
	}
	desc := func() string {
		return fmt.Sprintf("%s %s %s by pid %d: %s", n.Op, n.Family, n.Address, n.PID, n.Result)
	}
	s.fire(event, desc, func(r Rule) bool {
		if len(r.Families) > 0 && !slices.Contains(r.Families, n.Family) {
			return false
		}
		if len(r.Ports) == 0 {
			return true
		}
		for _, p := range r.Ports {
			if p == port && port != 0 {
				return true
			}
		}
		return false
	})
}

// signal records a kill, tkill or tgkill (LevelFull's raw points).
func (s *state) signal(p *pb.Syscall) {
	var target, sig uint64
	switch p.GetSysno() {
	case unix.SYS_KILL, unix.SYS_TKILL:
		target, sig = p.GetArg1(), p.GetArg2()
	case unix.SYS_TGKILL:
		target, sig = p.GetArg1(), p.GetArg3()
	default:
		return
	}
	if sig == 0 {
		return // a probe of whether the process exists
	}
	if pid(p) == 1 {
		// The container's first process is safe-run's agent: its
		// signals (the end of a run's process group) are not the code's.
		return
	}
	if sig == uint64(unix.SIGURG) && int32(target) == pid(p) {
		// The Go runtime's preemption of its own threads (any Go
		// program): many a second, and harmless.
		return
	}
	name := unix.SignalName(syscall.Signal(sig))
	if name == "" {
		name = "signal " + strconv.FormatUint(sig, 10)
	}
	sent := sandbox.SignalSent{PID: int(pid(p)), Target: int(int32(target)), Signal: name}
	s.both(func(a *acc) {
		if len(a.a.Signals) >= s.lim.MaxList {
			a.a.SignalsTruncated = true
			return
		}
		a.a.Signals = append(a.a.Signals, sent)
	})
}

// fire applies the rules of an event: each whose matcher holds (nil holds
// for every rule of the event) counts it, and fires when due; describe
// gives the event's line.
func (s *state) fire(event string, describe func() string, matches func(Rule) bool) {
	desc := ""
	for i, r := range s.rules {
		if r.Event != event || matches != nil && !matches(r) {
			continue
		}
		if desc == "" {
			desc = describe() // only for a match: most events match no rule
		}
		event := desc
		if r.Count > 1 {
			s.counts[i]++
			if s.counts[i] != r.Count {
				continue
			}
			event = fmt.Sprintf("%s (event %d)", desc, r.Count)
		} else {
			key := r.Name + "\x00" + desc
			if s.fired[key] {
				continue
			}
			if len(s.fired) < s.lim.MaxTracked {
				s.fired[key] = true
			}
		}
		action := r.Action
		if action == "" {
			action = ActionRecord
		}
		hit := sandbox.RuleHit{Rule: r.Name, Action: string(action), Event: event}
		s.both(func(a *acc) {
			if len(a.a.Rules) >= s.lim.MaxList {
				a.a.RulesTruncated = true
				return
			}
			a.a.Rules = append(a.a.Rules, hit)
		})
		if action == ActionKill && !s.killed {
			s.killed = true
			s.kill = &hit
		}
	}
}

// result is "ok" or the errno name of a syscall's exit.
func result(e *pb.Exit) string {
	if e == nil {
		return "unknown"
	}
	if n := e.GetErrorno(); n != 0 {
		if name := unix.ErrnoName(syscall.Errno(n)); name != "" {
			return name
		}
		return "errno " + strconv.FormatInt(n, 10)
	}
	return "ok"
}

// parseSockaddr reads a struct sockaddr as the program passed it: the
// family name, the address in text, and the port (0 when none).
func parseSockaddr(b []byte) (family, addr string, port int) {
	if len(b) < 2 {
		return "none", "", 0
	}
	fam := binary.NativeEndian.Uint16(b)
	family = familyName(int32(fam))
	switch fam {
	case unix.AF_INET:
		if len(b) >= 8 {
			port = int(binary.BigEndian.Uint16(b[2:4]))
			ip := netip.AddrFrom4([4]byte(b[4:8]))
			return family, netip.AddrPortFrom(ip, uint16(port)).String(), port
		}
	case unix.AF_INET6:
		if len(b) >= 24 {
			port = int(binary.BigEndian.Uint16(b[2:4]))
			ip := netip.AddrFrom16([16]byte(b[8:24]))
			return family, netip.AddrPortFrom(ip, uint16(port)).String(), port
		}
	case unix.AF_UNIX:
		p := b[2:]
		if len(p) > 0 && p[0] == 0 {
			return family, "@" + string(trimNUL(p[1:])), 0 // abstract
		}
		return family, string(trimNUL(p)), 0
	}
	return family, "", 0
}

func trimNUL(b []byte) []byte {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return b[:i]
	}
	return b
}

// familyName names an address family.
func familyName(f int32) string {
	switch f {
	case unix.AF_UNSPEC:
		return "unspec"
	case unix.AF_UNIX:
		return "unix"
	case unix.AF_INET:
		return "inet"
	case unix.AF_INET6:
		return "inet6"
	case unix.AF_NETLINK:
		return "netlink"
	case unix.AF_PACKET:
		return "packet"
	}
	return "family " + strconv.Itoa(int(f))
}

// typeName names a socket type (its flags dropped).
func typeName(t int32) string {
	switch t & 0xf {
	case unix.SOCK_STREAM:
		return "stream"
	case unix.SOCK_DGRAM:
		return "dgram"
	case unix.SOCK_RAW:
		return "raw"
	case unix.SOCK_SEQPACKET:
		return "seqpacket"
	}
	return "type " + strconv.Itoa(int(t&0xf))
}

// clean makes a string from the sandbox safe to show: invalid UTF-8 and
// control characters escaped, at most max bytes ("…" when cut).
func clean(s string, max int) string {
	graphic := utf8.ValidString(s)
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			graphic = false
			break
		}
	}
	if !graphic {
		q := strconv.QuoteToGraphic(s)
		s = q[1 : len(q)-1]
	}
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
