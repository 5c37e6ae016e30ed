package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// doctor --unit: a service is hardened by settings a plain doctor run does
// not have, so the unit's doctor runs inside them — a transient systemd
// service with every [Service] setting of the unit — and, should that run
// fail, tries again without each hardening option to name the one that
// breaks it.

// unitRunDir is the runtime directory of the transient services: the
// unit's own would be removed under the running server when they stop.
const unitRunDir = "safe-run-doctor"

// unitKeep are the [Service] settings that make up the service's context
// and are not hardening: the transient service keeps them always.
var unitKeep = []string{"User", "Group", "Delegate", "Environment", "EnvironmentFile", "MemoryMax", "TasksMax",
	"StateDirectory", "StateDirectoryMode", "CacheDirectory", "CacheDirectoryMode", "LogsDirectory", "LogsDirectoryMode",
	"ConfigurationDirectory", "ConfigurationDirectoryMode", "WorkingDirectory", "SupplementaryGroups"}

// unitSkip are the settings about starting and stopping the server, which
// a transient run of doctor has its own of.
var unitSkip = []string{"Type", "ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost",
	"Restart", "RestartSec", "KillMode", "KillSignal", "TimeoutSec", "TimeoutStartSec", "TimeoutStopSec", "PIDFile",
	"NotifyAccess", "WatchdogSec", "RuntimeDirectory", "RuntimeDirectoryMode", "RuntimeDirectoryPreserve",
	"RemainAfterExit", "StandardInput", "StandardOutput", "StandardError"}

// unitSettings are the [Service] settings of a unit as `systemctl cat`
// prints it (the file, then its drop-ins): the executable ExecStart names,
// the settings kept, and the hardening ones, each "Key=value" in order.
type unitSettings struct {
	exec      string
	kept      []string
	hardening []string
}

// parseUnit reads `systemctl cat` output. An empty assignment resets a
// setting in systemd; here it is passed on as it is, which does the same.
func parseUnit(text string) unitSettings {
	var u unitSettings
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
			continue
		case strings.HasPrefix(line, "["):
			section = line
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || section != "[Service]" {
			continue
		}
		key = strings.TrimSpace(key)
		switch {
		case key == "ExecStart":
			if f := strings.Fields(value); len(f) > 0 {
				u.exec = strings.TrimLeft(f[0], "-@:+!")
			}
		case slices.Contains(unitSkip, key):
		case slices.Contains(unitKeep, key):
			u.kept = append(u.kept, key+"="+strings.TrimSpace(value))
		default:
			u.hardening = append(u.hardening, key+"="+strings.TrimSpace(value))
		}
	}
	return u
}

// transientArgs is the systemd-run command line that runs args (a
// safe-run command) in the service name with the unit's settings u,
// without the hardening setting dropped, its output appended to out. It
// is a oneshot service, so systemd-run returns when the command has ended
// and fails when it failed; --wait and --pipe are not used because they
// need a D-Bus daemon, while this way systemd-run, as root, reaches the
// manager over its private socket on hosts without one.
func transientArgs(u unitSettings, name, out, dropped string, args ...string) []string {
	cmd := []string{"--unit=" + name, "--quiet", "--service-type=oneshot", "-p", "TimeoutStartSec=20min",
		"-p", "StandardOutput=append:" + out, "-p", "StandardError=inherit",
		"-p", "RuntimeDirectory=" + unitRunDir, "-p", "RuntimeDirectoryMode=0700"}
	for _, p := range append(slices.Clone(u.kept), u.hardening...) {
		if p != dropped {
			cmd = append(cmd, "-p", p)
		}
	}
	return append(append(cmd, u.exec), args...)
}

// transientSeq numbers the transient services of one doctor run.
var transientSeq int

