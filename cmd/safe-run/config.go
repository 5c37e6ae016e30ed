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
// this host. Each flag falls back to an environment variable, then to a
// default found next to the safe-run executable.
type hostFlags struct {
	runsc, agent, cacheDir, image, stateDir, platform, debugLogDir string
}

func (h *hostFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.runsc, "runsc", os.Getenv("SAFE_RUN_RUNSC"), "runsc binary (env SAFE_RUN_RUNSC; default: runsc next to safe-run, then in PATH)")
	fs.StringVar(&h.agent, "agent", os.Getenv("SAFE_RUN_AGENT"), "safe-run-agent binary (env SAFE_RUN_AGENT; default: next to safe-run)")
	fs.StringVar(&h.cacheDir, "cache-dir", "", "image cache directory (env SAFE_RUN_CACHE; default "+rootfs.DefaultDir()+")")
	fs.StringVar(&h.image, "image", envOr("SAFE_RUN_IMAGE", rootfs.DefaultName), "name of the image to run in (env SAFE_RUN_IMAGE)")
	fs.StringVar(&h.stateDir, "state-dir", os.Getenv("SAFE_RUN_STATE_DIR"), "directory for per-run state (env SAFE_RUN_STATE_DIR; default "+runtime.DefaultStateDir()+")")
	fs.StringVar(&h.platform, "platform", envOr("SAFE_RUN_PLATFORM", "systrap"), "gVisor platform (env SAFE_RUN_PLATFORM)")
	fs.StringVar(&h.debugLogDir, "debug-log-dir", os.Getenv("SAFE_RUN_DEBUG_LOG_DIR"), "keep runsc debug logs below this directory (env SAFE_RUN_DEBUG_LOG_DIR)")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
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
