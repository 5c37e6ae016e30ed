package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// envName is the environment variable of the setting flag names:
// SAFE_RUN_ and the name in upper case, with _ for -, as SAFE_RUN_MAX_QUEUE
// for --max-queue; or the exception envExceptions keeps.
func envName(flag string) string {
	if name, ok := envExceptions[flag]; ok {
		return name
	}
	return "SAFE_RUN_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// flagOrEnv names a setting both ways, for messages: "--runsc or SAFE_RUN_RUNSC".
func flagOrEnv(flag string) string { return "--" + flag + " or " + envName(flag) }

// envExceptions are the environment variables named before the rule of
// envName, kept as they are documented: SAFE_RUN_CACHE is --cache-dir's.
var envExceptions = map[string]string{"cache-dir": "SAFE_RUN_CACHE"}

// registerWithEnv registers flags on fs with each of register, and returns
// the environment variable of each flag they added: those settings can
// also come from the environment (applySettings, printSettings).
func registerWithEnv(fs *flag.FlagSet, register ...func(*flag.FlagSet)) map[string]string {
	had := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { had[f.Name] = true })
	for _, r := range register {
		r(fs)
	}
	env := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if !had[f.Name] {
			env[f.Name] = envName(f.Name)
		}
	})
	return env
}

// Settings come from, in order of precedence: command-line flags,
// environment variables (env names them, lookupEnv reads them), the config
// file (JSON with the flag names as keys), and the flags' built-in
// defaults. applySettings fills in every flag not given on the command line
// from the lower layers.
func applySettings(fs *flag.FlagSet, env map[string]string, lookupEnv func(string) (string, bool), configFile string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range sortedKeys(env) {
		if given[name] {
			continue
		}
		if v, ok := lookupEnv(env[name]); ok && v != "" {
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
		text, err := settingValue(fs.Lookup(key), file[key])
		if err != nil {
			return fmt.Errorf("config file %s: %q %v", configFile, key, err)
		}
		if err := fs.Set(key, text); err != nil {
			return fmt.Errorf("config file %s: %q: %v", configFile, key, err)
		}
	}
	return nil
}

// settingValue turns a config file's JSON value for flag f into the text
// form the flag parses, refusing a value of the wrong JSON type: a switch
// takes true or false, a text setting a string (or, for lists, a list of
// them), a number, size or duration a number or a string. Otherwise
// {"token": true} would become the token "true".
func settingValue(f *flag.Flag, v any) (string, error) {
	if v == nil {
		return "", fmt.Errorf("is null; leave the key out to use the default")
	}
	kind := settingKind(f)
	switch v := v.(type) {
	case bool:
		if kind == "switch" {
			return strconv.FormatBool(v), nil
		}
	case string:
		if kind != "switch" {
			return v, nil
		}
	case float64:
		if kind == "number" {
			return strconv.FormatFloat(v, 'f', -1, 64), nil
		}
	case []any:
		if kind == "text" {
			return listText(v)
		}
	}
	want := map[string]string{"switch": "true or false", "text": "a string", "number": "a number or a string"}[kind]
	got, _ := json.Marshal(v)
	return "", fmt.Errorf("must be %s, not %s", want, got)
}

// settingKind classifies a flag by the JSON values it takes: "switch",
// "text" or "number" (numbers, sizes and durations).
func settingKind(f *flag.Flag) string {
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return "switch"
	}
	switch v := f.Value.(type) {
	case absPathFlag, languagesFlag:
		return "text"
	case flag.Getter:
		if _, ok := v.Get().(string); ok {
			return "text"
		}
	}
	return "number"
}

// listText joins a list of strings with commas; a list of objects (the
// languages) stays JSON.
func listText(list []any) (string, error) {
	parts := make([]string, len(list))
	objects := 0
	for i, e := range list {
		switch e := e.(type) {
		case string:
			parts[i] = e
		case map[string]any:
			objects++
		default:
			got, _ := json.Marshal(e)
			return "", fmt.Errorf("must list strings, not %s", got)
		}
	}
	if objects > 0 {
		b, _ := json.Marshal(list)
		return string(b), nil
	}
	return strings.Join(parts, ","), nil
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
