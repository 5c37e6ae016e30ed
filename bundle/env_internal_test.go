package bundle

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// quadraticEnvironment is the merge as it was first written, the reference
// for what environment must keep: a scan of the whole environment for each
// image variable.
func quadraticEnvironment(cfg Config) []string {
	env := slices.Clone(cfg.Env)
	if env == nil {
		env = slices.Clone(DefaultEnv)
	}
	for _, kv := range cfg.ImageEnv {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || name == "HOME" || name == "TMPDIR" {
			continue
		}
		i := slices.IndexFunc(env, func(e string) bool { return strings.HasPrefix(e, name+"=") })
		if i >= 0 {
			env[i] = kv
		} else {
			env = append(env, kv)
		}
	}
	return env
}

// TestEnvironmentSameAsScan checks the indexed merge against the scanning
// one on random environments full of repeated, empty and odd names.
func TestEnvironmentSameAsScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"A", "B", "AB", "A_B", "PATH", "HOME", "TMPDIR", "", "X=Y"}
	entry := func() string {
		n := names[r.IntN(len(names))]
		switch r.IntN(5) {
		case 0:
			return n // no '='
		case 1:
			return n + "="
		}
		return fmt.Sprintf("%s=%d", n, r.IntN(100))
	}
	for i := range 2000 {
		var cfg Config
		if r.IntN(3) > 0 {
			cfg.Env = []string{}
			for range r.IntN(8) {
				cfg.Env = append(cfg.Env, entry())
			}
		}
		for range r.IntN(12) {
			cfg.ImageEnv = append(cfg.ImageEnv, entry())
		}
		want := quadraticEnvironment(Config{Env: slices.Clone(cfg.Env), ImageEnv: cfg.ImageEnv})
		if got := environment(cfg); !slices.Equal(got, want) {
			t.Fatalf("case %d: environment(%q over %q) = %q, want %q", i, cfg.ImageEnv, cfg.Env, got, want)
		}
	}
}

// TestEnvironmentHostileImage merges an image's 200,000 variables (a
// hostile image's; imports refuse more than rootfs.MaxEnvEntries) over
// as many of the base's. The scanning merge took over 14 minutes for this
// and so fails by the test binary's timeout; the indexed one is one pass.
func TestEnvironmentHostileImage(t *testing.T) {
	const n = 200_000
	cfg := Config{Env: make([]string, 0, n)}
	for i := range n {
		cfg.Env = append(cfg.Env, fmt.Sprintf("BASE_%d=x", i))
		cfg.ImageEnv = append(cfg.ImageEnv, fmt.Sprintf("IMAGE_%d=y", i), fmt.Sprintf("BASE_%d=z", i))
	}
	env := environment(cfg)
	if len(env) != 2*n || env[0] != "BASE_0=z" || env[n] != "IMAGE_0=y" || env[2*n-1] != fmt.Sprintf("IMAGE_%d=y", n-1) {
		t.Fatalf("merged %d entries, [0]=%q [n]=%q, want %d: every base one replaced, every image one appended", len(env), env[0], env[n], 2*n)
	}
}
