package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/sandbox"
)

// poolFlags configure the warm pool of `serve`.
type poolFlags struct {
	sizes       string
	preload     string
	memory      int64
	checkpoints bool
}

// defaultPool keeps enough warm sandboxes for a client's bursts of calls
// while costing little memory when idle (see the README's benchmark).
const defaultPool = "python=2,node=1,bash=1"

func (p *poolFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.sizes, "pool", defaultPool, "warm sandboxes kept ready per language, as `LANG=N,...`; each serves one run (empty or 0 disables)")
	fs.StringVar(&p.preload, "preload", defaultPreload(), "modules the warm interpreters import, as `LANG=MOD,MOD;LANG=...`")
	p.memory = defaultPoolMemory
	fs.Var(sizeFlag{&p.memory}, "pool-memory", "most memory the warm sandboxes use together (a `size`)")
	fs.BoolVar(&p.checkpoints, "checkpoints", true, "refill the pool by restoring a cached checkpoint of a warm sandbox (Python)")
}

func defaultPreload() string {
	var parts []string
	for _, lang := range sortedKeys(preloadModules) {
		parts = append(parts, lang+"="+strings.Join(preloadModules[lang], ","))
	}
	return strings.Join(parts, ";")
}

// config turns the flags into the engine's pool configuration.
func (p *poolFlags) config() (poolConfig, error) {
	cfg := poolConfig{Size: map[string]int{}, Preload: map[string][]string{}, MemoryBytes: p.memory}
	for _, part := range splitList(p.sizes, ",") {
		lang, n, ok := strings.Cut(part, "=")
		size, err := strconv.Atoi(n)
		if !ok || err != nil || size < 0 {
			return cfg, &sandbox.InputError{Field: "pool", Msg: fmt.Sprintf("%q is not LANG=N with N ≥ 0, e.g. python=2", part)}
		}
		cfg.Size[strings.TrimSpace(lang)] = size
	}
	preload, err := parsePreload(p.preload)
	if err != nil {
		return cfg, err
	}
	maps.Copy(cfg.Preload, preload)
	return cfg, nil
}

// parsePreload reads a --preload value, `LANG=MOD,MOD;LANG=...`.
func parsePreload(value string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, part := range splitList(value, ";") {
		lang, mods, ok := strings.Cut(part, "=")
		if !ok {
			return nil, &sandbox.InputError{Field: "preload", Msg: fmt.Sprintf("%q is not LANG=MOD,MOD, e.g. python=numpy,pandas", part)}
		}
		out[strings.TrimSpace(lang)] = splitList(mods, ",")
	}
	return out, nil
}

// checkpointDir is where the backend keeps checkpoint images of warm
// sandboxes, below cacheDir (see checkpointDir), or "" for none.
func (p *poolFlags) checkpointDir(cacheDir string) string {
	if !p.checkpoints {
		return ""
	}
	return checkpointDir(cacheDir)
}

// checkpointDir is where checkpoint images of warm sandboxes are cached:
// beside the images, or in the user's own cache when the image cache is
// one the user may only read (root's, shared through SAFE_RUN_CACHE).
func checkpointDir(cacheDir string) string {
	if unix.Access(cacheDir, unix.W_OK) != nil {
		if own, err := os.UserCacheDir(); err == nil {
			return filepath.Join(own, "safe-run", "checkpoints")
		}
	}
	return filepath.Join(cacheDir, "checkpoints")
}

// splitList splits s at sep, trimming spaces and dropping empty parts.
func splitList(s, sep string) []string {
	var out []string
	for _, part := range strings.Split(s, sep) {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
