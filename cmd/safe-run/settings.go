package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Settings come from, in order of precedence: command-line flags,
// environment variables, the config file (JSON with the flag names as
// keys), and the flags' built-in defaults. applySettings fills in every
// flag not given on the command line from the lower layers.
func applySettings(fs *flag.FlagSet, env map[string]string, configFile string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range sortedKeys(env) {
		if given[name] {
			continue
		}
		if v, ok := os.LookupEnv(env[name]); ok && v != "" {
			if err := fs.Set(name, v); err != nil {
				return fmt.Errorf("%s=%q: %v", env[name], v, err)
			}
			given[name] = true
		}
	}
	if configFile == "" {
		return nil
	}
	data, err := os.ReadFile(configFile)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	var file map[string]any
	if err := json.Unmarshal(data, &file); err != nil {
		return fmt.Errorf("config file %s is not a JSON object: %v", configFile, err)
	}
	for _, key := range sortedKeys(file) {
		if fs.Lookup(key) == nil || key == "config" {
			return fmt.Errorf("config file %s: unknown setting %q; the settings are the flags of `safe-run %s -h`", configFile, key, fs.Name())
		}
		if given[key] {
			continue
		}
		if err := fs.Set(key, settingText(file[key])); err != nil {
			return fmt.Errorf("config file %s: %q: %v", configFile, key, err)
		}
	}
	return nil
}

// settingText turns a JSON value into the text form a flag parses; lists
// become comma-separated.
func settingText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []any:
		for _, e := range v {
			if _, ok := e.(map[string]any); ok {
				b, _ := json.Marshal(v) // a list of objects stays JSON
				return string(b)
			}
		}
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = settingText(e)
		}
		return strings.Join(parts, ",")
	case nil:
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// printSettings lists every flag with its environment variable and
// default, for `-h`.
func printSettings(fs *flag.FlagSet, env map[string]string) {
	w := fs.Output()
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  -%s", f.Name)
		if name != "" {
			fmt.Fprintf(w, " %s", name)
		}
		fmt.Fprintf(w, "\n    \t%s", usage)
		var notes []string
		if e, ok := env[f.Name]; ok {
			notes = append(notes, "env "+e)
		}
		if f.DefValue != "" {
			notes = append(notes, "default "+f.DefValue)
		}
		if len(notes) > 0 {
			fmt.Fprintf(w, " (%s)", strings.Join(notes, "; "))
		}
		fmt.Fprintln(w)
	})
}
