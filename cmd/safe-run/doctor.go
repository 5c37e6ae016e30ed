package main

import (
	"context"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// check is one line of the doctor's report.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

func cmdDoctor(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	var host hostFlags
	var net netFlags
	var kube kubeFlags
	env := registerWithEnv(fs, host.register, kube.register, net.registerHost)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	unit := fs.String("unit", "", "as root: check the systemd `unit` that runs safe-run serve (its user, delegated cgroup, and a run inside its hardening)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: safe-run doctor [flags]\n\nChecks that this host (or, with --backend kubernetes, the cluster) can run\nsandboxes, and says how to fix what is missing.\n\nFlags:")
		printSettings(fs, env)
	}
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if err := applySettings(fs, env, os.LookupEnv, ""); err != nil {
		return fail(usageError("%v", err))
	}
	var checks []check
	switch {
	case *unit != "":
		checks = diagnoseUnit(*unit)
	case kube.backend == "kubernetes":
		checks = diagnoseKubernetes(&host, &kube)
	case kube.backend != "" && kube.backend != "gvisor":
		return fail(usageError("--backend %q is not one of gvisor and kubernetes", kube.backend))
	default:
		checks = diagnose(&host, &net)
	}
	ok := true
	for _, c := range checks {
		ok = ok && c.OK
	}
	if *asJSON {
		printJSON(map[string]any{"ok": ok, "checks": checks})
	} else {
		for _, c := range checks {
			mark := "PASS"
			switch {
			case !c.OK:
				mark = "FAIL"
			case c.Fix != "":
				mark = "WARN" // works, and could be stronger
			}
			fmt.Printf("%s  %-9s %s\n", mark, c.Name, c.Detail)
			if c.Fix != "" {
				fmt.Printf("      %-9s fix: %s\n", "", c.Fix)
			}
		}
		switch {
		case ok && kube.backend == "kubernetes":
			fmt.Println("\nthe cluster is ready: try `safe-run run --backend kubernetes --image REF --lang python -c 'print(1)'`")
		case ok:
			fmt.Println("\nsafe-run is ready: try `safe-run run --lang python -c 'print(1)'`")
		default:
			fmt.Println("\nsafe-run cannot run sandboxes here until the FAIL lines are fixed.")
		}
	}
	if !ok {
		return 1
	}
	return 0
}

// diagnose checks everything a run needs, in the order a newcomer would
// fix them, and finally starts a real sandbox per language.
func diagnose(host *hostFlags, net *netFlags) []check {
	var checks []check
	add := func(c check) bool { checks = append(checks, c); return c.OK }

	userOK := add(checkUser())

	runsc, source := host.runscPath()
	runscOK := add(checkRunsc(runsc, source))
	agentOK := add(checkAgent(host.agentPath()))

	store := host.store()
	img, from, err := store.find(host.image)
	imageOK := err == nil
	if err != nil {
		add(check{Name: "image", Detail: err.Error(), Fix: "make rootfs"})
	} else {
		missing := missingInterpreters(img.Root)
		imageOK = len(missing) == 0
		add(check{Name: "image", OK: imageOK,
			Detail: fmt.Sprintf("%q is %s at %s (%s), from %s%s", host.image, img.Key, img.Root, sandbox.FormatBytes(img.Stats.Bytes), store.describe(from), listIfAny(" — missing: ", missing)),
			Fix:    fixIf(!imageOK, "rebuild the image: make rootfs")})
	}

	stateDir := host.stateDir
	if stateDir == "" {
		stateDir = defaultStateDir()
	}
	stateErr := checkWritableDir(stateDir)
	add(check{Name: "state", OK: stateErr == nil, Detail: "per-run state in " + stateDir + errSuffix(stateErr),
		Fix: fixIf(stateErr != nil, "choose a writable local directory with "+flagOrEnv("state-dir"))})

	cgroups := checkCgroups()
	cgErr := error(nil)
	if !cgroups.OK {
		cgErr = errors.New(cgroups.Detail)
	}
	add(cgroups)

	platformOK := host.platform != "kvm"
	if host.platform == "kvm" {
		_, err := os.Stat("/dev/kvm")
		platformOK = err == nil
	}
	add(check{Name: "platform", OK: platformOK, Detail: "gVisor platform " + host.platform,
		Fix: fixIf(!platformOK, "use --platform systrap (kvm needs /dev/kvm)")})

	if userOK {
		add(checkNetwork(host, net))
	}

	if !(runscOK && agentOK && imageOK && stateErr == nil && cgErr == nil && platformOK && userOK) {
		add(check{Name: "sandbox", Detail: "not tried until the checks above pass"})
		return checks
	}
	add(trySandbox(host))
	return checks
}

// checkUser says whether this process can start sandboxes: as root, or as
// an ordinary user in a user namespace of its own.
func checkUser() check {
	if hostRoot() {
		return check{Name: "user", OK: true, Detail: "running as root"}
	}
	uid := os.Getuid()
	if os.Geteuid() == 0 {
		uid = hostUID() // root of safe-run's own user namespace
	}
	c := check{Name: "user", Detail: fmt.Sprintf("running as uid %d without root", uid)}
	if os.Geteuid() != 0 {
		// enterUserNamespace did not get this far.
		err := userNamespaceCheck()
		if err == nil {
			err = errors.New("a user namespace could not be created a moment ago, and now can")
		}
		c.Detail += ": " + err.Error()
		c.Fix = userNamespaceFix(err)
		return c
	}
	if err := userNamespaceCapable(); err != nil {
		c.Detail += "; a user namespace was created, but its root is powerless: " + err.Error()
		c.Fix = userNamespaceFix(err)
		return c
	}
	c.OK = true
	c.Detail = fmt.Sprintf("running as uid %d without root; sandboxes run in a user namespace of safe-run's own (no setuid helper)", hostUID())
	return c
}

