package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/sandbox"
)

// hostFlags are the settings that say where safe-run finds its parts on
// this host. Each can also come from an environment variable (envName);
// unset, runsc and the agent are looked for next to the safe-run binary.
type hostFlags struct {
	runsc, agent, cacheDir, image, stateDir, platform, debugLogDir string
	languages                                                      []sandbox.Language
	cacheSet                                                       bool // --cache-dir or SAFE_RUN_CACHE given
}

func (h *hostFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.runsc, "runsc", "", "runsc binary (default: runsc next to safe-run, then in PATH)")
	fs.StringVar(&h.agent, "agent", "", "safe-run-agent binary (default: next to safe-run)")
	h.cacheDir = rootfs.DefaultDir()
	fs.Var(cacheDirFlag{h}, "cache-dir", "image cache `directory`; unless given, images it lacks are looked up in the system cache "+rootfs.SystemDir+", read-only")
	fs.StringVar(&h.image, "image", rootfs.DefaultName, "image to run in, by name (see `safe-run image ls`), unless a language names its own")
	h.languages = sandbox.DefaultLanguages
	fs.Var(languagesFlag{&h.languages}, "languages", "JSON list of languages added to or replacing "+joinNames(sandbox.Policy{}.LanguageNames(), "and")+
		`, e.g. [{"name":"ruby","image":"ruby:3.3","filename":"main.rb","command":["ruby","main.rb"]}]`)
	h.stateDir = defaultStateDir()
	fs.Var(absPathFlag{&h.stateDir}, "state-dir", "`directory` for per-run state")
	fs.StringVar(&h.platform, "platform", defaultPlatform, "gVisor platform")
	fs.Var(absPathFlag{&h.debugLogDir}, "debug-log-dir", "keep runsc debug logs below this `directory`")
}

