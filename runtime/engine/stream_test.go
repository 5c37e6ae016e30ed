package engine

import (
	"bytes"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/agent"
)

func TestStreamResult(t *testing.T) {
	for _, tc := range []struct {
		name      string
		max       int64
		events    []string // Output event data, in order
		claimed   int64    // the agent's total in Exit
		tail      string   // the agent's tail in Exit
		want      string
		truncated bool
		total     int64
	}{
		{"fits", 10, []string{"ab", "c"}, 3, "", "abc", false, 3},
		{"head and tail without gap", 10, []string{"01234"}, 8, "567", "01234567", false, 8},
		{"agent dropped the middle", 10, []string{"01234"}, 100, "WXYZ!", "01234" + OmittedMarker(90) + "WXYZ!", true, 100},
		{"agent under-reports: what arrived counts", 10, []string{"ab"}, 0, "", "ab", false, 2},
		{"agent sends more than the cap: host caps it", 10, []string{"0123456789", "abcdefghij"}, 20, "", "01234" + OmittedMarker(10) + "fghij", true, 20},
		{"no report (killed): head only", 10, []string{"01234"}, 0, "", "01234", false, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var live bytes.Buffer
			s := stream{capture: agent.Capture{Max: tc.max}, live: &live}
			for _, e := range tc.events {
				s.write([]byte(e))
			}
			got, truncated, total := s.result(tc.claimed, []byte(tc.tail))
			if got != tc.want || truncated != tc.truncated || total != tc.total {
				t.Errorf("result = %q, %v, %d; want %q, %v, %d", got, truncated, total, tc.want, tc.truncated, tc.total)
			}
			if live.String() != got {
				t.Errorf("live copy %q differs from the result %q", live.String(), got)
			}
		})
	}
}

func TestOmittedMarkerSaysHowMuch(t *testing.T) {
	if m := OmittedMarker(1234); !strings.Contains(m, "1234 bytes") || !strings.HasPrefix(m, "\n") || !strings.HasSuffix(m, "\n") {
		t.Errorf("marker %q", m)
	}
}
