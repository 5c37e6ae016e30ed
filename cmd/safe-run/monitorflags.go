package main

import (
	"flag"
	"os"

	"github.com/safe-run/safe-run/monitor"
)

// monitorFlags are the settings of behaviour monitoring (docs/monitor.md),
// shared by serve and run: which of gVisor's trace points each sandbox
// reports, and the operator's rules over them.
type monitorFlags struct {
	level string
	rules string
}

func (m *monitorFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.level, "monitor", string(monitor.LevelDefault), "what each sandbox reports of what its code did, from gVisor's trace points: off, default (process starts, clones, exits, socket/connect/bind, opens) or full (every point safe-run summarises); see docs/monitor.md")
	fs.Var(absPathFlag{&m.rules}, "monitor-rules", "JSON `file` of monitoring rules applied over the default ones (record, kill or deny-future-calls; see docs/monitor.md)")
}

// configure gives the backend the monitor's level and rules, refusing a
// bad level or rules file with one line naming it and the fix.
func (m *monitorFlags) configure(cfg *backendConfig) error {
	opts, err := m.options()
	if err != nil {
		return err
	}
	cfg.Backend.Monitor = opts
	return nil
}

// options reads the settings into the monitor's options.
func (m *monitorFlags) options() (monitor.Options, error) {
	level, err := monitor.ParseLevel(m.level)
	if err != nil {
		return monitor.Options{}, usageError("--monitor: %v", err)
	}
	opts := monitor.Options{Level: level}
	if m.rules != "" {
		if level == monitor.LevelOff {
			return opts, usageError("--monitor-rules %s is given with --monitor=off, which applies no rules: drop one of them", m.rules)
		}
		data, err := os.ReadFile(m.rules)
		if err != nil {
			return opts, usageError("--monitor-rules: %v", err)
		}
		if opts.Rules, err = monitor.ParseRules(data); err != nil {
			return opts, usageError("--monitor-rules %s: %v", m.rules, err)
		}
	}
	return opts, nil
}