// runTransient runs args in a transient service with the unit's settings
// (see transientArgs) and returns what it printed and whether it exited
// 0. An error means the service did not run at all: systemd-run's own
// failure, which says nothing about the unit's settings.
func runTransient(u unitSettings, dropped string, args ...string) (string, bool, error) {
	transientSeq++
	name := fmt.Sprintf("safe-run-doctor-%d-%d.service", os.Getpid(), transientSeq)
	f, err := os.CreateTemp("/run", "safe-run-doctor-*.out")
	if err != nil {
		return "", false, fmt.Errorf("output file for %s: %w", name, err)
	}
	f.Close()
	defer os.Remove(f.Name())
	sdOut, runErr := exec.Command("systemd-run", transientArgs(u, name, f.Name(), dropped, args...)...).CombinedOutput()
	out, _ := os.ReadFile(f.Name())
	if runErr == nil {
		return string(out), true, nil
	}
	// A failed service stays loaded until reset-failed: its result tells
	// a command that failed from a service that never ran.
	show, _ := exec.Command("systemctl", "show", name, "-p", "Result", "-p", "ExecMainStatus", "-p", "ExecMainPID").Output()
	_ = exec.Command("systemctl", "reset-failed", name).Run()
	props := showProps(show)
	switch props["Result"] {
	case "exit-code":
		return fmt.Sprintf("%s(exit status %s)", out, props["ExecMainStatus"]), false, nil
	case "signal", "core-dump", "timeout", "oom-kill", "watchdog":
		return fmt.Sprintf("%s(%s: %s)", out, name, props["Result"]), false, nil
	}
	return string(out), false, fmt.Errorf("systemd-run: %v: %s", runErr, strings.TrimSpace(string(sdOut)))
}

// withStderr adds what a command run with Output printed on stderr to
// its error, which otherwise says only its exit status.
func withStderr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(bytes.TrimSpace(ee.Stderr)) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

// showProps parses `systemctl show -p ...` output into its properties.
func showProps(show []byte) map[string]string {
	props := map[string]string{}
	for _, line := range strings.Split(string(show), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			props[k] = v
		}
	}
	return props
}

// diagnoseUnit is doctor --unit name: the unit's user, its delegated
// cgroup and the controllers the server hands to its runs; then, as root,
// a doctor run inside the unit's settings, and a hardening option that
// breaks a run, if one does.
func diagnoseUnit(name string) []check {
	var checks []check
	add := func(c check) { checks = append(checks, c) }
	root := os.Geteuid() == 0
	show, err := exec.Command("systemctl", "show", name, "-p", "User", "-p", "ControlGroup", "-p", "ActiveState",
		"-p", "Delegate", "-p", "LoadState").Output()
	err = withStderr(err)
	if err != nil && root {
		return []check{{Name: "unit", Detail: fmt.Sprintf("systemctl show %s: %v", name, err), Fix: "doctor --unit needs systemd"}}
	}
	props := showProps(show)
	if err != nil {
		// Not root, and no D-Bus to ask systemd through: the unit's
		// cgroup is read where systemd puts a system service's.
		add(check{Name: "unit", OK: true, Detail: fmt.Sprintf("systemctl show %s: %v; reading its cgroup where systemd puts it", name, err),
			Fix: "sudo safe-run doctor --unit " + name})
		props = map[string]string{"ActiveState": "active", "ControlGroup": "/system.slice/" + name, "Delegate": "yes"}
		if u, err := user.Current(); err == nil {
			props["User"] = u.Username
		}
	} else {
		if props["LoadState"] != "loaded" {
			return []check{{Name: "unit", Detail: fmt.Sprintf("%s is %s", name, props["LoadState"]), Fix: "make install-service"}}
		}
		userOK := props["User"] != "" && props["User"] != "root"
		add(check{Name: "unit", OK: userOK, Detail: fmt.Sprintf("%s is %s, runs as user %q", name, props["ActiveState"], props["User"]),
			Fix: fixIf(!userOK, "set User= to a dedicated user: as root, an escape from gVisor lands as root")})
	}

	cg := filepath.Join("/sys/fs/cgroup", props["ControlGroup"])
	if props["ActiveState"] != "active" || props["ControlGroup"] == "" {
		add(check{Name: "cgroups", Detail: name + " is not running, so its cgroup cannot be read", Fix: "systemctl start " + name})
	} else {
		add(unitCgroupCheck(cg, props["User"], props["Delegate"] == "yes"))
	}
	if !root {
		add(check{Name: "hardening", OK: true, Detail: "not checked: a doctor run inside the unit's settings, and trying each hardening option, " +
			"start transient services with systemd-run, which needs root", Fix: "sudo safe-run doctor --unit " + name})
		return checks
	}

	text, err := exec.Command("systemctl", "cat", name).Output()
	if err = withStderr(err); err != nil {
		add(check{Name: "hardening", Detail: fmt.Sprintf("systemctl cat %s: %v", name, err)})
		return checks
	}
	u := parseUnit(string(text))
	if u.exec == "" {
		add(check{Name: "hardening", Detail: name + " has no ExecStart"})
		return checks
	}
	stateDir := "--state-dir=/run/" + unitRunDir
	out, ok, err := runTransient(u, "", "doctor", stateDir)
	if err != nil {
		add(check{Name: "doctor", Detail: "could not start a service with the unit's settings: " + err.Error(),
			Fix: "this is systemd-run's failure, not the unit's: fix it and run doctor --unit again"})
		return checks
	}
	add(check{Name: "doctor", OK: ok, Detail: fmt.Sprintf("doctor as %s with the unit's %d settings (%d of them hardening):\n%s",
		props["User"], len(u.kept)+len(u.hardening), len(u.hardening), strings.TrimRight(indent(out), "\n")),
		Fix: fixIf(!ok, "see the FAIL lines above; the hardening check names an option that breaks a run")})
	if ok {
		add(check{Name: "hardening", OK: true, Detail: fmt.Sprintf("a run works with all %d hardening options of %s", len(u.hardening), name)})
		return checks
	}
	probe := []string{"run", stateDir, "--lang", "python", "-c", "print(6*7)"}
	out, ok, err = runTransient(u, "", probe...)
	switch {
	case err != nil:
		add(check{Name: "hardening", Detail: "not checked: " + err.Error()})
		return checks
	case ok:
		add(check{Name: "hardening", OK: true, Detail: "a python run works with every hardening option; the failure above is elsewhere"})
		return checks
	}
	var breaking []string
	for _, h := range u.hardening {
		_, ok, err := runTransient(u, h, probe...)
		if err != nil {
			add(check{Name: "hardening", Detail: fmt.Sprintf("not checked (without %s): %v", h, err)})
			return checks
		}
		if ok {
			breaking = append(breaking, h)
		}
	}
	if len(breaking) == 0 {
		add(check{Name: "hardening", Detail: "a python run fails with the unit's settings even without any one hardening option:\n" +
			strings.TrimRight(indent(out), "\n"), Fix: "the output above names the cause; compare with `safe-run doctor` run as " + props["User"]})
		return checks
	}
	add(check{Name: "hardening", Detail: "a run works only without: " + strings.Join(breaking, ", "),
		Fix: "remove these from " + name + " (a drop-in: systemctl edit " + name + ")"})
	return checks
}

