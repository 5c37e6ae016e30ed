package monitor

import (
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// FuzzDecode feeds the decoder and the state what a compromised sandbox's
// sink could send: whatever decodes must be summarised within the caps,
// with every string shown safe to print.
func FuzzDecode(f *testing.F) {
	for _, p := range []proto.Message{
		start("/safe-run-agent"), execve(2, 1, python, "python3", "-c", "1"), fork(1, 2), thread(2, 3),
		exited(2, 0), killed(2, unix.SIGKILL), openat(2, "x", unix.O_WRONLY|unix.O_CREAT, 0),
		openat(2, "/proc/1/environ", unix.O_RDONLY, int64(unix.EACCES)),
		connect(2, inet4([4]byte{10, 0, 0, 1}, 3333), int64(unix.ECONNREFUSED)),
		connect(2, append([]byte{1, 0}, "/run/x.sock"...), 0), bind(2, inet4([4]byte{}, 8080)),
		socket(2, unix.AF_INET6, unix.SOCK_DGRAM),
	} {
		f.Add(frame(typeOf(p), 0, p), false)
		b := frame(typeOf(p), 3, p)
		f.Add(b[:len(b)*2/3], true)
	}
	lim := Limits{MaxProcesses: 2, MaxList: 2, MaxArgs: 2, MaxArgLen: 8, MaxPathLen: 16, MaxTracked: 4}.withDefaults()
	f.Fuzz(func(t *testing.T, data []byte, cut bool) {
		msg, err := decode(data, cut)
		if err != nil {
			return
		}
		st := newState(DefaultRules(), lim)
		for range 5 { // the same message again: dedup and caps
			if !st.apply(msg) {
				t.Fatalf("apply ended monitoring: %q", st.lost)
			}
		}
		a := st.total()
		if len(a.Processes) > 2 || len(a.Network) > 2 || len(a.FilesWritten) > 2 || len(a.SensitiveReads) > 2 ||
			len(a.Signals) > 2 || len(a.Rules) > 2 || len(st.procs) > 4 || len(st.written) > 4 || len(st.fired) > 4 {
			t.Fatalf("caps broken: %+v", a)
		}
		shown := []string{}
		for _, p := range a.Processes {
			shown = append(append(shown, p.Binary), p.Argv...)
			if len(p.Argv) > 2 {
				t.Fatalf("argv %q", p.Argv)
			}
		}
		for _, n := range a.Network {
			shown = append(shown, n.Address)
		}
		shown = append(append(shown, a.FilesWritten...), a.SensitiveReads...)
		for _, s := range shown {
			if !utf8.ValidString(s) || len(s) > 16*4+len("…") {
				t.Fatalf("unsafe string %q", s)
			}
			for _, r := range s {
				if r < 0x20 || r == 0x7f {
					t.Fatalf("control character in %q", s)
				}
			}
		}
	})
}
