package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/runtime"
)

// hostFlags are the settings that say where safe-run finds its parts on
// this host. Each can also come from an environment variable (hostEnv);
// unset, runsc and the agent are looked for next to the safe-run binary.
type hostFlags struct {
	runsc, agent, cacheDir, image, stateDir, platform, debugLogDir string
}

// hostEnv names the environment variable of each host flag.
var hostEnv = map[string]string{
	"runsc":         "SAFE_RUN_RUNSC",
	"agent":         "SAFE_RUN_AGENT",
	"cache-dir":     "SAFE_RUN_CACHE",
	"image":         "SAFE_RUN_IMAGE",
	"state-dir":     "SAFE_RUN_STATE_DIR",
	"platform":      "SAFE_RUN_PLATFORM",
	"debug-log-dir": "SAFE_RUN_DEBUG_LOG_DIR",
}

func (h *hostFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.runsc, "runsc", "", "runsc binary (default: runsc next to safe-run, then in PATH)")
	fs.StringVar(&h.agent, "agent", "", "safe-run-agent binary (default: next to safe-run)")
	fs.StringVar(&h.cacheDir, "cache-dir", rootfs.DefaultDir(), "image cache directory")
	fs.StringVar(&h.image, "image", rootfs.DefaultName, "name of the image to run in")
	fs.StringVar(&h.stateDir, "state-dir", runtime.DefaultStateDir(), "directory for per-run state")
	fs.StringVar(&h.platform, "platform", "systrap", "gVisor platform")
	fs.StringVar(&h.debugLogDir, "debug-log-dir", "", "keep runsc debug logs below this directory")
}

// runscPath is the runsc to use and where that choice came from.
func (h *hostFlags) runscPath() (path, source string) {
	if h.runsc != "" {
		return h.runsc, "--runsc or SAFE_RUN_RUNSC"
	}
	if p := besideExecutable("runsc"); p != "" {
		return p, "next to safe-run"
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p, "PATH"
	}
	return "", "not found"
}

func (h *hostFlags) agentPath() string {
	if h.agent != "" {
		return h.agent
	}
	if p := besideExecutable("safe-run-agent"); p != "" {
		return p
	}
	return besideExecutable("../libexec/safe-run/safe-run-agent")
}

func (h *hostFlags) store() rootfs.Store { return rootfs.Store{Dir: h.cacheDir} }

// besideExecutable returns the path of name relative to the directory of
// the running safe-run binary, if a file is there.
func besideExecutable(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	p := filepath.Clean(filepath.Join(filepath.Dir(exe), name))
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// runtimeConfig resolves the flags into a runtime configuration, looking up
// the image.
func (h *hostFlags) runtimeConfig() (runtime.Config, error) {
	if err := runtime.CheckPrivileges(); err != nil {
		return runtime.Config{}, err
	}
	img, err := h.store().Lookup(h.image)
	if err != nil {
		return runtime.Config{}, err
	}
	runsc, _ := h.runscPath()
	return runtime.Config{
		Runsc:       runsc,
		Agent:       h.agentPath(),
		Rootfs:      img.Root,
		StateDir:    h.stateDir,
		Platform:    h.platform,
		DebugLogDir: h.debugLogDir,
		Logger:      newLogger(),
	}, nil
}

// imageMountpoints are the paths every image needs for the sandbox's mounts.
func imageMountpoints() rootfs.Mountpoints {
	dirs, files := bundle.Mountpoints()
	return rootfs.Mountpoints{Dirs: dirs, Files: files}
}
