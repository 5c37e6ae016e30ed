package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseUIDMap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		data  string
		whole bool
		root  int
	}{
		{"host", "         0          0 4294967295\n", true, 0},
		{"user mapped to root", "         0       1000          1\n", false, 1000},
		{"nobody mapped to root", "0 65534 1", false, 65534},
		{"subordinate range, root unmapped", "1 100000 65536\n", false, -1},
		{"root and a range", "0 1000 1\n1 100000 65536\n", false, 1000},
		{"empty", "", false, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole, root := parseUIDMap(tc.data)
			if whole != tc.whole || root != tc.root {
				t.Errorf("parseUIDMap(%q) = %v, %d; want %v, %d", tc.data, whole, root, tc.whole, tc.root)
			}
		})
	}
}

// TestUserNamespaceAsThisProcessSeesIt checks the view this process has of
// its own privileges: host root, or root of a user namespace that maps
// one host uid (the tests' TestMain puts an ordinary user there).
func TestUserNamespaceAsThisProcessSeesIt(t *testing.T) {
	switch {
	case HostRoot():
		if HostUID() != 0 {
			t.Errorf("host root, but HostUID() = %d", HostUID())
		}
	case inOwnUserNamespace():
		if HostUID() <= 0 {
			t.Errorf("in a user namespace, HostUID() = %d, want the user's uid", HostUID())
		}
		if err := UserNamespaceCapable(); err != nil {
			t.Errorf("root of this user namespace cannot mount: %v", err)
		}
	default:
		t.Skip("neither root nor in a user namespace: TestMain was not run")
	}
}

// TestUserNamespaceFix checks which cause and fix each host names, from
// its kernel settings, seccomp status and container signs laid out in a
// directory, and the error creating or using a user namespace. The live
// cases (a seccomp filter, max_user_namespaces) are tested end to end in
// cmd/safe-run; these are the hosts this one cannot become.
func TestUserNamespaceFix(t *testing.T) {
	const (
		cloneOff = "proc/sys/kernel/unprivileged_userns_clone"
		maxNS    = "proc/sys/user/max_user_namespaces"
		apparmor = "proc/sys/kernel/apparmor_restrict_unprivileged_userns"
		status   = "proc/self/status"
	)
	filtered := "Name:\tsafe-run\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n"
	unfiltered := "Name:\tsafe-run\nNoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\n"
	created := func(errno unix.Errno) error {
		return fmt.Errorf("cannot create a user namespace: %w", &os.PathError{Op: "fork/exec", Path: "/bin/true", Err: errno})
	}
	used := func(errno unix.Errno) error {
		return fmt.Errorf("mount a tmpfs in its own mount namespace: %w", errno)
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		env   map[string]string
		err   error
		want  string
	}{
		{"Debian's switch off", map[string]string{cloneOff: "0", maxNS: "15000", status: unfiltered},
			nil, created(unix.EPERM), "sysctl -w kernel.unprivileged_userns_clone=1"},
		{"Debian's switch off, under a filter too", map[string]string{cloneOff: "0", maxNS: "15000", status: filtered},
			nil, created(unix.EPERM), "sysctl -w kernel.unprivileged_userns_clone=1"},
		{"no user namespaces allowed", map[string]string{cloneOff: "1", maxNS: "0", status: unfiltered},
			nil, created(unix.ENOSPC), "user namespaces are disabled (user.max_user_namespaces=0)"},
		{"limit reached", map[string]string{maxNS: "15000", status: filtered},
			nil, created(unix.ENOSPC), "at its limit"},
		{"Ubuntu's AppArmor refuses creation", map[string]string{maxNS: "15000", apparmor: "1", status: unfiltered},
			nil, created(unix.EPERM), "apparmor_parser -r /etc/apparmor.d/safe-run"},
		{"Ubuntu's AppArmor leaves root powerless", map[string]string{maxNS: "15000", apparmor: "1", status: unfiltered},
			nil, used(unix.EACCES), "apparmor_parser -r /etc/apparmor.d/safe-run"},
		{"AppArmor present, not restricting", map[string]string{maxNS: "15000", apparmor: "0", status: unfiltered},
			nil, created(unix.EPERM), "CONFIG_USER_NS"},
		{"seccomp filter outside a container", map[string]string{maxNS: "15000", status: filtered},
			nil, created(unix.EPERM), "a container's seccomp profile, or the filter of the service that started safe-run"},
		{"seccomp filter refusing mount", map[string]string{maxNS: "15000", status: filtered},
			nil, used(unix.EPERM), "Seccomp: 2 in /proc/self/status) refused it with EPERM"},
		{"a systemd service's filter, even with a container sign", map[string]string{maxNS: "15000", status: filtered, ".dockerenv": ""},
			map[string]string{"INVOCATION_ID": "5b1c"}, created(unix.EPERM), "runs as a systemd service, whose unit sets RestrictNamespaces="},
		{"Docker's clone3 answer", map[string]string{maxNS: "15000", status: filtered, ".dockerenv": ""},
			nil, created(unix.ENOSYS), "refused it with ENOSYS: safe-run appears to run in a container (/.dockerenv), whose seccomp profile"},
		{"Podman's container file", map[string]string{maxNS: "15000", status: filtered, "run/.containerenv": ""},
			nil, created(unix.EPERM), "a container (/run/.containerenv), whose seccomp profile"},
		{"container by environment, no filter", map[string]string{maxNS: "15000", status: unfiltered},
			map[string]string{"container": "lxc"}, created(unix.EPERM), "a container (container=lxc) that refuses it (EPERM) without a seccomp filter"},
		{"container by cgroup, no filter", map[string]string{maxNS: "15000", status: unfiltered, "proc/1/cgroup": "0::/kubepods/burstable/pod1"},
			nil, created(unix.EPERM), "a container (kubepods in /proc/1/cgroup) that refuses it (EPERM) without a seccomp filter"},
		{"filter, but not the errno it gives", map[string]string{maxNS: "15000", status: filtered},
			nil, created(unix.EINVAL), "CONFIG_USER_NS"},
		{"nothing known", map[string]string{maxNS: "15000", status: unfiltered},
			nil, created(unix.EPERM), "CONFIG_USER_NS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, data := range tc.files {
				path := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(data+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got := userNamespaceFix(hostSigns{root: root, getenv: func(k string) string { return tc.env[k] }}, tc.err)
			if !strings.Contains(got, tc.want) {
				t.Errorf("fix for %v = %q, want it to contain %q", tc.err, got, tc.want)
			}
		})
	}
}

