package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/sandbox"
)

// sessionTool is a tool of the session family.
type sessionTool struct {
	name, description, input string
	annotations              mcpgo.ToolAnnotation
	handle                   func(h *handler, ctx context.Context, args map[string]json.RawMessage) (*mcpgo.CallToolResult, error)
}

func hints(readOnly, destructive, idempotent bool) mcpgo.ToolAnnotation {
	open := false // no network
	return mcpgo.ToolAnnotation{ReadOnlyHint: &readOnly, DestructiveHint: &destructive, IdempotentHint: &idempotent, OpenWorldHint: &open}
}

const sessionIDSchema = `{"type": "string", "description": "a session_id returned by create_session"}`

func sessionTools(env Environment) []sessionTool {
	names, _ := json.Marshal(env.names())
	return []sessionTool{
		{
			name: "create_session",
			description: "Start a stateful session: one sandbox kept alive across calls, with a persistent interpreter. " +
				"Variables, functions and imports (python, node) or the working directory, variables and functions (bash) " +
				"survive between run_code calls that pass its session_id, and so do files in /workspace. " +
				sessionLimitsText(env.Sessions) + "Returns the session_id.",
			input: fmt.Sprintf(`{"type": "object", "properties": {
  "language": {"type": "string", "enum": %s},
  "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "description": "default timeout of each call in the session"}
}, "required": ["language"]}`, names),
			annotations: hints(false, false, false),
			handle:      (*handler).createSession,
		},
		{
			name:        "close_session",
			description: "End a session and free its sandbox; its state and files are discarded.",
			input:       `{"type": "object", "properties": {"session_id": ` + sessionIDSchema + `}, "required": ["session_id"]}`,
			annotations: hints(false, true, true),
			handle:      (*handler).closeSession,
		},
		{
			name:        "list_sessions",
			description: "List your live sessions (those this connection created): id, language, calls, and when each expires.",
			input:       `{"type": "object", "properties": {}}`,
			annotations: hints(true, false, true),
			handle:      (*handler).listSessions,
		},
		{
			name:        "write_file",
			description: "Write a file into a session's /workspace (creating directories). Use encoding base64 for binary content.",
			input: `{"type": "object", "properties": {
  "session_id": ` + sessionIDSchema + `,
  "path": {"type": "string", "description": "relative to /workspace, e.g. data/input.csv"},
  "content": {"type": "string"},
  "encoding": {"type": "string", "enum": ["text", "base64"], "description": "how content is encoded (default text)"}
}, "required": ["session_id", "path", "content"]}`,
			annotations: hints(false, true, true),
			handle:      (*handler).writeFile,
		},
		{
			name:        "read_file",
			description: "Read a file from a session's /workspace: text as text, PNG, JPEG and GIF images as images, other files as base64 resources (SVG and HTML as their source text). Symbolic links are not followed. A name listed with \\u escapes is read as listed.",
			input: `{"type": "object", "properties": {
  "session_id": ` + sessionIDSchema + `,
  "path": {"type": "string", "description": "relative to /workspace"}
}, "required": ["session_id", "path"]}`,
			annotations: hints(true, false, true),
			handle:      (*handler).readFile,
		},
		{
			name:        "list_files",
			description: "List the files and directories of a session's /workspace, recursively, with sizes.",
			input: `{"type": "object", "properties": {
  "session_id": ` + sessionIDSchema + `,
  "path": {"type": "string", "description": "a directory relative to /workspace (default: all of it)"}
}, "required": ["session_id"]}`,
			annotations: hints(true, false, true),
			handle:      (*handler).listFiles,
		},
	}
}

func sessionLimitsText(l *SessionLimits) string {
	if l == nil {
		return ""
	}
	return fmt.Sprintf("At most %d sessions live at once; a session ends after %s without use, %s after it starts, or with close_session: close sessions you no longer need. ",
		l.MaxSessions, time.Duration(l.IdleTimeoutSeconds*float64(time.Second)), time.Duration(l.MaxLifetimeSeconds*float64(time.Second)))
}

// addSessionTools registers the session tools on s.
func (h *handler) addSessionTools(s *server.MCPServer) {
	for _, t := range sessionTools(h.cfg.Environment) {
		tool := mcpgo.NewToolWithRawSchema(t.name, t.description, json.RawMessage(t.input))
		tool.Annotations = t.annotations
		tool.Annotations.Title = strings.ReplaceAll(t.name, "_", " ")
		handle := t.handle
		s.AddTool(tool, func(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
			args, err := objectArgs(req.Params.Arguments, t.input)
			if err == nil {
				err = checkSessionIDArg(args)
			}
			if err != nil {
				return mcpgo.NewToolResultError(argErrorText(err)), nil
			}
			// Every session tool acts for the calling client (see identity.go).
			ctx, err = asClient(ctx)
			if err != nil {
				return mcpgo.NewToolResultError(err.Error()), nil
			}
			return handle(h, ctx, args)
		})
	}
}

