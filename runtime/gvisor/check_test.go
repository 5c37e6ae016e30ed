package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

func TestCheckProgram(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, path string
		ok         bool
	}{
		{"ELF binary", self, true},
		{"script", write("script", "#!/bin/sh\nexec true\n"), true},
		{"garbage with an ELF magic", write("garbage", "\x7fELF but not really"), false},
		{"text", write("text", "runsc\n"), false},
		{"empty", write("empty", ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkProgram(tc.path, ErrRunsc)
			if (err == nil) != tc.ok {
				t.Fatalf("checkProgram = %v, want ok %v", err, tc.ok)
			}
			// The fact and the part, for the caller to add the fix; the class.
			if err != nil && (!strings.Contains(err.Error(), tc.path) || !errors.Is(err, ErrRunsc) || sandbox.Class(err) != sandbox.ErrUnavailable) {
				t.Errorf("error %q does not name the file, or is not of part runsc and class unavailable", err)
			}
		})
	}
}
