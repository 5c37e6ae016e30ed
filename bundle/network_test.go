package bundle_test

import (
	"reflect"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/safe-run/safe-run/bundle"
)

// TestBuildNetwork: a networked bundle joins the given namespace and gets
// exactly the resolver (and CA) binds and the Node variable; nothing else
// changes, and a bundle without a network is the golden one.
func TestBuildNetwork(t *testing.T) {
	job := checkedJob(t, customLimits)
	plain := build(t, job, testConfig)
	ro := []string{"bind", "ro", "nosuid", "nodev", "noexec"}
	for _, tt := range []struct {
		name      string
		network   *bundle.Network
		wantNetNS string
		addMounts []specs.Mount
		addEnv    []string
	}{
		{name: "none"},
		{
			name:      "resolver only",
			network:   &bundle.Network{NetNS: "/run/safe-run/x/netns", ResolvConf: "/run/safe-run/x/resolv.conf"},
			wantNetNS: "/run/safe-run/x/netns",
			addMounts: []specs.Mount{{Destination: "/etc/resolv.conf", Type: "bind", Source: "/run/safe-run/x/resolv.conf", Options: ro}},
		},
		{
			name:      "resolver and CAs",
			network:   &bundle.Network{NetNS: "/run/safe-run/x/netns", ResolvConf: "/run/safe-run/x/resolv.conf", CABundle: "/run/safe-run/x/ca.crt"},
			wantNetNS: "/run/safe-run/x/netns",
			addMounts: []specs.Mount{
				{Destination: "/etc/resolv.conf", Type: "bind", Source: "/run/safe-run/x/resolv.conf", Options: ro},
				{Destination: "/etc/ssl/certs/ca-certificates.crt", Type: "bind", Source: "/run/safe-run/x/ca.crt", Options: ro},
			},
			addEnv: []string{"NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig
			cfg.Network = tt.network
			spec := build(t, job, cfg)
			var netns *specs.LinuxNamespace
			for i, ns := range spec.Linux.Namespaces {
				if ns.Type == specs.NetworkNamespace {
					netns = &spec.Linux.Namespaces[i]
				}
			}
			if netns == nil || netns.Path != tt.wantNetNS {
				t.Errorf("network namespace = %+v, want path %q", netns, tt.wantNetNS)
			}
			if want := append(slices.Clone(plain.Mounts), tt.addMounts...); !reflect.DeepEqual(spec.Mounts, want) {
				t.Errorf("Mounts = %+v\nwant %+v", spec.Mounts, want)
			}
			if want := append(slices.Clone(plain.Process.Env), tt.addEnv...); !slices.Equal(spec.Process.Env, want) {
				t.Errorf("Env = %q, want %q", spec.Process.Env, want)
			}
			// Everything else is the plain bundle's.
			spec.Mounts, spec.Process.Env, spec.Linux.Namespaces = plain.Mounts, plain.Process.Env, plain.Linux.Namespaces
			if !reflect.DeepEqual(spec, plain) {
				t.Error("a network changed more than the namespace, the binds and the environment")
			}
		})
	}
}

func TestBuildNetworkErrors(t *testing.T) {
	job := checkedJob(t, customLimits)
	for _, tt := range []struct {
		name    string
		network bundle.Network
	}{
		{"empty", bundle.Network{}},
		{"relative netns", bundle.Network{NetNS: "netns", ResolvConf: "/r"}},
		{"relative resolv.conf", bundle.Network{NetNS: "/n", ResolvConf: "resolv.conf"}},
		{"relative CA bundle", bundle.Network{NetNS: "/n", ResolvConf: "/r", CABundle: "ca.crt"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig
			cfg.Network = &tt.network
			if _, err := bundle.Build(job, cfg); err == nil {
				t.Error("Build succeeded, want an error")
			}
		})
	}
}
