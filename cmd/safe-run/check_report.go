package main

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/mcp"
)

// The outcomes of a checked block.
const (
	outcomePassed  = "passed"
	outcomeFailed  = "failed"
	outcomeSkipped = "skipped"
	// outcomeError: the sandbox could not run the block (exit code 125).
	outcomeError = "error"
)

// blockReport is what check reports of one block; its JSON form is one
// line of --json.
type blockReport struct {
	Type     string `json:"type"`     // "block"
	File     string `json:"file"`     // the document's path as found
	Line     int    `json:"line"`     // the line of the block's opening fence
	Language string `json:"language"` // the configured language
	Session  string `json:"session,omitempty"`
	Outcome  string `json:"outcome"` // passed, failed, skipped or error
	// Message says why a block failed or was skipped, in one line.
	Message string `json:"message,omitempty"`
	// Diff is the unified diff of the expected output (---) and the
	// actual (+++), when they differ.
	Diff string `json:"diff,omitempty"`
	// Status and ExitCode are the run's (see `safe-run run --json`).
	Status     string `json:"status,omitempty"`
	ExitCode   int    `json:"exit_code"`
	DurationMS int64  `json:"duration_ms"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	// Updated says --update rewrote the block's expected output.
	Updated bool `json:"updated,omitempty"`
}

// name is the block's test name: file:line.
func (b blockReport) name() string { return b.File + ":" + strconv.Itoa(b.Line) }

// checkSummary counts the outcomes; its JSON form is the last line of
// --json.
type checkSummary struct {
	Type       string `json:"type"` // "summary"
	Passed     int    `json:"passed"`
	Failed     int    `json:"failed"`
	Skipped    int    `json:"skipped"`
	Errors     int    `json:"errors"`
	Updated    int    `json:"updated"`
	DurationMS int64  `json:"duration_ms"`
	ExitCode   int    `json:"exit_code"`
}

// summarize counts reports.
func summarize(reports []blockReport, took time.Duration) checkSummary {
	s := checkSummary{Type: "summary", DurationMS: took.Milliseconds()}
	for _, r := range reports {
		switch r.Outcome {
		case outcomePassed:
			s.Passed++
		case outcomeFailed:
			s.Failed++
		case outcomeSkipped:
			s.Skipped++
		default:
			s.Errors++
		}
		if r.Updated {
			s.Updated++
		}
	}
	s.ExitCode = checkExitCode(s)
	return s
}

// checkExitCode is check's exit code once every block ran: 125 when the
// sandbox could not run a block, 1 when one failed, else 0. (Document
// errors, 2, stop check before anything runs.)
func checkExitCode(s checkSummary) int {
	switch {
	case s.Errors > 0:
		return exitSandboxError
	case s.Failed > 0:
		return 1
	}
	return 0
}

// line is the final line of the human report.
func (s checkSummary) line() string {
	text := fmt.Sprintf("%d passed, %d failed, %d skipped", s.Passed, s.Failed, s.Skipped)
	if s.Errors > 0 {
		text += fmt.Sprintf(", %d could not run", s.Errors)
	}
	if s.Updated > 0 {
		text += fmt.Sprintf(" (%d updated)", s.Updated)
	}
	return text
}

// visible renders program output for a report: line feeds and tabs stay;
// other control characters, invisible format characters and bytes that
// are not UTF-8 become \u and \x escapes, so that no output can move a
// terminal's cursor, recolour a CI log, forge a line of the report or make
// XML ill-formed.
func visible(s string) string {
	show := func(r rune) bool { return r == '\n' || r == '\t' || unicode.IsGraphic(r) }
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !show(r) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case show(r):
			b.WriteString(s[i : i+n])
		case r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

// humanReport prints blocks as they finish, in document order.
type humanReport struct {
	w      io.Writer
	colour bool
}

// useColour says whether f gets colour: a terminal, and NO_COLOR unset.
func useColour(f *os.File) bool {
	return os.Getenv("NO_COLOR") == "" && isTerminal(f)
}

// isTerminal says whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func (h humanReport) paint(code, s string) string {
	if !h.colour {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

// block prints one block's line and, for a failure, its diff and the tail
// of its stderr.
func (h humanReport) block(r blockReport) {
	var tag string
	switch r.Outcome {
	case outcomePassed:
		tag = h.paint("32", "PASS")
	case outcomeFailed:
		tag = h.paint("31", "FAIL")
	case outcomeSkipped:
		tag = h.paint("33", "SKIP")
	default:
		tag = h.paint("31;1", "ERROR")
	}
	line := fmt.Sprintf("%-5s %s", tag, visible(r.name()))
	if r.Outcome != outcomeSkipped {
		line += fmt.Sprintf(" (%s, %.2fs)", r.Language, float64(r.DurationMS)/1000)
	}
	if r.Updated {
		line += " updated"
	}
	if r.Message != "" {
		line += ": " + visible(r.Message)
	}
	fmt.Fprintln(h.w, line)
	if r.Outcome == outcomePassed || r.Outcome == outcomeSkipped {
		return
	}
	if r.Diff != "" {
		fmt.Fprint(h.w, indent(h.colourDiff(visible(r.Diff))))
	}
	if r.Stderr != "" && r.Diff == "" {
		fmt.Fprintln(h.w, "    stderr:")
		fmt.Fprint(h.w, indent(visible(tailLines(r.Stderr, 10))))
	}
}

// colourDiff colours a unified diff's removed and added lines.
func (h humanReport) colourDiff(diff string) string {
	if !h.colour {
		return diff
	}
	lines := strings.SplitAfter(diff, "\n")
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "---"), strings.HasPrefix(l, "+++"):
		case strings.HasPrefix(l, "-"):
			lines[i] = h.paint("31", strings.TrimSuffix(l, "\n")) + strings.TrimPrefix(l, strings.TrimSuffix(l, "\n"))
		case strings.HasPrefix(l, "+"):
			lines[i] = h.paint("32", strings.TrimSuffix(l, "\n")) + strings.TrimPrefix(l, strings.TrimSuffix(l, "\n"))
		}
	}
	return strings.Join(lines, "")
}

// indent indents every line of s by four spaces and ends it with a newline.
func indent(s string) string {
	if s == "" {
		return ""
	}
	s = strings.TrimSuffix(s, "\n")
	return "    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n"
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n") + "\n"
}

// writeJSONReport writes one JSON object per block and the summary, one
// per line.
func writeJSONReport(w io.Writer, reports []blockReport, sum checkSummary) error {
	for _, r := range reports {
		r.Type = "block"
		if err := writeJSONLine(w, r); err != nil {
			return err
		}
	}
	return writeJSONLine(w, sum)
}

func writeJSONLine(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(mcp.EscapeJSON(data), '\n'))
	return err
}

// The JUnit XML report: the shape Jenkins, GitLab and the GitHub test
// reporters read (testsuites > testsuite per document > testcase per block).
type (
	junitSuites struct {
		XMLName  xml.Name     `xml:"testsuites"`
		Name     string       `xml:"name,attr"`
		Tests    int          `xml:"tests,attr"`
		Failures int          `xml:"failures,attr"`
		Errors   int          `xml:"errors,attr"`
		Skipped  int          `xml:"skipped,attr"`
		Time     string       `xml:"time,attr"`
		Suites   []junitSuite `xml:"testsuite"`
	}
	junitSuite struct {
		Name     string      `xml:"name,attr"`
		Tests    int         `xml:"tests,attr"`
		Failures int         `xml:"failures,attr"`
		Errors   int         `xml:"errors,attr"`
		Skipped  int         `xml:"skipped,attr"`
		Time     string      `xml:"time,attr"`
		Cases    []junitCase `xml:"testcase"`
	}
	junitCase struct {
		Name      string        `xml:"name,attr"`
		Classname string        `xml:"classname,attr"`
		Time      string        `xml:"time,attr"`
		File      string        `xml:"file,attr"`
		Line      int           `xml:"line,attr"`
		Failure   *junitProblem `xml:"failure"`
		Error     *junitProblem `xml:"error"`
		Skipped   *junitProblem `xml:"skipped"`
		SystemOut string        `xml:"system-out,omitempty"`
		SystemErr string        `xml:"system-err,omitempty"`
	}
	junitProblem struct {
		Message string `xml:"message,attr,omitempty"`
		Type    string `xml:"type,attr,omitempty"`
		Text    string `xml:",chardata"`
	}
)

func seconds(ms int64) string { return strconv.FormatFloat(float64(ms)/1000, 'f', 3, 64) }

// junitReport builds the JUnit document of reports, one testsuite per file
// in the order files first appear.
func junitReport(reports []blockReport, sum checkSummary) junitSuites {
	out := junitSuites{Name: "safe-run check", Tests: len(reports), Failures: sum.Failed, Errors: sum.Errors,
		Skipped: sum.Skipped, Time: seconds(sum.DurationMS)}
	index := map[string]int{}
	for _, r := range reports {
		i, ok := index[r.File]
		if !ok {
			i = len(out.Suites)
			index[r.File] = i
			out.Suites = append(out.Suites, junitSuite{Name: visible(r.File)})
		}
		s := &out.Suites[i]
		var ms int64
		for _, c := range s.Cases {
			t, _ := strconv.ParseFloat(c.Time, 64)
			ms += int64(t * 1000)
		}
		c := junitCase{Name: visible(r.name()), Classname: visible(r.File), Time: seconds(r.DurationMS),
			File: visible(r.File), Line: r.Line, SystemOut: visible(r.Stdout), SystemErr: visible(r.Stderr)}
		problem := &junitProblem{Message: visible(r.Message), Type: r.Status, Text: visible(r.Diff)}
		s.Tests++
		switch r.Outcome {
		case outcomeFailed:
			c.Failure = problem
			s.Failures++
		case outcomeSkipped:
			c.Skipped = &junitProblem{Message: visible(r.Message)}
			s.Skipped++
		case outcomeError:
			c.Error = problem
			s.Errors++
		}
		s.Cases = append(s.Cases, c)
		s.Time = seconds(ms + r.DurationMS)
	}
	return out
}

// writeJUnit writes the JUnit report to path.
func writeJUnit(path string, reports []blockReport, sum checkSummary) error {
	data, err := xml.MarshalIndent(junitReport(reports, sum), "", "  ")
	if err != nil {
		return fmt.Errorf("write the JUnit report: %w", err)
	}
	data = append([]byte(xml.Header), append(data, '\n')...)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write the JUnit report: %w", err)
	}
	return nil
}

// githubAnnotations returns the workflow commands that mark each failed
// block on the pull request: ::error file=F,line=N,title=T::message.
func githubAnnotations(reports []blockReport) string {
	var b strings.Builder
	for _, r := range reports {
		if r.Outcome != outcomeFailed && r.Outcome != outcomeError {
			continue
		}
		msg := r.Message
		if r.Diff != "" {
			msg += "\n" + r.Diff
		}
		fmt.Fprintf(&b, "::error file=%s,line=%d,title=%s::%s\n", ghProperty(r.File), r.Line,
			ghProperty("safe-run check: "+r.Language+" block "+r.Outcome), ghData(msg))
	}
	return b.String()
}

// ghData escapes a workflow command's message: % and line breaks, and
// visible() for the rest, so that output cannot end the command early or
// start one of its own.
func ghData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(visible(s))
}

// ghProperty escapes a workflow command's property value, which also ends
// at ',' and ':'.
func ghProperty(s string) string {
	return strings.NewReplacer(":", "%3A", ",", "%2C").Replace(ghData(s))
}
