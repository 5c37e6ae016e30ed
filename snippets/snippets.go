// Package snippets reads the fenced code blocks of Markdown documents as
// tests: which blocks run, with which attributes, what output they are
// expected to print, how that output is compared, and how a document is
// rewritten with what the programs printed (--update).
//
// It has a home of its own, apart from cmd/ and runtime/, because it is pure
// data: bytes in, blocks and bytes out. It runs nothing and knows no sandbox,
// so the document format can be tested (and fuzzed) without runsc, and the
// check command only turns blocks into Jobs and Results into Outputs.
package snippets

import (
	"fmt"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// Block is one fenced code block of a document that is a test.
type Block struct {
	Line     int       // 1-based line of the opening fence
	Language string    // the configured language its info string names (aliases resolved)
	Code     string    // its content, lines ending in "\n", CRLF normalised to LF
	Attrs    Attrs     // the attributes of its info string
	Expected *Expected // the output block right after it, or nil
}

// Attrs are a block's attributes.
type Attrs struct {
	Skip, ShouldFail bool
	Exit             *int          // exit=N: the exit code expected
	Timeout          time.Duration // timeout=30s
	Session          string        // session=NAME
	Stdin            string        // stdin=FILE (relative to the document's directory)
	Files            []string      // files=a.csv,b.json (relative to the document's directory)
	Image            string        // image=REF
	Network          []string      // network=pypi,api.example.com:443 (entries of check's --allow-net)
}

// Expected is an expected-output block.
type Expected struct {
	Line       int    // 1-based line of its opening fence
	Text       string // its content
	Stderr     bool   // compared with stderr instead of stdout
	Regex      bool   // its lines are regular expressions
	Start, End int    // byte offsets of its content in the document (for Update)
}

// Error is a document error: an unterminated fence, an unknown attribute, a
// bad value. It is of class sandbox.ErrInvalid: the author can fix it.
type Error struct {
	Path string // the document, as given to Parse
	Line int    // 1-based line the problem is on
	Msg  string // what is wrong and how to fix it
}

// Error returns "path:line: msg", the form editors and CI annotations link.
func (e *Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg) }

// Is makes a document error of class sandbox.ErrInvalid, so that the edges
// report it as a usage error (exit code 2).
func (e *Error) Is(target error) bool { return target == sandbox.ErrInvalid }

// Output is what Update puts into one block's expected-output block.
type Output struct {
	Block int    // index into Parse's result
	Text  string // what to put in its expected block
}
