package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// netFlags are the settings of the network allowlist and of package
// installs, shared by serve and run: what calls may reach and install,
// the caps of each networked sandbox, and how the backend builds its
// network (the helper, the link, extra CAs).
type netFlags struct {
	allow, packages  listFlag
	maxConnections   int
	maxBytes         int64
	ca, helper       string
	pipIndex, npmReg string
	link             string
}

func (n *netFlags) register(fs *flag.FlagSet) {
	fs.Var(&n.allow, "allow-net", "what runs may reach when they ask: host names with an optional :port, *.wildcards, CIDRs, presets ("+
		strings.Join(sortedKeys(egress.Presets), ", ")+") or NAME=IP:PORT pins, as `ENTRY,...` (repeatable; default: no network)")
	fs.Var(&n.packages, "allow-packages", "packages runs may install: names, names with a version (requests==2.32.3, lodash@4.17.21) or *, as `PKG,...` (repeatable)")
	fs.IntVar(&n.maxConnections, "net-max-connections", egress.DefaultMaxConnections, "most TCP connections a networked run may open")
	n.maxBytes = egress.DefaultMaxBytes
	fs.Var(sizeFlag{&n.maxBytes}, "net-max-bytes", "most bytes a networked run may send, and receive, each (a `size`)")
	fs.Var(absPathFlag{&n.ca}, "net-ca", "PEM `file` of CAs networked sandboxes trust besides the image's (for a mirror with its own CA)")
	fs.StringVar(&n.pipIndex, "pip-index-url", "", "pip's index for installs (`URL`, e.g. https://mirror.corp/simple); its host must be in --allow-net (default: the pypi preset)")
	fs.StringVar(&n.npmReg, "npm-registry", "", "npm's registry for installs (`URL`); its host must be in --allow-net (default: the npm preset)")
	n.registerHost(fs)
}

// registerHost registers the settings of how this host makes networked
// sandboxes (doctor checks them).
func (n *netFlags) registerHost(fs *flag.FlagSet) {
	fs.StringVar(&n.link, "net-link", "auto", "link between a networked sandbox and the host's network helper: auto (tap if /dev/net/tun opens, else veth), tap or veth")
	fs.Var(absPathFlag{&n.helper}, "net-helper", "safe-run-net binary, the network helper (default: next to the agent)")
}

// enabled says whether any run may have a network.
func (n *netFlags) enabled() bool { return len(n.allow) > 0 }

// policy puts the network settings into p, refusing any that cannot
// serve with one line naming the setting and the fix.
func (n *netFlags) policy(p *sandbox.Policy) error {
	list, err := egress.Parse(n.allow)
	if err != nil {
		return usageError("--allow-net: %v", err)
	}
	if n.maxConnections <= 0 {
		return usageError("--net-max-connections %d: give a positive number", n.maxConnections)
	}
	switch n.link {
	case "auto", "tap", "veth":
	default:
		return usageError("--net-link %q: use auto, tap or veth", n.link)
	}
	p.Network, p.Packages = list, n.packages
	p.NetworkLimits = egress.Limits{MaxConnections: n.maxConnections, MaxBytesOut: n.maxBytes, MaxBytesIn: n.maxBytes}
	p.PackageIndex = sandbox.PackageIndex{PipIndexURL: n.pipIndex, NPMRegistry: n.npmReg}
	if err := p.Validate(); err != nil {
		return usageError("the network settings are not valid: %v", err)
	}
	return nil
}

// configure gives the backend the network settings.
func (n *netFlags) configure(cfg *backendConfig) {
	cfg.Backend.NetHelper, cfg.Backend.NetworkCA = n.helper, n.ca
	if n.link != "auto" {
		cfg.Backend.NetLink = n.link
	}
}

// checkHost refuses --allow-net where networked sandboxes cannot be made,
// with the reason and the fix: never a silently network-less server.
func (n *netFlags) checkHost(cfg backendConfig) error {
	if !n.enabled() {
		return nil
	}
	if _, err := networkCheck(cfg.Backend); err != nil {
		return fmt.Errorf("--allow-net needs networked sandboxes, which this host cannot make: %w", withHint(err))
	}
	return nil
}

// checkNetwork is doctor's line on networked sandboxes: which link they
// use here, or why there are none. Runs without a network do not need
// them, so a failure is a warning.
func checkNetwork(host *hostFlags, n *netFlags) check {
	var cfg backendConfig
	cfg.Backend.Agent = host.agentPath()
	n.configure(&cfg)
	link, err := networkCheck(cfg.Backend)
	if err != nil {
		return check{Name: "network", OK: true, Detail: "networked sandboxes (--allow-net) cannot be made here: " + err.Error(),
			Fix: "runs without a network are unaffected; fix this only to use --allow-net"}
	}
	return check{Name: "network", OK: true, Detail: fmt.Sprintf("networked sandboxes (--allow-net) work here, linked by %s to the network helper", link)}
}

// listFlag is a list setting: repeatable, each value a comma-separated
// list (as the environment and the config file give it too).
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

// Get makes it a text setting (settingKind).
func (l *listFlag) Get() any { return l.String() }

func (l *listFlag) Set(v string) error {
	*l = append(*l, splitList(v, ",")...)
	return nil
}
