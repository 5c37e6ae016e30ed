package engine

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// maxDenialsNamed is how many denied attempts the result's message names;
// the rest are counted.
const maxDenialsNamed = 3

// withNetwork fills res.Network from a networked sandbox's records (final:
// the sandbox's program has ended; else, a session call has) and appends
// the denials to the message, so that the model reading it learns why a
// request failed. A sandbox without a network leaves res as it is.
func withNetwork(res sandbox.Result, sb Sandbox, final bool) sandbox.Result {
	return addNetwork(res, takeNetwork(sb, final))
}

// takeNetwork takes a sandbox's network records, or nil for a sandbox
// without a network.
func takeNetwork(sb Sandbox, final bool) *egress.Report {
	nr, ok := sb.(NetworkReporter)
	if !ok {
		return nil
	}
	rep := nr.TakeNetwork(final)
	if rep.Allowlist == nil {
		return nil
	}
	return &rep
}

// addNetwork puts rep (if any) into res; see withNetwork.
func addNetwork(res sandbox.Result, rep *egress.Report) sandbox.Result {
	if rep == nil {
		return res
	}
	res.Network = rep
	if line := networkLine(*rep); line != "" {
		if res.Message != "" {
			res.Message += "\n"
		}
		res.Message += line
	}
	return res
}

// networkLine is the one-line summary of a report's denials and failure,
// e.g. "network: denied evil.test:443 (not in the allowlist); 3 more", or
// "" when there is nothing to say.
func networkLine(rep egress.Report) string {
	var named []string
	more := 0
	seen := map[string]bool{}
	for _, c := range rep.Connections {
		if c.Decision != egress.Denied {
			continue
		}
		what := c.Name
		if what == "" {
			what, _, _ = net.SplitHostPort(c.Addr)
		}
		if c.Port != 0 {
			what = net.JoinHostPort(what, strconv.Itoa(int(c.Port)))
		}
		if c.Reason != "" {
			what += " (" + c.Reason + ")"
		}
		if seen[what] {
			continue
		}
		seen[what] = true
		if len(named) < maxDenialsNamed {
			named = append(named, what)
		} else {
			more++
		}
	}
	var parts []string
	if len(named) > 0 {
		s := "denied " + strings.Join(named, ", ")
		if more > 0 {
			s += fmt.Sprintf("; %d more", more)
		}
		parts = append(parts, s)
	}
	if rep.Failure != "" {
		parts = append(parts, rep.Failure)
	}
	if len(parts) == 0 {
		return ""
	}
	return "network: " + strings.Join(parts, "; ")
}
