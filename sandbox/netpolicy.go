package sandbox

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/safe-run/safe-run/egress"
)

// The policy's checks of a job's network and packages (see Check).

// Caps on what one job may list: more is no real need and only work.
const (
	maxNetworkEntries = 64
	maxPackages       = 64
)

// checkNetwork narrows job.Network to the policy's entries it selects and
// writes them back as canonical entries; it returns the narrowed list.
func (p Policy) checkNetwork(job *Job) (egress.Allowlist, error) {
	if len(job.Network) == 0 {
		return egress.Allowlist{}, nil
	}
	if len(job.Network) > maxNetworkEntries {
		return egress.Allowlist{}, &InputError{Field: "network", Msg: fmt.Sprintf("%d entries given, the limit is %d; name presets or wildcards instead", len(job.Network), maxNetworkEntries)}
	}
	narrowed, err := p.Network.Narrow(job.Network)
	if err != nil {
		return egress.Allowlist{}, &InputError{Field: "network", Msg: err.Error()}
	}
	job.Network = narrowed.Strings()
	return narrowed, nil
}

// checkPackages refuses packages the policy does not allow, or that the
// job's network (narrowed) cannot fetch from the language's index.
func (p Policy) checkPackages(job Job, lang Language, network egress.Allowlist) error {
	if len(job.Packages) == 0 {
		return nil
	}
	eco, ok := ecosystems[lang.Interpreter]
	switch {
	case !ok:
		return &InputError{Field: "packages", Msg: fmt.Sprintf("%s has no package installs; packages are installed for python (pip) and node (npm) only", lang.Name)}
	case len(p.Packages) == 0:
		return &InputError{Field: "packages", Msg: "this server allows no package installs (the operator allows them with --allow-packages); leave packages out"}
	case len(job.Packages) > maxPackages:
		return &InputError{Field: "packages", Msg: fmt.Sprintf("%d packages given, the limit is %d", len(job.Packages), maxPackages)}
	}
	for _, spec := range job.Packages {
		name, rest, err := eco.split(spec)
		if err != nil {
			return &InputError{Field: "packages", Msg: err.Error()}
		}
		if !p.allowsPackage(eco, name, rest) {
			return &InputError{Field: "packages", Msg: fmt.Sprintf("%q is not allowed here; allowed: %s", spec, strings.Join(p.Packages, ", "))}
		}
	}
	host, port, preset := eco.index(p.PackageIndex)
	if _, ok := network.Match(host, port); !ok || preset != "" && !reachesPreset(network, preset) {
		fix := fmt.Sprintf("add %q to network", host)
		if preset != "" {
			fix = fmt.Sprintf("add the %s preset to network", preset)
		}
		return &InputError{Field: "packages", Msg: fmt.Sprintf("installing needs the network to reach %s's index at %s; %s", eco.tool, host, fix)}
	}
	return nil
}

// reachesPreset says whether every host of the preset is reachable on 443.
func reachesPreset(network egress.Allowlist, preset string) bool {
	for _, h := range egress.Presets[preset] {
		if _, ok := network.Match(h, 443); !ok {
			return false
		}
	}
	return true
}

// allowsPackage says whether a pattern of the policy allows the package
// name (normalised) with the rest of its spec (a version specifier).
func (p Policy) allowsPackage(eco ecosystem, name, rest string) bool {
	for _, pattern := range p.Packages {
		if pattern == "*" {
			return true
		}
		pname, prest, err := eco.split(pattern)
		if err == nil && pname == name && (prest == "" || prest == rest) {
			return true
		}
	}
	return false
}

// ecosystem is how one language's packages are named and fetched.
type ecosystem struct {
	tool string
	// split parses a package spec into its normalised name and the rest
	// (extras and version specifier, without spaces); it refuses anything
	// but a name from the index (no URLs, paths, options).
	split func(spec string) (name, rest string, err error)
	// index is the host and port installs fetch from, and the preset that
	// names the public index when no mirror is configured.
	index func(PackageIndex) (host string, port uint16, preset string)
}