// checkCgroups says where runs' cgroups go, and without root what limits
// hold and how to get the stronger ones.
func checkCgroups() check {
	if hostRoot() {
		layout, err := detectCgroups()
		return check{Name: "cgroups", OK: err == nil, Detail: describeCgroups(layout) + errSuffix(err),
			Fix: fixIf(err != nil, "run safe-run in a cgroup with the memory, pids and cpu controllers available to it")}
	}
	layout, err := detectUserCgroups()
	if err == nil {
		return check{Name: "cgroups", OK: true, Detail: "delegated cgroup v2 " + layout.Parents[""] +
			": memory, pids and CPU limits are enforced by the kernel, as for root"}
	}
	// The cause names the fix; the rest says what holds meanwhile.
	cause, fix, _ := strings.Cut(err.Error(), "; ")
	return check{Name: "cgroups", OK: true,
		Detail: "no delegated cgroup (" + cause + "): memory is enforced by safe-run watching gVisor's memory every 50ms, " +
			"processes, open files, file sizes and tmpfs sizes by gVisor, time by the host; CPU use is not capped",
		Fix: "for kernel-enforced memory, pids and CPU limits, " + fix}
}

func checkRunsc(path, source string) check {
	c := check{Name: "runsc", Fix: "build the pinned runsc with `make runsc`, or name one with " + flagOrEnv("runsc")}
	if path == "" {
		c.Detail = "runsc not found next to safe-run or in PATH"
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	version, err := runscVersion(ctx, path)
	if err != nil {
		c.Detail = fmt.Sprintf("%s (%s) does not run: %v", path, source, err)
		return c
	}
	c.OK, c.Fix = true, ""
	c.Detail = fmt.Sprintf("%s (%s), version %s", path, source, version)
	return c
}

func checkAgent(path string) check {
	c := check{Name: "agent", Fix: "build it with `make`, or name it with " + flagOrEnv("agent")}
	if path == "" {
		c.Detail = "safe-run-agent not found next to safe-run"
		return c
	}
	f, err := elf.Open(path)
	if err != nil {
		c.Detail = fmt.Sprintf("%s is not an executable: %v", path, err)
		return c
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			c.Detail = path + " is dynamically linked; the sandbox needs a static binary"
			c.Fix = "rebuild it with CGO_ENABLED=0: make bin/safe-run-agent"
			return c
		}
	}
	c.OK, c.Fix, c.Detail = true, "", path+" (static)"
	return c
}

// missingInterpreters lists the languages whose command is not in the image.
func missingInterpreters(root string) []string {
	var missing []string
	for _, l := range sandbox.DefaultLanguages {
		found := false
		for _, dir := range []string{"usr/local/bin", "usr/bin", "bin"} {
			if fi, err := os.Stat(filepath.Join(root, dir, l.Command[0])); err == nil && !fi.IsDir() {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, l.Name+" ("+l.Command[0]+")")
		}
	}
	return missing
}

func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".doctor-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	// A run writes its bundle there, tens of KiB: an empty file would pass
	// on a full file system.
	_, err = f.Write(make([]byte, 64<<10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func describeCgroups(l cgroupLayout) string {
	var parts []string
	for _, c := range []string{"", "memory", "pids", "cpu", "cpuacct"} {
		if p, ok := l.Parents[c]; ok {
			name := c
			if name == "" {
				name = "unified"
			}
			parts = append(parts, name+"="+p)
		}
	}
	return fmt.Sprintf("%s; runs' cgroups go below safe-run's own: %s (each run: safe-run-<uuid>)", l.Mode, strings.Join(parts, " "))
}

// trySandbox starts one real sandbox per language.
func trySandbox(host *hostFlags) check {
	c := check{Name: "sandbox", Fix: "run with SAFE_RUN_LOG_LEVEL=debug and --debug-log-dir DIR, and read runsc's logs"}
	cfg, err := host.runtimeConfig()
	if err == nil {
		var rt backend
		if rt, err = newBackend(cfg); err == nil {
			defer closeBackend(rt) // a result comes before its sandbox's removal
			var times []string
			for _, l := range sandbox.DefaultLanguages {
				code := map[string]string{"python": "print('ok')", "node": "console.log('ok')", "bash": "echo ok"}[l.Name]
				start := time.Now()
				res, rerr := rt.Run(context.Background(), sandbox.Job{Language: l.Name, Code: code, Limits: sandbox.Limits{Timeout: 20 * time.Second}})
				if rerr == nil && (res.Status != sandbox.StatusOK || strings.TrimSpace(res.Stdout) != "ok") {
					rerr = fmt.Errorf("%s: status %s: %s%s", l.Name, res.Status, res.Message, strings.TrimSpace(res.Stderr))
				}
				if rerr != nil {
					err = rerr
					break
				}
				times = append(times, fmt.Sprintf("%s %dms", l.Name, time.Since(start).Milliseconds()))
			}
			if err == nil {
				c.OK, c.Fix = true, ""
				c.Detail = "started a sandbox per language: " + strings.Join(times, ", ")
				return c
			}
		}
	}
	c.Detail = "a test run failed: " + err.Error()
	return c
}

func fixIf(cond bool, fix string) string {
	if cond {
		return fix
	}
	return ""
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

func listIfAny(prefix string, items []string) string {
	if len(items) == 0 {
		return ""
	}
	return prefix + strings.Join(items, ", ")
}
