package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// outputDir is the workspace directory whose files come back to the client.
const outputDir = "out"

// runCodeArgs are the arguments of run_code (see args.go). The policy
// refuses a missing language or code in its own words; session_id and
// image are listed only by servers that offer them (see runCodeTool), and
// accepted by every server so that it can say why it refuses them.
type runCodeArgs struct {
	Language       string      `json:"language" absent:"policy" jsonschema:"the language of code"`
	Code           string      `json:"code" absent:"policy" jsonschema:"the program to run; it runs as a file in /workspace"`
	TimeoutSeconds *float64    `json:"timeout_seconds,omitempty"`
	Stdin          string      `json:"stdin,omitempty" jsonschema:"the program's standard input"`
	Files          []inputFile `json:"files,omitempty" jsonschema:"files to place in /workspace before the run"`
	SessionID      string      `json:"session_id,omitempty" jsonschema:"run in this session (from create_session), keeping its state; omit for a fresh sandbox"`
	Image          string      `json:"image,omitempty" jsonschema:"run in this image instead of the language's default one (see the environment resource)"`
	Network        []string    `json:"network,omitempty" jsonschema:"what the program may reach: allowlist entries or presets within the server's list; omit for no network"`
	Packages       []string    `json:"packages,omitempty" jsonschema:"packages to install before the code runs, e.g. requests==2.32.3; needs a network that reaches the language's index"`
}

// inputFile is a file of run_code's files argument, or write_file's.
type inputFile struct {
	Path     string `json:"path" jsonschema:"relative to /workspace, e.g. data/input.csv"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"how content is encoded (default text)"`
}

// runCodeOutput is the structured content of run_code; see outputSchema.
type runCodeOutput struct {
	Status          sandbox.Status `json:"status"`
	ExitCode        int            `json:"exit_code"`
	Signal          string         `json:"signal,omitempty"`
	Stdout          string         `json:"stdout"`
	Stderr          string         `json:"stderr"`
	StdoutTruncated bool           `json:"stdout_truncated"`
	StderrTruncated bool           `json:"stderr_truncated"`
	DurationMS      int64          `json:"duration_ms"`
	MemoryPeakBytes int64          `json:"memory_peak_bytes"`
	Message         string         `json:"message,omitempty"`
	Files           []outputFile   `json:"files"`
	Cached          bool           `json:"cached,omitempty"`
	StateLost       bool           `json:"state_lost,omitempty"`
	Network         *egress.Report `json:"network,omitempty"`
	// Activity is what the run did in the sandbox; nil when not monitored.
	Activity *sandbox.Activity `json:"activity,omitempty"`
}

type outputFile struct {
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	MIMEType string `json:"mime_type"`
	// Returned says the file is in the result's content; Skipped says why not.
	Returned bool   `json:"returned"`
	Skipped  string `json:"skipped,omitempty"`
	// Withheld says what of a returned file does not come back as its
	// name suggests (an SVG as text, not as an image), and why.
	Withheld string `json:"withheld,omitempty"`
	// NameEscaped says Path shows hidden characters of the name as escapes.
	NameEscaped bool `json:"name_escaped,omitempty"`
}