// objectArgs decodes arguments into a map, refusing names the schema does
// not declare.
func objectArgs(raw any, schema string) (map[string]json.RawMessage, error) {
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, argError("arguments", "arguments are not a JSON object")
	}
	args := map[string]json.RawMessage{}
	if string(data) != "null" {
		if err := json.Unmarshal(data, &args); err != nil {
			return nil, argError("arguments", "arguments must be a JSON object")
		}
	}
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	_ = json.Unmarshal([]byte(schema), &s)
	var allowed []string
	for name := range s.Properties {
		allowed = append(allowed, name)
	}
	slices.Sort(allowed)
	for name := range args {
		if _, ok := s.Properties[name]; !ok {
			return nil, argError(name, "unknown argument %q; the arguments are %s", name, strings.Join(allowed, ", "))
		}
	}
	for _, name := range s.Required {
		if _, ok := args[name]; !ok {
			return nil, argError(name, "argument %q is required", name)
		}
	}
	return args, nil
}

func stringArg(args map[string]json.RawMessage, name string) (string, error) {
	raw, ok := args[name]
	if !ok {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", argError(name, "argument %q must be a string", name)
	}
	return s, nil
}

// sessionError turns a sessions error into a tool error the model can act on.
func sessionError(err error) *mcpgo.CallToolResult {
	if stopped := auditError(err); stopped != nil {
		return stopped
	}
	switch {
	case errors.Is(err, sandbox.ErrNoSession):
		return mcpgo.NewToolResultError(err.Error() + " with create_session")
	case errors.Is(err, context.Canceled):
		return mcpgo.NewToolResultError("the call was cancelled")
	}
	return mcpgo.NewToolResultError(inputErrorText(err))
}

func (h *handler) createSession(ctx context.Context, args map[string]json.RawMessage) (*mcpgo.CallToolResult, error) {
	lang, err := stringArg(args, "language")
	if err != nil {
		return mcpgo.NewToolResultError(argErrorText(err)), nil
	}
	spec := sandbox.SessionSpec{Language: lang, Owner: sandbox.OwnerFrom(ctx)}
	if raw, ok := args["timeout_seconds"]; ok {
		var seconds float64
		if err := json.Unmarshal(raw, &seconds); err != nil {
			return mcpgo.NewToolResultError(argErrorText(argError("timeout_seconds", `argument "timeout_seconds" must be a number`))), nil
		}
		if spec.Limits.Timeout, err = h.timeout(seconds); err != nil {
			return mcpgo.NewToolResultError(argErrorText(err)), nil
		}
	}
	info, err := h.cfg.Sessions.CreateSession(ctx, spec)
	if err != nil {
		return sessionError(err), nil
	}
	text := fmt.Sprintf("session_id: %s (%s). Pass it to run_code, write_file, read_file and list_files; end it with close_session. It expires at %s if unused.",
		info.ID, info.Language, info.ExpiresAt.UTC().Format(time.RFC3339))
	return &mcpgo.CallToolResult{Content: []mcpgo.Content{mcpgo.NewTextContent(text)}, StructuredContent: info}, nil
}

func (h *handler) closeSession(ctx context.Context, args map[string]json.RawMessage) (*mcpgo.CallToolResult, error) {
	id, err := stringArg(args, "session_id")
	if err != nil {
		return mcpgo.NewToolResultError(argErrorText(err)), nil
	}
	if err := h.cfg.Sessions.CloseSession(ctx, id); err != nil {
		return sessionError(err), nil
	}
	return mcpgo.NewToolResultText("session " + id + " closed"), nil
}