// unitCgroupCheck reads the running unit's cgroup dir: the controllers
// delegated to it, whether the service user owns it, and which controllers
// the server has handed down to its runs (the limits that hold).
func unitCgroupCheck(dir, userName string, delegate bool) check {
	c := check{Name: "cgroups"}
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		c.Detail, c.Fix = fmt.Sprintf("read %s: %v", dir, err), "the unit needs cgroup v2 (systemd.unified_cgroup_hierarchy=1)"
		if errors.Is(err, os.ErrNotExist) {
			c.Fix = "is the unit running (systemctl status)? it also needs cgroup v2 (systemd.unified_cgroup_hierarchy=1)"
		}
		return c
	}
	have := strings.Fields(string(data))
	given, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	owner := "?"
	if st, err := os.Stat(filepath.Join(dir, "cgroup.subtree_control")); err == nil {
		owner = strconv.Itoa(int(st.Sys().(*syscall.Stat_t).Uid))
		if u, err := user.LookupId(owner); err == nil {
			owner = u.Username
		}
	}
	var holds, missing []string
	for _, ctl := range []string{"memory", "pids", "cpu"} {
		if slices.Contains(strings.Fields(string(given)), ctl) {
			holds = append(holds, ctl)
		} else {
			missing = append(missing, ctl)
		}
	}
	c.OK = delegate && owner == userName && len(missing) == 0
	c.Detail = fmt.Sprintf("%s delegated to %s (controllers: %s); limits that hold for runs: %s%s",
		dir, owner, strings.Join(have, " "), joinOr(holds, "none"), listIfAny(" — not given to runs: ", missing))
	c.Fix = fixIf(!c.OK, "set Delegate=yes in the unit, run it as its User=, and keep ProtectControlGroups= off")
	return c
}

func joinOr(list []string, none string) string {
	if len(list) == 0 {
		return none
	}
	return strings.Join(list, ", ")
}
