package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// Environment describes what code finds in the sandbox. It is published as
// a resource and summarised in the tool's description, so that a model
// knows what it can use before it writes code.
type Environment struct {
	Languages []LanguageInfo `json:"languages"`
	// Network is "none" (nothing can be downloaded or installed) or
	// "allowlist": a call that asks for it reaches what NetworkAccess lists.
	Network string `json:"network"`
	// NetworkAccess is what calls may ask to reach and install; nil
	// without a network.
	NetworkAccess *NetworkAccess `json:"network_access,omitempty"`
	// Workdir is where code runs and input files are placed.
	Workdir string `json:"workdir"`
	// OutputDir is where code writes files it wants returned.
	OutputDir string `json:"output_dir"`
	// Sessions, when offered, bound the stateful sessions; without them
	// every call starts in a fresh sandbox.
	Sessions *SessionLimits `json:"sessions,omitempty"`
	// DefaultLimits and MaxLimits are the limits calls get and may ask for.
	DefaultLimits LimitsInfo `json:"default_limits"`
	MaxLimits     LimitsInfo `json:"max_limits"`
	// OutputFiles bounds the files returned from OutputDir.
	OutputFiles sandbox.OutputFileLimits `json:"output_files"`
	// Images are the images run_code may choose with its image argument.
	Images []string `json:"images,omitempty"`
}

// NetworkAccess describes the network calls may ask for (their network
// and packages arguments).
type NetworkAccess struct {
	// Allowlist is the server's list, as canonical entries.
	Allowlist []string `json:"allowlist"`
	// Presets are the presets a call may name, each with its entries.
	Presets map[string][]string `json:"presets,omitempty"`
	// Packages are what calls may install: names, names with a version
	// specifier, or "*".
	Packages []string `json:"packages,omitempty"`
	// PackageIndex names the indexes installs use instead of the public ones.
	PackageIndex *sandbox.PackageIndex `json:"package_index,omitempty"`
	// Limits cap each run's network (defaults filled in).
	Limits egress.Limits `json:"limits"`
}

// SessionLimits describes the limits of sessions.
type SessionLimits struct {
	MaxSessions        int     `json:"max_sessions"`
	IdleTimeoutSeconds float64 `json:"idle_timeout_seconds"`
	MaxLifetimeSeconds float64 `json:"max_lifetime_seconds"`
}

// LanguageInfo describes one language of the sandbox.
type LanguageInfo struct {
	Name string `json:"name"`
	// Version is the interpreter's version, e.g. "3.11.2".
	Version string `json:"version,omitempty"`
	// Packages maps installed packages (Python distributions) to versions.
	Packages map[string]string `json:"packages,omitempty"`
}

// LimitsInfo is the part of sandbox.Limits a client can see.
type LimitsInfo struct {
	TimeoutSeconds float64 `json:"timeout_seconds"`
	MemoryBytes    int64   `json:"memory_bytes"`
	Processes      int     `json:"processes"`
	CPUs           float64 `json:"cpus"`
	OutputBytes    int64   `json:"output_bytes"`
	WorkspaceBytes int64   `json:"workspace_bytes"`
}

func limitsInfo(l sandbox.Limits) LimitsInfo {
	return LimitsInfo{
		TimeoutSeconds: l.Timeout.Seconds(), MemoryBytes: l.MemoryBytes, Processes: l.Processes,
		CPUs: l.CPUs, OutputBytes: l.OutputBytes, WorkspaceBytes: l.WorkspaceBytes,
	}
}

// probes print one JSON object describing the interpreter; keyed by the
// command's program name so that a configured language reuses them.
var probes = map[string]string{
	"python3": `import json, sys, importlib.metadata as m
print(json.dumps({"version": sys.version.split()[0],
    "packages": {d.metadata["Name"]: d.version for d in m.distributions() if d.metadata["Name"]}}))`,
	"node": `console.log(JSON.stringify({version: process.versions.node}))`,
	"bash": `printf '{"version": "%s"}\n' "${BASH_VERSION%%(*}"`,
}

// ProbeEnvironment runs a short program per language in the sandbox to
// learn interpreter versions and installed packages. Languages whose probe
// fails are listed without them. Limits and images are the runner's policy's.
func ProbeEnvironment(ctx context.Context, runner sandbox.Runner) Environment {
	policy := runner.Policy()
	def, _, hi := policy.Limits()
	env := Environment{
		Network: "none", Workdir: "/workspace", OutputDir: "/workspace/" + outputDir,
		DefaultLimits: limitsInfo(def), MaxLimits: limitsInfo(hi), OutputFiles: policy.OutputFileLimits(),
		Images: policy.Images, NetworkAccess: networkAccess(policy),
	}
	if env.NetworkAccess != nil {
		env.Network = "allowlist"
	}
	langs := policy.Languages
	if len(langs) == 0 {
		langs = sandbox.DefaultLanguages
	}
	env.Languages = make([]LanguageInfo, len(langs))
	var wg sync.WaitGroup
	for i, l := range langs {
		env.Languages[i].Name = l.Name
		code, ok := probes[l.Command[0]]
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := runner.Run(ctx, sandbox.Job{Language: l.Name, Code: code, Limits: sandbox.Limits{Timeout: 30 * time.Second}})
			if err == nil && res.Status == sandbox.StatusOK {
				_ = json.Unmarshal([]byte(res.Stdout), &env.Languages[i])
				env.Languages[i].Name = l.Name
			}
		}()
	}
	wg.Wait()
	return env
}

// notablePackages are named in the tool description when installed; the
// environment resource lists every package.
var notablePackages = []string{"numpy", "pandas", "matplotlib", "pytest", "scipy", "sympy", "scikit-learn", "pillow", "requests"}

// describeLanguages renders the languages for the tool description, e.g.
// "python (Python 3.11.2 with numpy 1.24.2, pandas 1.5.3; standard library)".
func (e Environment) describeLanguages() string {
	var parts []string
	for _, l := range e.Languages {
		var b strings.Builder
		b.WriteString(l.Name)
		switch {
		case l.Version == "":
		case l.Name == "python":
			fmt.Fprintf(&b, " (Python %s", l.Version)
			var pkgs []string
			for name, v := range l.Packages {
				for _, n := range notablePackages {
					if strings.EqualFold(name, n) {
						pkgs = append(pkgs, n+" "+v)
					}
				}
			}
			sort.Strings(pkgs)
			if len(pkgs) > 0 {
				b.WriteString(" with " + strings.Join(pkgs, ", ") + ", and the standard library")
			}
			b.WriteString(")")
		case l.Name == "node":
			fmt.Fprintf(&b, " (Node.js %s, CommonJS, built-in modules only)", l.Version)
		case l.Name == "bash":
			fmt.Fprintf(&b, " (GNU bash %s with coreutils)", l.Version)
		default:
			fmt.Fprintf(&b, " (%s)", l.Version)
		}
		parts = append(parts, b.String())
	}
	return strings.Join(parts, "; ")
}

// names lists the language names, in order.
func (e Environment) names() []string {
	var out []string
	for _, l := range e.Languages {
		out = append(out, l.Name)
	}
	return out
}
