package main

import (
	"slices"
	"testing"
)

func TestParseUnit(t *testing.T) {
	text := `# /etc/systemd/system/safe-run.service
[Unit]
Description=x
ProtectSystem=not-a-service-setting
[Service]
Type=exec
User=safe-run
ExecStart=-/usr/local/bin/safe-run serve --config /etc/safe-run/config.json
ExecReload=/bin/kill -HUP $MAINPID
Delegate=yes
RuntimeDirectory=safe-run
StateDirectory=safe-run
ProtectSystem=strict
; a comment
CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SETUID

# /etc/systemd/system/safe-run.service.d/override.conf
[Service]
PrivateDevices=yes
[Install]
WantedBy=multi-user.target
`
	u := parseUnit(text)
	if u.exec != "/usr/local/bin/safe-run" {
		t.Errorf("exec %q", u.exec)
	}
	if want := []string{"User=safe-run", "Delegate=yes", "StateDirectory=safe-run"}; !slices.Equal(u.kept, want) {
		t.Errorf("kept %q; want %q", u.kept, want)
	}
	if want := []string{"ProtectSystem=strict", "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SETUID", "PrivateDevices=yes"}; !slices.Equal(u.hardening, want) {
		t.Errorf("hardening %q; want %q", u.hardening, want)
	}
	args := transientArgs(u, "safe-run-doctor-1-1.service", "/run/x.out", "ProtectSystem=strict", "doctor")
	if slices.Contains(args, "ProtectSystem=strict") || !slices.Contains(args, "PrivateDevices=yes") ||
		!slices.Contains(args, "RuntimeDirectory="+unitRunDir) || slices.Contains(args, "RuntimeDirectory=safe-run") ||
		!slices.Contains(args, "StandardOutput=append:/run/x.out") || !slices.Contains(args, "--service-type=oneshot") ||
		slices.Contains(args, "--wait") || slices.Contains(args, "--pipe") ||
		!slices.Equal(args[len(args)-2:], []string{"/usr/local/bin/safe-run", "doctor"}) {
		t.Errorf("transient args %q", args)
	}
}

func TestIsUnitFlag(t *testing.T) {
	for arg, want := range map[string]bool{"--unit": true, "-unit": true, "--unit=safe-run.service": true,
		"unit": false, "--units": false, "--json": false, "safe-run.service": false} {
		if got := isUnitFlag(arg); got != want {
			t.Errorf("isUnitFlag(%q) = %v; want %v", arg, got, want)
		}
	}
}