// outputSchema describes runCodeOutput.
const outputSchema = `{
  "type": "object",
  "properties": {
    "status": {"type": "string", "enum": ["ok", "error", "timeout", "oom", "killed", "sandbox_error", "policy_violation"],
      "description": "ok: exit code 0; error: non-zero exit; timeout, oom: a limit was hit; killed: a signal or cancellation; sandbox_error: the sandbox failed, not the code; policy_violation: a monitoring rule stopped the run (message names it)"},
    "exit_code": {"type": "integer", "description": "the program's exit code, -1 if it has none"},
    "signal": {"type": "string", "description": "the signal that killed the program"},
    "stdout": {"type": "string"},
    "stderr": {"type": "string"},
    "stdout_truncated": {"type": "boolean", "description": "the middle of stdout was dropped; head and tail are kept"},
    "stderr_truncated": {"type": "boolean"},
    "duration_ms": {"type": "integer"},
    "memory_peak_bytes": {"type": "integer", "description": "peak memory of the sandbox, 0 if unknown"},
    "message": {"type": "string", "description": "why the status is not ok"},
    "cached": {"type": "boolean", "description": "the result of an earlier identical call, reused; nothing ran"},
    "network": {"type": "object", "description": "what the run's network saw, for a run with a network",
      "properties": {
        "allowlist": {"type": "array", "items": {"type": "string"}, "description": "the run's effective allowlist"},
        "connections": {"type": "array", "description": "the host's decisions, in order",
          "items": {"type": "object",
            "properties": {
              "id": {"type": "integer", "description": "a connection's open and close records share it"},
              "kind": {"type": "string", "enum": ["tcp", "dns", "udp"]},
              "name": {"type": "string"}, "port": {"type": "integer"}, "addr": {"type": "string", "description": "the address dialled from the host"},
              "dst": {"type": "string", "description": "the address the sandbox connected to (tcp)"},
              "decision": {"type": "string", "enum": ["allowed", "denied"]}, "reason": {"type": "string"},
              "bytes_out": {"type": "integer"}, "bytes_in": {"type": "integer"},
              "open": {"type": "boolean", "description": "still open when the record was taken"}},
            "required": ["id", "kind", "decision"]}},
        "dropped": {"type": "integer", "description": "records beyond the cap, not listed"},
        "failure": {"type": "string", "description": "the network failed during the run; from then on the sandbox had none"}},
      "required": ["allowlist", "connections"]},
    "activity": ` + ActivitySchema + `,
    "state_lost": {"type": "boolean", "description": "in a session: its interpreter or sandbox was restarted, and variables and imports of earlier calls are gone (message says whether files are too)"},
    "files": {"type": "array", "description": "files the program wrote to /workspace/out",
      "items": {"type": "object",
        "properties": {
          "path": {"type": "string", "description": "relative to /workspace/out; invisible and control characters are shown as \\u escapes"},
          "size": {"type": "integer"},
          "mime_type": {"type": "string", "description": "the type the content comes back with"},
          "returned": {"type": "boolean"}, "skipped": {"type": "string", "description": "why the content is not returned"},
          "withheld": {"type": "string", "description": "what does not come back as the name suggests, and why (e.g. an SVG comes back as text)"},
          "name_escaped": {"type": "boolean", "description": "path shows characters of the name as escapes"}},
        "required": ["path", "size", "mime_type", "returned"]}}
  },
  "required": ["status", "exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "duration_ms", "memory_peak_bytes", "files"]
}`

// runCodeTool builds the tool definition from the environment.
func runCodeTool(env Environment, maxTimeout time.Duration) mcpgo.Tool {
	s := schemaOf[runCodeArgs]()
	p := s.Properties
	p["language"].Enum = enum(env.names())
	timeoutSchema(p["timeout_seconds"], fmt.Sprintf("wall-clock limit in seconds (default %g)", env.DefaultLimits.TimeoutSeconds))
	p["timeout_seconds"].Maximum = ptr(maxTimeout.Seconds())
	p["files"].Items.Properties["encoding"].Enum = enum([]string{"text", "base64"})
	if env.Sessions == nil {
		delete(p, "session_id")
	}
	if len(env.Images) == 0 {
		delete(p, "image")
	} else {
		p["image"].Enum = enum(env.Images)
	}
	networkSchema(p, env.NetworkAccess)

	tool := mcpgo.NewToolWithRawSchema("run_code", describeTool(env, maxTimeout), rawSchema(s))
	mcpgo.WithRawOutputSchema(json.RawMessage(outputSchema))(&tool)
	no := false
	tool.Annotations = mcpgo.ToolAnnotation{
		Title:           "Run code in a sandbox",
		ReadOnlyHint:    &no,                           // it runs arbitrary code; that is not reading
		DestructiveHint: &no,                           // nothing outside the throw-away sandbox changes
		IdempotentHint:  &no,                           // programs may be random or time-dependent
		OpenWorldHint:   ptr(env.NetworkAccess != nil), // only the hosts of the allowlist, when a call asks
	}
	return tool
}