// TestDetectUserCgroups checks what a safe-run without root concludes
// from cgroups laid out in a directory: this host is hybrid, so the cgroup
// v2 cases cannot be met live here. writable stands in for access(2),
// which root would pass everywhere.
func TestDetectUserCgroups(t *testing.T) {
	const scope = "user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope"
	for _, tc := range []struct {
		name        string
		unified     bool
		self        string // this process's cgroup v2 path
		controllers string
		procs       string
		denied      string // the file the user may not write
		want        string // the delegated cgroup, or part of the error
	}{
		{"cgroup v1 or hybrid", false, "/" + scope, "cpu memory pids", "100 200", "", "systemd.unified_cgroup_hierarchy=1"},
		{"delegated", true, "/" + scope, "cpuset cpu io memory pids", "100 200", "", scope},
		{"delegated, already in the supervisor leaf", true, "/" + scope + "/supervisor", "cpu memory pids", "", "", scope},
		{"not delegated", true, "/user.slice/user-1000.slice/session-2.scope", "cpu memory pids", "100", "cgroup.procs", "is not delegated to this user (cgroup.procs"},
		{"subtree not delegated", true, "/" + scope, "cpu memory pids", "100", "cgroup.subtree_control", "is not delegated to this user (cgroup.subtree_control"},
		{"delegated without controllers", true, "/" + scope, "", "100", "", "lacks controllers: memory, pids, cpu; delegate them"},
		{"delegated without cpu", true, "/" + scope, "memory pids", "100", "", "lacks controllers: cpu; delegate them"},
		{"shared with other processes", true, "/" + scope, "cpu memory pids", "100 200 4242", "", "also holds other processes ([4242])"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mount := filepath.Join(dir, "cgroup")
			own := filepath.Join(mount, strings.TrimSuffix(tc.self, "/supervisor"))
			if err := os.MkdirAll(own, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, data := range map[string]string{"cgroup.controllers": tc.controllers, "cgroup.procs": strings.ReplaceAll(tc.procs, " ", "\n"), "cgroup.subtree_control": ""} {
				if err := os.WriteFile(filepath.Join(own, name), []byte(data+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			self := filepath.Join(dir, "self-cgroup")
			if err := os.WriteFile(self, []byte("1:cpu:/\n0::"+tc.self+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			l, err := detectUserCgroups(cgroupSigns{unified: tc.unified, mount: mount, self: self, ours: []int{100, 200},
				writable: func(path string) error {
					if tc.denied != "" && filepath.Base(path) == tc.denied {
						return unix.EACCES
					}
					return nil
				}})
			if want := filepath.Join(mount, scope); tc.want == scope {
				if err != nil || l.Mode != "v2" || l.Parents[""] != want {
					t.Errorf("got %+v, %v; want v2 with %s", l, err, want)
				}
				return
			}
			if err == nil || l.Mode != CgroupsNone || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %+v, %v; want mode %s and an error containing %q", l, err, CgroupsNone, tc.want)
			}
			// doctor shows the cause, and the fix after "; ".
			if _, fix, ok := strings.Cut(err.Error(), "; "); !ok || !strings.Contains(fix, "systemd-run --user --scope -p Delegate=yes") {
				t.Errorf("error %q has no fix after \"; \"", err)
			}
		})
	}
}
