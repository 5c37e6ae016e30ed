package monitor

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/seccheck"
)

// pointSpec is one trace point a level enables, with the fields it needs.
type pointSpec struct {
	name     string
	optional []string
	context  []string
}

// Context fields: the process (thread group) and its parent identify every
// event in the tree; the cwd resolves relative paths of opens.
var (
	ctxPID    = []string{"group_id"}
	ctxParent = []string{"group_id", "parent_thread_group_id", "process_name"}
	ctxOpen   = []string{"group_id", "cwd"}
)

// defaultPoints are LevelDefault's points, chosen for value per cost: a
// syscall point costs only the calls it names, and opens are the only
// frequent ones (filtered here, since a point cannot filter by flags).
// Exit points carry the arguments and the result, so no enter points.
var defaultPoints = []pointSpec{
	{name: "container/start", context: ctxPID},
	{name: "sentry/execve", optional: []string{"binary_info", "binary_sha256"}, context: ctxParent},
	{name: "sentry/clone", context: ctxPID},
	{name: "sentry/exit_notify_parent", context: ctxPID},
	{name: "syscall/socket/exit", context: ctxPID},
	{name: "syscall/connect/exit", context: ctxPID},
	{name: "syscall/bind/exit", context: ctxPID},
	{name: "syscall/open/exit", context: ctxOpen},
	{name: "syscall/creat/exit", context: ctxOpen},
	{name: "syscall/openat/exit", optional: []string{"fd_path"}, context: ctxOpen},
}

// fullPoints are added by LevelFull: every other schematised syscall point
// that is cheap to summarise (not read, write, close or mmap, which every
// program calls in loops), and the raw points of the calls that send
// signals.
var fullPoints = []pointSpec{
	{name: "sentry/task_exit", context: ctxPID},
	{name: "syscall/listen/exit", context: ctxPID},
	{name: "syscall/accept/exit", context: ctxPID},
	{name: "syscall/accept4/exit", context: ctxPID},
	{name: "syscall/socketpair/exit", context: ctxPID},
	{name: "syscall/execve/exit", context: ctxPID},
	{name: "syscall/execveat/exit", context: ctxPID},
	{name: "syscall/ptrace/exit", context: ctxPID},
	{name: "syscall/chroot/exit", context: ctxPID},
	{name: "syscall/chdir/exit", context: ctxPID},
	{name: "syscall/fchdir/exit", context: ctxPID},
	{name: "syscall/setuid/exit", context: ctxPID},
	{name: "syscall/setgid/exit", context: ctxPID},
	{name: "syscall/setsid/exit", context: ctxPID},
	{name: "syscall/setresuid/exit", context: ctxPID},
	{name: "syscall/setresgid/exit", context: ctxPID},
	{name: "syscall/prlimit64/exit", context: ctxPID},
	{name: "syscall/pipe/exit", context: ctxPID},
	{name: "syscall/pipe2/exit", context: ctxPID},
	{name: "syscall/dup/exit", context: ctxPID},
	{name: "syscall/dup2/exit", context: ctxPID},
	{name: "syscall/dup3/exit", context: ctxPID},
	{name: "syscall/fcntl/exit", context: ctxPID},
	{name: "syscall/eventfd/exit", context: ctxPID},
	{name: "syscall/eventfd2/exit", context: ctxPID},
	{name: "syscall/signalfd/exit", context: ctxPID},
	{name: "syscall/signalfd4/exit", context: ctxPID},
	{name: "syscall/timerfd_create/exit", context: ctxPID},
	{name: "syscall/timerfd_settime/exit", context: ctxPID},
	{name: "syscall/timerfd_gettime/exit", context: ctxPID},
	{name: "syscall/inotify_init/exit", context: ctxPID},
	{name: "syscall/inotify_init1/exit", context: ctxPID},
	{name: "syscall/inotify_add_watch/exit", context: ctxPID},
	{name: "syscall/inotify_rm_watch/exit", context: ctxPID},
	{name: "syscall/clone/exit", context: ctxPID},
	{name: "syscall/fork/exit", context: ctxPID},
	{name: "syscall/vfork/exit", context: ctxPID},
	{name: fmt.Sprintf("syscall/sysno/%d/enter", unix.SYS_KILL), context: ctxPID},
	{name: fmt.Sprintf("syscall/sysno/%d/enter", unix.SYS_TKILL), context: ctxPID},
	{name: fmt.Sprintf("syscall/sysno/%d/enter", unix.SYS_TGKILL), context: ctxPID},
}

// initConfig is runsc's pod init configuration (runsc/boot.InitConfig, not
// imported: that package is the whole sentry), holding gVisor's own
// session type.
type initConfig struct {
	TraceSession seccheck.SessionConfig `json:"trace_session"`
}

var initPoints sync.Once

// registryHasAll says that this architecture's runsc has every point of
// defaultPoints and fullPoints (TestPointsInRegistry checks it against
// seccheck's registry), so points need not build that registry: filling it
// takes 1-2.5 ms, spent on a cold run's path before runsc starts.
const registryHasAll = runtime.GOARCH == "amd64"

// points are a level's points that this architecture's runsc has: some
// syscalls (open, creat, fork...) exist on amd64 only. seccheck's registry
// is the one runsc is built from (the same module version).
func points(level Level) []pointSpec {
	all := defaultPoints
	if level == LevelFull {
		all = append(append([]pointSpec(nil), defaultPoints...), fullPoints...)
	}
	if registryHasAll {
		return slices.Clone(all)
	}
	initPoints.Do(seccheck.Initialize)
	var out []pointSpec
	for _, p := range all {
		if _, ok := seccheck.Points[p.name]; ok {
			out = append(out, p)
		}
	}
	return out
}

// sessionConfig is the pod init configuration of a level's session whose
// remote sink connects to socket.
func sessionConfig(level Level, socket string) []byte {
	var conf initConfig
	conf.TraceSession = seccheck.SessionConfig{
		Name: seccheck.DefaultSessionName,
		Sinks: []seccheck.SinkConfig{{
			Name: "remote",
			// No "retries": a point that finds the socket full is
			// dropped (and counted) at once rather than making the
			// sandboxed call wait.
			Config: map[string]any{"endpoint": socket},
		}},
	}
	for _, p := range points(level) {
		conf.TraceSession.Points = append(conf.TraceSession.Points, seccheck.PointConfig{
			Name: p.name, OptionalFields: p.optional, ContextFields: p.context,
		})
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("marshal trace session: %v", err)) // plain data: cannot fail
	}
	return data
}