func describeTool(env Environment, maxTimeout time.Duration) string {
	d, of := env.DefaultLimits, env.OutputFiles
	return fmt.Sprintf(`Run a program in a fresh, isolated sandbox (gVisor) and return its output.

Languages: %s.%s
%s %s
The code runs in /workspace (writable, %s) as an unprivileged user; the rest of the file system is read-only except /tmp. Files passed in "files" are placed in /workspace; open them by relative path.
To return files, write them to /workspace/out/ (for example plt.savefig("out/plot.png"); matplotlib draws to files only). PNG, JPEG and GIF images up to %d megapixels come back as images; other files as resources, as plain text or bytes unless they are CSV, Markdown or JSON (SVG and HTML come back as their source text); at most %d files, %s each.
Limits: timeout_seconds defaults to %g (at most %g); memory %s; %d processes and threads; stdout and stderr each keep %s (head and tail).
Print results to stdout. A non-zero exit, an uncaught exception or a hit limit is reported as an error with the end of stderr.`,
		env.describeLanguages(), describeImages(env), statefulness(env), describeNetwork(env.NetworkAccess), sandbox.FormatBytes(d.WorkspaceBytes), maxImagePixels/1_000_000, of.MaxFiles, sandbox.FormatBytes(of.MaxFileBytes),
		d.TimeoutSeconds, maxTimeout.Seconds(), sandbox.FormatBytes(d.MemoryBytes), d.Processes, sandbox.FormatBytes(d.OutputBytes))
}

// describeImages names the images run_code may choose, if any.
func describeImages(env Environment) string {
	if len(env.Images) == 0 {
		return ""
	}
	return "\nImages: pass \"image\" to run in one of " + strings.Join(env.Images, ", ") + " instead of the default image; each has its own interpreters and packages, and no network either."
}

func statefulness(env Environment) string {
	const fresh = "Each call starts from scratch: no variables, files or processes survive from earlier calls"
	if env.Sessions == nil {
		return fresh + "."
	}
	return fresh + ", unless it passes a session_id from create_session: a session's interpreter keeps its state between calls."
}

