package monitor

import (
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// BenchmarkDecodeApply is the monitor's CPU per point, decode and summary,
// for the points a file-heavy or process-heavy program sends most.
func BenchmarkDecodeApply(b *testing.B) {
	for _, c := range []struct {
		name  string
		point proto.Message
	}{
		{"openat-read", openat(2, "/usr/lib/python3/dist-packages/pandas/core/frame.py", unix.O_RDONLY|unix.O_CLOEXEC, 0)},
		{"openat-write", openat(2, "/workspace/out/part-0001.csv", unix.O_WRONLY|unix.O_CREAT, 0)},
		{"execve", execve(4, 2, "/usr/bin/dash", "sh", "-c", "echo hello world")},
		{"connect", connect(2, inet4([4]byte{10, 0, 0, 1}, 443), int64(unix.ENETUNREACH))},
	} {
		b.Run(c.name, func(b *testing.B) {
			data := frame(typeOf(c.point), 0, c.point)
			st := newState(DefaultRules(), Limits{}.withDefaults())
			b.ReportAllocs()
			for b.Loop() {
				msg, err := decode(data, false)
				if err != nil {
					b.Fatal(err)
				}
				st.apply(msg)
			}
		})
	}
}

// BenchmarkSettle is what a run's report waits for the stream: a point
// sent, then Take, which returns once the reader has applied it.
func BenchmarkSettle(b *testing.B) {
	m := startMonitor(b, Options{})
	s := dial(b, m)
	s.send(start("/safe-run-agent"))
	pt := openat(2, "/workspace/f", unix.O_RDONLY, 0)
	for b.Loop() {
		s.send(pt)
		if m.Take().Events["open"] != 1 {
			b.Fatal("Take did not see the point sent before it")
		}
	}
}