func (h *handler) listSessions(ctx context.Context, args map[string]json.RawMessage) (*mcpgo.CallToolResult, error) {
	infos := ownSessions(h.cfg.Sessions, sandbox.OwnerFrom(ctx))
	var b strings.Builder
	if len(infos) == 0 {
		b.WriteString("no live sessions")
	}
	for _, s := range infos {
		fmt.Fprintf(&b, "%s  %s  %d calls  expires %s\n", s.ID, s.Language, s.Calls, s.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if infos == nil {
		infos = []sandbox.SessionInfo{}
	}
	return &mcpgo.CallToolResult{Content: []mcpgo.Content{mcpgo.NewTextContent(b.String())},
		StructuredContent: map[string]any{"sessions": infos}}, nil
}

func (h *handler) writeFile(ctx context.Context, args map[string]json.RawMessage) (*mcpgo.CallToolResult, error) {
	id, file, err := writeFileArgs(args)
	if err != nil {
		return mcpgo.NewToolResultError(argErrorText(err)), nil
	}
	if err := h.cfg.Sessions.WriteFiles(ctx, id, []sandbox.File{file}); err != nil {
		return sessionError(err), nil
	}
	return mcpgo.NewToolResultText(fmt.Sprintf("wrote /workspace/%s (%d bytes)", EscapeName(file.Path), len(file.Data))), nil
}

// writeFileArgs decodes write_file's arguments; errors are
// *sandbox.InputError naming the argument.
func writeFileArgs(args map[string]json.RawMessage) (id string, file sandbox.File, err error) {
	var f inputFile
	for _, a := range []struct {
		name string
		dst  *string
	}{{"session_id", &id}, {"path", &f.Path}, {"content", &f.Content}, {"encoding", &f.Encoding}} {
		if *a.dst, err = stringArg(args, a.name); err != nil {
			return "", file, err
		}
	}
	content, err := decodeContent(f)
	if err != nil {
		field := "content"
		if f.Encoding != "" && f.Encoding != "text" && f.Encoding != "base64" {
			field = "encoding"
		}
		return "", file, argError(field, "argument %q: %v", field, err)
	}
	return id, sandbox.File{Path: f.Path, Data: content}, nil
}

func (h *handler) readFile(ctx context.Context, args map[string]json.RawMessage) (*mcpgo.CallToolResult, error) {
	id, err1 := stringArg(args, "session_id")
	name, err2 := stringArg(args, "path")
	if err := errors.Join(err1, err2); err != nil {
		return mcpgo.NewToolResultError(argErrorText(err)), nil
	}
	f, err := h.cfg.Sessions.ReadFile(ctx, id, unescapeName(name))
	if err != nil {
		return sessionError(err), nil
	}
	return readFileResult(f), nil
}

// readFileResult is read_file's result under the content policy: text as
// text, checked images as images, other files as resources; a note first
// says what was withheld.
func readFileResult(f sandbox.OutputFile) *mcpgo.CallToolResult {
	shown := EscapeName(f.Path)
	d := deliver(f.Path, f.Data)
	out := map[string]any{"path": shown, "size": f.Size, "mime_type": d.mimeType, "returned": d.skipped == ""}
	var notes []string
	if shown != f.Path {
		out["name_escaped"] = true
		notes = append(notes, shown+":"+nameEscapedNote[1:])
	}
	var content []mcpgo.Content
	switch {
	case d.skipped != "":
		out["skipped"] = d.skipped
		notes = append(notes, shown+": not returned: "+d.skipped)
	case d.image:
		content = append(content, mcpgo.NewImageContent(base64.StdEncoding.EncodeToString(f.Data), d.mimeType))
	case d.text:
		content = append(content, mcpgo.NewTextContent(string(f.Data)))
	default:
		content = append(content, fileContent(f, d))
	}
	if d.withheld != "" {
		out["withheld"] = d.withheld
		notes = append(notes, shown+": "+d.withheld)
	}
	if len(notes) > 0 {
		content = append([]mcpgo.Content{mcpgo.NewTextContent(strings.Join(notes, "\n"))}, content...)
	}
	return &mcpgo.CallToolResult{Content: content, StructuredContent: out}
}

func (h *handler) listFiles(ctx context.Context, args map[string]json.RawMessage) (*mcpgo.CallToolResult, error) {
	id, err1 := stringArg(args, "session_id")
	dir, err2 := stringArg(args, "path")
	if err := errors.Join(err1, err2); err != nil {
		return mcpgo.NewToolResultError(argErrorText(err)), nil
	}
	files, err := h.cfg.Sessions.ListFiles(ctx, id, unescapeName(dir))
	if err != nil {
		return sessionError(err), nil
	}
	var b strings.Builder
	type entry struct {
		Path string `json:"path"`
		Type string `json:"type"`
		Size int64  `json:"size"`
	}
	entries := []entry{}
	escaped := false
	for _, f := range files {
		name := EscapeName(f.Path)
		escaped = escaped || name != f.Path
		entries = append(entries, entry{name, f.Type, f.Size})
		switch f.Type {
		case "dir":
			fmt.Fprintf(&b, "%s/\n", name)
		case "file":
			fmt.Fprintf(&b, "%s  %s\n", name, sandbox.FormatBytes(f.Size))
		default:
			fmt.Fprintf(&b, "%s  (%s)\n", name, f.Type)
		}
	}
	if escaped {
		b.WriteString("(names with invisible or control characters are shown as \\u escapes; read_file takes them as shown)\n")
	}
	if len(files) == 0 {
		b.WriteString("(empty)")
	}
	return &mcpgo.CallToolResult{Content: []mcpgo.Content{mcpgo.NewTextContent(b.String())},
		StructuredContent: map[string]any{"files": entries}}, nil
}

// decodeContent decodes a file's content by its encoding.
func decodeContent(f inputFile) ([]byte, error) {
	switch f.Encoding {
	case "", "text":
		if !utf8.ValidString(f.Content) {
			return nil, fmt.Errorf("content of %s is not valid UTF-8; use encoding base64", f.Path)
		}
		return []byte(f.Content), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(f.Content)
		if err != nil {
			return nil, fmt.Errorf("content of %s is not valid base64", f.Path)
		}
		return b, nil
	}
	return nil, fmt.Errorf("encoding %q of %s is not text or base64", f.Encoding, f.Path)
}
