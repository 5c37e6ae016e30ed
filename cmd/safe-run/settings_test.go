package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigFileTypes checks that each config file value of the wrong JSON
// type is refused with its key and the type wanted, instead of becoming
// its JSON text (`{"token": true}` the token "true"), and that values of
// the right type reach their flags.
func TestConfigFileTypes(t *testing.T) {
	for _, tc := range []struct {
		config string
		want   string // substring of the error; "" means accepted
		check  func(f *serveConfig) bool
	}{
		{`{"token": "s3cret"}`, "", func(f *serveConfig) bool { return f.token == "s3cret" }},
		{`{"token": true}`, `"token" must be a string, not true`, nil},
		{`{"token": 123}`, `"token" must be a string, not 123`, nil},
		{`{"token": {"a": 1}}`, `"token" must be a string`, nil},
		{`{"token": null}`, `"token" is null`, nil},
		{`{"http": ["127.0.0.1:1"]}`, "", func(f *serveConfig) bool { return f.http == "127.0.0.1:1" }},
		{`{"allowed-origins": ["https://a.example", "https://b.example"]}`, "", func(f *serveConfig) bool { return f.origins == "https://a.example,https://b.example" }},
		{`{"allowed-origins": [1]}`, `must list strings, not 1`, nil},
		{`{"max-concurrent": 4}`, "", func(f *serveConfig) bool { return f.maxConcurrent == 4 }},
		{`{"max-concurrent": "4"}`, "", func(f *serveConfig) bool { return f.maxConcurrent == 4 }},
		{`{"max-concurrent": true}`, `"max-concurrent" must be a number or a string, not true`, nil},
		{`{"max-concurrent": [4]}`, `"max-concurrent" must be a number or a string`, nil},
		{`{"memory": "1GiB"}`, "", func(f *serveConfig) bool { return f.limits.MemoryBytes == 1<<30 }},
		{`{"memory": false}`, `"memory" must be a number or a string`, nil},
		{`{"timeout": "45s"}`, "", func(f *serveConfig) bool { return f.timeout.String() == "45s" }},
		{`{"audit-code": true}`, "", func(f *serveConfig) bool { return f.audit.code }},
		{`{"audit-code": "yes"}`, `"audit-code" must be true or false, not "yes"`, nil},
		{`{"audit-code": 1}`, `"audit-code" must be true or false`, nil},
		{`{"cache-dir": "rel/cache"}`, "", func(f *serveConfig) bool {
			return filepath.IsAbs(f.host.cacheDir) && strings.HasSuffix(f.host.cacheDir, "/rel/cache")
		}},
		{`{"cache-dir": 7}`, `"cache-dir" must be a string`, nil},
	} {
		t.Run(tc.config, func(t *testing.T) {
			f, _, err := applyConfigFile(t, tc.config)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("applySettings = %v, want an error with %q", err, tc.want)
				}
				return
			}
			if err != nil || !tc.check(f) {
				t.Fatalf("applySettings = %v; the flags did not get the value (%+v)", err, *f)
			}
		})
	}
}

// applyConfigFile applies a config file with body to serve's flags, as
// `safe-run serve --config FILE` with no other settings would.
func applyConfigFile(t *testing.T, body string) (*serveConfig, *flag.FlagSet, error) {
	t.Helper()
	config := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	f := new(serveConfig)
	fs, _ := newServeFlags(f)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	return f, fs, applySettings(fs, nil, os.LookupEnv, config)
}

// TestRelativePathFlags checks that relative directories on the command
// line are made absolute: the sandbox's mounts need absolute paths.
func TestRelativePathFlags(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var h hostFlags
	h.register(fs)
	if err := fs.Parse([]string{"--cache-dir", "c", "--state-dir", "./s", "--debug-log-dir", "../d"}); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	for got, want := range map[string]string{h.cacheDir: filepath.Join(wd, "c"), h.stateDir: filepath.Join(wd, "s"), h.debugLogDir: filepath.Join(filepath.Dir(wd), "d")} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