// enum is an enum of a schema.
func enum(values []string) []any {
	out := make([]any, len(values))
	for i, v := range values {
		out[i] = v
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// timeoutSchema makes s the schema of a timeout_seconds argument.
func timeoutSchema(s *jsonschema.Schema, description string) {
	s.ExclusiveMinimum, s.Description = ptr(0.0), description
}

// parseArgs decodes and checks run_code's arguments into a job. Every error
// is a *sandbox.InputError whose Field is the argument at fault ("arguments"
// when they are not an object) and whose Msg names it and says what is
// allowed, for the model to fix its call. It also returns the session_id
// argument, empty for a fresh sandbox.
func (h *handler) parseArgs(raw any) (sandbox.Job, string, error) {
	// Refuse oversized code before decodeArgs copies it.
	if m, ok := raw.(map[string]any); ok {
		if code, ok := m["code"].(string); ok {
			var in *sandbox.InputError
			if errors.As(h.policy.CheckCodeSize(len(code)), &in) {
				return sandbox.Job{}, "", argError("code", "argument \"code\" %s", in.Msg)
			}
		}
	}
	args, _, err := decodeArgs[runCodeArgs](raw)
	if err != nil {
		return sandbox.Job{}, "", err
	}
	job := sandbox.Job{Language: args.Language, Code: args.Code, Image: args.Image, Stdin: []byte(args.Stdin), OutputDir: outputDir,
		Network: args.Network, Packages: args.Packages}
	if args.SessionID != "" && h.cfg.Sessions == nil {
		return sandbox.Job{}, "", argError("session_id", "argument \"session_id\": this server offers no sessions")
	}
	if args.SessionID != "" && args.Image != "" {
		return sandbox.Job{}, "", argError("image", "argument \"image\": a session keeps the image it started in; leave image out, or leave session_id out to run in a fresh sandbox")
	}
	if args.SessionID != "" && (len(args.Network) > 0 || len(args.Packages) > 0) {
		return sandbox.Job{}, "", argError("network", "argument \"network\" or \"packages\": a session keeps the network and packages it was created with; pass them to create_session, or leave session_id out to run in a fresh sandbox")
	}
	if args.SessionID != "" {
		if err := checkSessionID(args.SessionID); err != nil {
			return sandbox.Job{}, "", err
		}
	}
	if t := args.TimeoutSeconds; t != nil {
		d, err := h.timeout(*t)
		if err != nil {
			return sandbox.Job{}, "", err
		}
		job.Limits.Timeout = d
	}
	for i, f := range args.Files {
		content, err := decodeContent(f)
		if err != nil {
			return sandbox.Job{}, "", argError("files", "argument \"files\"[%d]: %v", i, err)
		}
		job.Files = append(job.Files, sandbox.File{Path: f.Path, Data: content})
	}
	return job, args.SessionID, nil
}

// timeout checks a timeout_seconds argument.
func (h *handler) timeout(seconds float64) (time.Duration, error) {
	d := time.Duration(seconds * float64(time.Second))
	// A timeout too small to count in nanoseconds would read as "none
	// given" and get the default; refuse it with the rest.
	if math.IsNaN(seconds) || d <= 0 || seconds > h.maxTimeout.Seconds() {
		return 0, argError("timeout_seconds", "argument \"timeout_seconds\" must be greater than 0 and at most %g", h.maxTimeout.Seconds())
	}
	return d, nil
}

// result translates a run's result into the tool's result: structured
// content, a short text rendering, and the output files as images and
// embedded resources, under the content policy (deliver).
func result(res sandbox.Result) *mcpgo.CallToolResult {
	out := runCodeOutput{
		Status: res.Status, ExitCode: res.ExitCode, Signal: res.Signal,
		Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		DurationMS: res.DurationMS, MemoryPeakBytes: res.MemoryPeakBytes, Message: res.Message,
		Files: []outputFile{}, Cached: res.Cached, StateLost: res.StateLost, Network: reportOutput(res.Network),
		Activity: res.Activity,
	}
	var media []mcpgo.Content
	for _, f := range res.Files {
		o := outputFile{Path: EscapeName(f.Path), Size: f.Size, MIMEType: mimeType(f.Path), Skipped: f.Skipped}
		o.NameEscaped = o.Path != f.Path
		if f.Skipped == "" {
			d := deliver(f.Path, f.Data)
			o.MIMEType, o.Withheld, o.Skipped = d.mimeType, d.withheld, d.skipped
			if d.skipped == "" {
				o.Returned = true
				media = append(media, fileContent(f, d))
			}
		}
		out.Files = append(out.Files, o)
	}
	r := &mcpgo.CallToolResult{
		Content:           append([]mcpgo.Content{mcpgo.NewTextContent(renderText(out))}, media...),
		StructuredContent: out,
		IsError:           res.Status != sandbox.StatusOK,
	}
	return r
}

// mimeType is the type a file's name suggests; deliver decides what its
// content comes back as.
func mimeType(name string) string {
	ext := strings.ToLower(path.Ext(name))
	switch ext {
	case ".csv":
		return "text/csv"
	case ".md":
		return "text/markdown"
	case ".json":
		return "application/json"
	case ".svg":
		return "image/svg+xml"
	}
	if t := mime.TypeByExtension(ext); t != "" {
		t, _, _ = strings.Cut(t, ";")
		return t
	}
	return "application/octet-stream"
}

// fileContent is an output file's content as d delivers it: an image, or
// an embedded resource of text or base64.
func fileContent(f sandbox.OutputFile, d delivery) mcpgo.Content {
	if d.image {
		return mcpgo.NewImageContent(base64.StdEncoding.EncodeToString(f.Data), d.mimeType)
	}
	uri := (&url.URL{Scheme: "sandbox", Path: "/workspace/" + outputDir + "/" + f.Path}).String()
	if d.text {
		return mcpgo.NewEmbeddedResource(mcpgo.TextResourceContents{URI: uri, MIMEType: d.mimeType, Text: string(f.Data)})
	}
	return mcpgo.NewEmbeddedResource(mcpgo.BlobResourceContents{URI: uri, MIMEType: d.mimeType, Blob: base64.StdEncoding.EncodeToString(f.Data)})
}

// stderrTailLines is how much of stderr a failure's summary repeats.
const stderrTailLines = 20

// renderText is the result for clients that ignore structured content:
// the status first (with what to do about it), then the output.
func renderText(o runCodeOutput) string {
	var b strings.Builder
	switch o.Status {
	case sandbox.StatusOK:
		fmt.Fprintf(&b, "status: ok (exit code 0) in %.2fs\n", float64(o.DurationMS)/1000)
	case sandbox.StatusError:
		fmt.Fprintf(&b, "status: error: the program exited with code %d after %.2fs\n", o.ExitCode, float64(o.DurationMS)/1000)
	default:
		fmt.Fprintf(&b, "status: %s: %s\n", o.Status, o.Message)
	}
	if o.Cached {
		b.WriteString("(the result of an earlier identical call, reused)\n")
	}
	if o.StateLost && o.Status == sandbox.StatusOK {
		b.WriteString("(the session's state was lost before this call: variables and imports of earlier calls are gone)\n")
	}
	if o.Stdout != "" {
		b.WriteString("\nstdout:\n" + withNewline(textExcerpt(o.Stdout, "stdout")))
	}
	if o.Stderr != "" {
		if o.Status != sandbox.StatusOK {
			b.WriteString("\nstderr (last lines):\n" + withNewline(textExcerpt(lastLines(o.Stderr, stderrTailLines), "stderr")))
		} else {
			b.WriteString("\nstderr:\n" + withNewline(textExcerpt(o.Stderr, "stderr")))
		}
	}
	if o.Stdout == "" && o.Stderr == "" {
		b.WriteString("(no output)\n")
	}
	if o.Network != nil {
		b.WriteString("\n" + NetworkLine(o.Network) + "\n")
		if o.Status == sandbox.StatusOK || o.Status == sandbox.StatusError {
			// The status line shows the message otherwise; its network
			// line names the denials.
			if denials := NetworkDenials(o.Message); denials != "" {
				b.WriteString(denials + "\n")
			}
		}
	}
	if o.Activity != nil {
		b.WriteString("\n" + ActivityLine(o.Activity) + "\n")
	}
	if len(o.Files) > 0 {
		b.WriteString("\nfiles in /workspace/out:\n")
		for _, f := range o.Files {
			state := "returned"
			if f.Withheld != "" {
				state += " (" + f.Withheld + ")"
			}
			if !f.Returned {
				state = "not returned: " + f.Skipped
			}
			if f.NameEscaped {
				state += nameEscapedNote
			}
			fmt.Fprintf(&b, "  %s (%s, %s): %s\n", f.Path, f.MIMEType, sandbox.FormatBytes(f.Size), state)
		}
	}
	return b.String()
}

func withNewline(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) <= n {
		return s
	}
	return "...\n" + strings.Join(lines[len(lines)-n:], "\n")
}

// progressInterval is how often a call with a progress token hears from us.
const progressInterval = time.Second

// reportProgress sends progress notifications until stop is closed, if the
// client asked for them. Progress is the seconds since the call began,
// which always grows; the message says what the call is waiting for.
func reportProgress(ctx context.Context, req mcpgo.CallToolRequest, state func() string, stop <-chan struct{}) {
	if req.Params.Meta == nil || req.Params.Meta.ProgressToken == nil {
		return
	}
	srv := server.ServerFromContext(ctx)
	if srv == nil {
		return
	}
	token := req.Params.Meta.ProgressToken
	start := time.Now()
	tick := time.NewTicker(progressInterval)
	defer tick.Stop()
	send := func() {
		_ = srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
			"progressToken": token,
			"progress":      math.Round(time.Since(start).Seconds()*10) / 10,
			"message":       state(),
		})
	}
	send()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
			send()
		}
	}
}