var ecosystems = map[string]ecosystem{
	"python": {tool: "pip", split: splitPython, index: func(i PackageIndex) (string, uint16, string) {
		if i.PipIndexURL != "" {
			h, p, _ := urlHostPort(i.PipIndexURL)
			return h, p, ""
		}
		return "pypi.org", 443, "pypi"
	}},
	"node": {tool: "npm", split: splitNode, index: func(i PackageIndex) (string, uint16, string) {
		if i.NPMRegistry != "" {
			h, p, _ := urlHostPort(i.NPMRegistry)
			return h, p, ""
		}
		return "registry.npmjs.org", 443, "npm"
	}},
}

var (
	pythonSpec = regexp.MustCompile(`^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)((?:\[[A-Za-z0-9._,-]+\])?(?:(?:===|==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]+(?:,(?:===|==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]+)*)?)$`)
	pythonRuns = regexp.MustCompile(`[-_.]+`)
	nodeSpec   = regexp.MustCompile(`^((?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*)(@[A-Za-z0-9.^~<>=*|+_-]+)?$`)
)

// splitPython parses a pip requirement of a name from the index: the name
// PEP 503-normalised (lower case, runs of - _ . as one -), then extras and
// version specifiers.
func splitPython(spec string) (string, string, error) {
	s := strings.ReplaceAll(spec, " ", "")
	m := pythonSpec.FindStringSubmatch(s)
	if m == nil {
		return "", "", fmt.Errorf("%q is not a package name with an optional version (such as requests or requests==2.32.3); URLs, paths and options are not accepted", spec)
	}
	return pythonRuns.ReplaceAllString(strings.ToLower(m[1]), "-"), m[2], nil
}

// splitNode parses an npm package of the registry: a (scoped) name and an
// optional @version or range.
func splitNode(spec string) (string, string, error) {
	m := nodeSpec.FindStringSubmatch(strings.TrimSpace(spec))
	if m == nil {
		return "", "", fmt.Errorf("%q is not an npm package name with an optional @version (such as lodash or lodash@4.17.21); URLs, paths, aliases and options are not accepted", spec)
	}
	return m[1], m[2], nil
}

// urlHostPort is the host and port of an index's URL (http or https).
func urlHostPort(raw string) (string, uint16, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" || u.User != nil {
		return "", 0, fmt.Errorf("%q is not an http or https URL with a host", raw)
	}
	port := uint16(443)
	if u.Scheme == "http" {
		port = 80
	}
	if ps := u.Port(); ps != "" {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || n == 0 {
			return "", 0, fmt.Errorf("%q has an invalid port", raw)
		}
		port = uint16(n)
	}
	return strings.Trim(u.Hostname(), "[]"), port, nil
}

// validateNetwork reports network settings that cannot serve: packages
// without a network, malformed patterns or index URLs, an index the
// allowlist does not reach, negative limits.
func (p Policy) validateNetwork() error {
	l := p.NetworkLimits
	if l.MaxConnections < 0 || l.MaxBytesIn < 0 || l.MaxBytesOut < 0 {
		return fmt.Errorf("the network limits must not be negative")
	}
	for _, pattern := range p.Packages {
		if pattern == "*" {
			continue
		}
		if _, _, perr := splitPython(pattern); perr != nil {
			if _, _, nerr := splitNode(pattern); nerr != nil {
				return fmt.Errorf("allowed package %q is neither a pip nor an npm package name with an optional version; give names such as requests, requests==2.32.3, lodash@4.17.21, or *", pattern)
			}
		}
	}
	if len(p.Packages) > 0 && p.Network.Empty() {
		return fmt.Errorf("packages are allowed but no network is: installs need an allowlist that reaches the index (e.g. --allow-net pypi,npm)")
	}
	for _, idx := range []struct{ name, url string }{{"the pip index", p.PackageIndex.PipIndexURL}, {"the npm registry", p.PackageIndex.NPMRegistry}} {
		if idx.url == "" {
			continue
		}
		host, port, err := urlHostPort(idx.url)
		if err != nil {
			return fmt.Errorf("%s: %v", idx.name, err)
		}
		if _, ok := p.Network.Match(host, port); !ok {
			return fmt.Errorf("%s %s is not in the network allowlist; add %s to it (pinned, as %s=ADDRESS:%d, if it is a private address)", idx.name, idx.url, net.JoinHostPort(host, strconv.Itoa(int(port))), host, port)
		}
	}
	return nil
}
