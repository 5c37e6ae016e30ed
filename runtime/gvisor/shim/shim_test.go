package shim

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		files      []string
		argv       []string
		wantFailed bool
	}{
		{name: "v1 tasks files", args: []string{"/sys/fs/cgroup/memory/x/tasks", "/sys/fs/cgroup/pids/x/tasks", "--", "/bin/runsc", "run"},
			files: []string{"/sys/fs/cgroup/memory/x/tasks", "/sys/fs/cgroup/pids/x/tasks"}, argv: []string{"/bin/runsc", "run"}},
		{name: "v2 cgroup.procs", args: []string{"/sys/fs/cgroup/x/cgroup.procs", "--", "/bin/runsc"},
			files: []string{"/sys/fs/cgroup/x/cgroup.procs"}, argv: []string{"/bin/runsc"}},
		{name: "no cgroup", args: []string{"--", "/bin/runsc", "--", "x"}, argv: []string{"/bin/runsc", "--", "x"}},
		{name: "not a cgroup file", args: []string{"/etc/passwd", "--", "/bin/runsc"}, wantFailed: true},
		{name: "a file named like one, without a directory", args: []string{"tasks", "--", "/bin/runsc"}, wantFailed: true},
		{name: "no separator", args: []string{"/sys/fs/cgroup/x/cgroup.procs", "/bin/runsc"}, wantFailed: true},
		{name: "no command", args: []string{"/sys/fs/cgroup/x/cgroup.procs", "--"}, wantFailed: true},
		{name: "nothing", wantFailed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, argv, err := Parse(tc.args)
			if tc.wantFailed {
				if err == nil {
					t.Fatalf("Parse(%q) = %q, %q; want an error", tc.args, files, argv)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.args, err)
			}
			if !slices.Equal(files, tc.files) || !slices.Equal(argv, tc.argv) {
				t.Errorf("Parse(%q) = %q, %q; want %q, %q", tc.args, files, argv, tc.files, tc.argv)
			}
		})
	}
}
