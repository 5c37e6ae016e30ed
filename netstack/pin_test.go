package netstack

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestGVisorPinMatchesRunsc: the stack on the host and the sandbox's
// kernel (runsc, built from scripts/runsc/go.mod) come from one gVisor.
func TestGVisorPinMatchesRunsc(t *testing.T) {
	re := regexp.MustCompile(`(?m)^\s*(?:require\s+)?gvisor\.dev/gvisor\s+(\S+)`)
	pin := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s requires no gvisor.dev/gvisor", path)
		}
		return string(m[1])
	}
	main, runsc := pin("../go.mod"), pin("../scripts/runsc/go.mod")
	if main != runsc {
		t.Fatalf("go.mod pins gvisor.dev/gvisor %s, scripts/runsc/go.mod %s: run `go get gvisor.dev/gvisor@%s`", main, runsc, runsc)
	}
}

// TestOnlyTheHelperLinksTheNetworkStack: safe-run's own binary (and the
// agent) never link gVisor's network stack; only this package and the
// helper do. safe-run may link gVisor's trace-point schema and the little
// it needs (package monitor decodes the sandbox's trace stream with them).
func TestOnlyTheHelperLinksTheNetworkStack(t *testing.T) {
	for _, pkg := range []string{"../cmd/safe-run", "../cmd/safe-run-agent"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "gvisor.dev/gvisor/pkg/tcpip") || strings.HasSuffix(dep, "/netstack") {
				t.Errorf("%s imports %s: only cmd/safe-run-net may", pkg, dep)
			}
			if strings.HasPrefix(dep, "gvisor.dev/") && pkg == "../cmd/safe-run-agent" {
				t.Errorf("%s imports %s: the agent links no gVisor package", pkg, dep)
			}
		}
	}
}