// runscPath is the runsc to use and where that choice came from.
func (h *hostFlags) runscPath() (path, source string) {
	if h.runsc != "" {
		return h.runsc, flagOrEnv("runsc")
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

// cacheDirFlag is --cache-dir, noting that it was given.
type cacheDirFlag struct{ h *hostFlags }

func (f cacheDirFlag) String() string {
	if f.h == nil {
		return ""
	}
	return f.h.cacheDir
}

// Get makes it a text setting (settingKind).
func (f cacheDirFlag) Get() any { return f.h.cacheDir }

func (f cacheDirFlag) Set(v string) error {
	f.h.cacheSet = true
	return absPathFlag{&f.h.cacheDir}.Set(v)
}

// defaultCacheEnv is set to 1 by safe-run for itself continuing in a user
// namespace (enterUserNamespace), where SAFE_RUN_CACHE then carries the
// user's default cache rather than a cache the user chose.
const defaultCacheEnv = "SAFE_RUN_CACHE_IS_DEFAULT"

// store is the image cache: the cache directory, and the system cache for
// a user who chose no cache directory.
func (h *hostFlags) store() imageCache {
	c := imageCache{own: rootfs.Store{Dir: h.cacheDir}}
	passed, _ := filepath.Abs(os.Getenv(envName("cache-dir")))
	chosen := h.cacheSet && (os.Getenv(defaultCacheEnv) != "1" || h.cacheDir != passed)
	if !chosen && filepath.Clean(h.cacheDir) != rootfs.SystemDir {
		c.system = &rootfs.Store{Dir: rootfs.SystemDir}
	}
	return c
}

// imageCache looks images up in a cache directory of the user's, then in
// the system cache, which only root writes: an ordinary user's first run
// uses the default image root built. Nothing here writes to either.
type imageCache struct {
	own    rootfs.Store
	system *rootfs.Store // nil: the cache directory only
}

// Lookup returns the image that name points to.
func (c imageCache) Lookup(name string) (rootfs.Image, error) {
	img, _, err := c.find(name)
	return img, err
}

// find returns the image that name points to and the cache it is in.
func (c imageCache) find(name string) (img rootfs.Image, dir string, err error) {
	img, err = c.own.Lookup(name)
	var missing *rootfs.NotFoundError
	if err == nil || c.system == nil || !errors.As(err, &missing) {
		return img, c.own.Path(), err
	}
	img, serr := c.system.Lookup(name)
	if serr == nil {
		return img, c.system.Path(), nil
	}
	if errors.As(serr, &missing) {
		return img, "", &rootfs.NotFoundError{Name: name, Dir: c.own.Path() + " or " + c.system.Path()}
	}
	return img, "", serr
}

// describe says which cache dir is, for doctor.
func (c imageCache) describe(dir string) string {
	if c.system != nil && dir == c.system.Path() {
		return "the system cache " + dir + " (read-only; " + c.own.Path() + " has none of that name)"
	}
	return "the cache " + dir
}

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

// languageTable is the configured languages, each with its image: its own,
// or the --image one.
func (h *hostFlags) languageTable() []sandbox.Language {
	langs := slices.Clone(h.languages)
	for i := range langs {
		if langs[i].Image == "" {
			langs[i].Image = h.image
		}
	}
	return langs
}

// runtimeConfig resolves the flags into a runtime configuration, checking
// that the image and those of the languages are in the cache. Its policy
// has the language table; callers add the rest.
func (h *hostFlags) runtimeConfig() (backendConfig, error) {
	if err := checkPrivileges(); err != nil {
		return backendConfig{}, withHint(err)
	}
	store := h.store()
	img, err := store.Lookup(h.image)
	if err != nil {
		return backendConfig{}, err
	}
	langs := h.languageTable()
	for _, l := range langs {
		if _, err := store.Lookup(l.Image); err != nil {
			return backendConfig{}, fmt.Errorf("language %s: %w", l.Name, err)
		}
	}
	runsc, _ := h.runscPath()
	logger := newLogger()
	var cfg backendConfig
	cfg.Backend.Runsc, cfg.Backend.Agent = runsc, h.agentPath()
	cfg.Backend.Rootfs, cfg.Backend.Images = img.Root, storeImages(store)
	cfg.Backend.StateDir, cfg.Backend.Platform = h.stateDir, h.platform
	cfg.Backend.DebugLogDir, cfg.Backend.Logger = h.debugLogDir, logger
	cfg.Engine.Policy, cfg.Engine.Logger = sandbox.Policy{Languages: langs}, logger
	return cfg, nil
}

// storeImages resolves image references to images of the store, looked up
// for every run: a re-pulled or removed image takes effect at once.
func storeImages(store imageCache) imageResolver {
	return func(ref string) (backendImage, error) {
		img, err := store.Lookup(ref)
		if err != nil {
			return backendImage{}, err
		}
		out := backendImage{Rootfs: img.Root}
		if img.Config != nil {
			out.Env, out.WorkingDir = img.Config.Env, img.Config.WorkingDir
		}
		return out, nil
	}
}

// absPathFlag is a path made absolute when it is set: the sandbox's mounts
// need absolute paths, and a relative one given on the command line means
// the directory it names from here.
type absPathFlag struct{ path *string }

func (f absPathFlag) String() string {
	if f.path == nil {
		return ""
	}
	return *f.path
}

func (f absPathFlag) Set(v string) error {
	if v == "" {
		*f.path = ""
		return nil
	}
	abs, err := filepath.Abs(v)
	if err != nil {
		return err
	}
	*f.path = abs
	return nil
}

// languagesFlag is a JSON list of languages merged into the defaults (see
// sandbox.MergeLanguages).
type languagesFlag struct{ langs *[]sandbox.Language }

func (f languagesFlag) String() string {
	if f.langs == nil || slices.EqualFunc(*f.langs, sandbox.DefaultLanguages, func(a, b sandbox.Language) bool {
		return a.Name == b.Name && a.Image == b.Image && slices.Equal(a.Command, b.Command)
	}) {
		return ""
	}
	data, _ := json.Marshal(*f.langs)
	return string(data)
}

func (f languagesFlag) Set(v string) error {
	var extra []sandbox.Language
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&extra); err != nil {
		return fmt.Errorf("not a JSON list of languages (name, image, command, filename, interpreter): %v", err)
	}
	merged := sandbox.MergeLanguages(sandbox.DefaultLanguages, extra)
	if err := sandbox.CheckLanguages(merged); err != nil {
		return err
	}
	*f.langs = merged
	return nil
}

// joinNames lists names as prose: "a, b and c" with conj "and".
func joinNames(names []string, conj string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}

// imageMountpoints are the paths every image needs for the sandbox's mounts.
func imageMountpoints() rootfs.Mountpoints {
	dirs, files := bundle.Mountpoints()
	return rootfs.Mountpoints{Dirs: dirs, Files: files}
}
