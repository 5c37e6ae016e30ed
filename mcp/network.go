package mcp

import (
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// networkSchema lists in run_code's or create_session's schema what the
// network and packages arguments may ask for, or drops them from a server
// that gives no call a network (they are still accepted, so that the
// policy says in its own words why it refuses them).
func networkSchema(p map[string]*jsonschema.Schema, access *NetworkAccess) {
	if access == nil {
		delete(p, "network")
		delete(p, "packages")
		return
	}
	p["network"].Description = "what the program may reach, as entries or presets of the server's list: " + strings.Join(access.Allowlist, ", ") +
		"; omit for no network. Only the hosts named are reachable (DNS answers nothing else); denied attempts are listed in the result"
	if len(access.Packages) == 0 {
		delete(p, "packages")
		return
	}
	p["packages"].Description = "packages to install (pip for python, npm for node) before the code runs, e.g. requests==2.32.3; allowed: " +
		strings.Join(access.Packages, ", ") + "; needs network to reach the language's index (e.g. the pypi or npm preset)"
}

// NetworkLine sums up a run's network in one line, e.g. "network: 3
// connections allowed, 1 denied".
func NetworkLine(r *egress.Report) string {
	decided := map[uint64]string{}
	refused := map[string]bool{} // a name is asked for once per address type
	for _, c := range r.Connections {
		switch {
		case c.Kind == egress.KindTCP:
			if _, seen := decided[c.ID]; !seen {
				decided[c.ID] = c.Decision
			}
		case c.Kind == egress.KindDNS && c.Decision == egress.Denied:
			refused[c.Name] = true
		}
	}
	names := len(refused)
	var allowed, denied int
	for _, d := range decided {
		if d == egress.Allowed {
			allowed++
		} else {
			denied++
		}
	}
	line := fmt.Sprintf("network: %d %s allowed, %d denied", allowed, plural(allowed, "connection", "connections"), denied)
	if names > 0 {
		line += fmt.Sprintf("; %d %s not answered", names, plural(names, "name", "names"))
	}
	if r.Dropped > 0 {
		line += fmt.Sprintf("; %d more records not kept", r.Dropped)
	}
	return line // the message names the denials and a failure
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// NetworkDenials is the line of a result's message that names the denied
// attempts and a failure of the network (the engine appends it as
// "network: denied …"), or "".
func NetworkDenials(message string) string {
	for _, line := range strings.Split(message, "\n") {
		if strings.HasPrefix(line, "network: ") {
			return line
		}
	}
	return ""
}

// networkAccess describes the policy's network for the environment, or
// nil when it gives no call a network.
func networkAccess(p sandbox.Policy) *NetworkAccess {
	if p.Network.Empty() {
		return nil
	}
	a := &NetworkAccess{Allowlist: p.Network.Strings(), Packages: p.Packages, Limits: networkLimits(p.NetworkLimits)}
	if p.PackageIndex != (sandbox.PackageIndex{}) {
		a.PackageIndex = &p.PackageIndex
	}
	for _, e := range p.Network.Entries {
		if hosts, ok := egress.Presets[e.Preset]; ok {
			if a.Presets == nil {
				a.Presets = map[string][]string{}
			}
			a.Presets[e.Preset] = hosts
		}
	}
	return a
}

// networkLimits fills in egress's defaults for the limits left zero.
func networkLimits(l egress.Limits) egress.Limits {
	if l.MaxConnections == 0 {
		l.MaxConnections = egress.DefaultMaxConnections
	}
	if l.MaxBytesOut == 0 {
		l.MaxBytesOut = egress.DefaultMaxBytes
	}
	if l.MaxBytesIn == 0 {
		l.MaxBytesIn = egress.DefaultMaxBytes
	}
	return l
}

// describeNetwork is the tool description's sentence on the network.
func describeNetwork(a *NetworkAccess) string {
	if a == nil {
		return "There is no network: nothing can be downloaded or installed, so use only what is listed above."
	}
	s := "There is no network unless the call passes \"network\": then only the hosts it names are reachable (allowed here: " +
		strings.Join(a.Allowlist, ", ") + "); DNS answers nothing else, and denied attempts are listed in the result."
	if len(a.Packages) > 0 {
		s += " \"packages\" installs packages (allowed: " + strings.Join(a.Packages, ", ") + ") before the code runs, given a network that reaches the language's index."
	}
	return s
}

// instructions are the server's instructions to clients.
func instructions(env Environment) string {
	if env.NetworkAccess == nil {
		return "Use run_code to execute code in a fresh sandbox with no network. " +
			"Read the resource " + EnvironmentURI + " for interpreter versions, installed packages and limits."
	}
	return "Use run_code to execute code in a fresh sandbox with no network unless the call's network argument asks for hosts of the server's allowlist. " +
		"Read the resource " + EnvironmentURI + " for interpreter versions, installed packages, the network allowlist and limits."
}

// reportOutput is the network report as the output schema has it: its
// lists are arrays, never null.
func reportOutput(r *egress.Report) *egress.Report {
	if r == nil {
		return nil
	}
	out := *r
	if out.Allowlist == nil {
		out.Allowlist = []string{}
	}
	if out.Connections == nil {
		out.Connections = []egress.Connection{}
	}
	return &out
}
