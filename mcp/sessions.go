package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/sandbox"
)

// sessionTool is a tool of the session family.
type sessionTool struct {
	name, description string
	annotations       mcpgo.ToolAnnotation
	// local marks a tool that reads only the server's own table: it runs
	// no code, so it is neither refused after an audit failure nor recorded.
	local bool
	// input is the tool's input schema.
	input json.RawMessage
	// decode decodes a call's arguments; call runs the tool with them, and
	// sent are the arguments as sent.
	decode func(raw any) (call sessionCall, sent map[string]json.RawMessage, err error)
}

type sessionCall func(h *handler, ctx context.Context) (*mcpgo.CallToolResult, error)

// argChecker is implemented by argument types with checks of their own
// beyond their JSON types, run right after decoding.
type argChecker interface{ check() error }

// newSessionTool is a session tool whose arguments are a T; patch, if
// set, adds to T's generated schema what only the server knows.
func newSessionTool[T any](name, description string, annotations mcpgo.ToolAnnotation, patch func(*jsonschema.Schema),
	handle func(h *handler, ctx context.Context, args T) (*mcpgo.CallToolResult, error)) sessionTool {
	s := schemaOf[T]()
	if patch != nil {
		patch(s)
	}
	return sessionTool{
		name: name, description: description, annotations: annotations, input: rawSchema(s),
		decode: func(raw any) (sessionCall, map[string]json.RawMessage, error) {
			args, sent, err := decodeArgs[T](raw)
			if c, ok := any(args).(argChecker); ok && err == nil {
				err = c.check()
			}
			if err != nil {
				return nil, nil, err
			}
			return func(h *handler, ctx context.Context) (*mcpgo.CallToolResult, error) { return handle(h, ctx, args) }, sent, nil
		},
	}
}

func hints(readOnly, destructive, idempotent bool) mcpgo.ToolAnnotation {
	open := false // no network
	return mcpgo.ToolAnnotation{ReadOnlyHint: &readOnly, DestructiveHint: &destructive, IdempotentHint: &idempotent, OpenWorldHint: &open}
}

// The arguments of the session tools (see args.go).
type (
	createSessionArgs struct {
		Language       string   `json:"language"`
		TimeoutSeconds *float64 `json:"timeout_seconds,omitempty"`
		Network        []string `json:"network,omitempty" jsonschema:"what the session's programs may reach: allowlist entries or presets within the server's list; omit for no network"`
		Packages       []string `json:"packages,omitempty" jsonschema:"packages to install when the session starts; they stay for its calls"`
	}
	closeSessionArgs struct {
		SessionID string `json:"session_id" jsonschema:"a session_id returned by create_session"`
	}
	listSessionsArgs struct{}
	writeFileArgs    struct {
		SessionID string `json:"session_id" jsonschema:"a session_id returned by create_session"`
		Path      string `json:"path" jsonschema:"relative to /workspace, e.g. data/input.csv"`
		Content   string `json:"content"`
		Encoding  string `json:"encoding,omitempty" jsonschema:"how content is encoded (default text)"`
	}
	readFileArgs struct {
		SessionID string `json:"session_id" jsonschema:"a session_id returned by create_session"`
		Path      string `json:"path" jsonschema:"relative to /workspace"`
	}
	listFilesArgs struct {
		SessionID string `json:"session_id" jsonschema:"a session_id returned by create_session"`
		Path      string `json:"path,omitempty" jsonschema:"a directory relative to /workspace (default: all of it)"`
	}
)

// A session_id is checked before it is looked up, quoted or recorded.
func (a closeSessionArgs) check() error { return checkSessionID(a.SessionID) }
func (a writeFileArgs) check() error    { return checkSessionID(a.SessionID) }
func (a readFileArgs) check() error     { return checkSessionID(a.SessionID) }
func (a listFilesArgs) check() error    { return checkSessionID(a.SessionID) }

// sessionTools are the session tools of a server in env.
func sessionTools(env Environment) []sessionTool {
	listSessions := newSessionTool("list_sessions", "List your live sessions (those this connection created): id, language, calls, and when each expires.",
		hints(true, false, true), nil, (*handler).listSessions)
	listSessions.local = true
	return []sessionTool{
		newSessionTool("create_session", "Start a stateful session: one sandbox kept alive across calls, with a persistent interpreter. "+
			"Variables, functions and imports (python, node) or the working directory, variables and functions (bash) "+
			"survive between run_code calls that pass its session_id, and so do files in /workspace. "+
			sessionLimitsText(env.Sessions)+"Returns the session_id.",
			hints(false, false, false), func(s *jsonschema.Schema) {
				s.Properties["language"].Enum = enum(env.names())
				timeoutSchema(s.Properties["timeout_seconds"], "default timeout of each call in the session")
				networkSchema(s.Properties, env.NetworkAccess)
			}, (*handler).createSession),
		newSessionTool("close_session", "End a session and free its sandbox; its state and files are discarded.",
			hints(false, true, true), nil, (*handler).closeSession),
		listSessions,
		newSessionTool("write_file", "Write a file into a session's /workspace (creating directories). Use encoding base64 for binary content.",
			hints(false, true, true), func(s *jsonschema.Schema) {
				s.Properties["encoding"].Enum = enum([]string{"text", "base64"})
			}, (*handler).writeFile),
		newSessionTool("read_file", "Read a file from a session's /workspace: text as text, PNG, JPEG and GIF images as images, other files as base64 resources (SVG and HTML as their source text). Symbolic links are not followed. A name listed with \\u escapes is read as listed.",
			hints(true, false, true), nil, (*handler).readFile),
		newSessionTool("list_files", "List the files and directories of a session's /workspace, recursively, with sizes.",
			hints(true, false, true), nil, (*handler).listFiles),
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
		tool := mcpgo.NewToolWithRawSchema(t.name, t.description, t.input)
		tool.Annotations = t.annotations
		tool.Annotations.Title = strings.ReplaceAll(t.name, "_", " ")
		s.AddTool(tool, func(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
			call, _, err := t.decode(req.Params.Arguments)
			if err != nil {
				return h.toolError(err), nil
			}
			// Every session tool acts for the calling client (see identity.go).
			ctx, err = asClient(ctx)
			if err != nil {
				return mcpgo.NewToolResultError(err.Error()), nil
			}
			return call(h, ctx)
		})
	}
}

func (h *handler) createSession(ctx context.Context, args createSessionArgs) (*mcpgo.CallToolResult, error) {
	spec := sandbox.SessionSpec{Language: args.Language, Owner: sandbox.OwnerFrom(ctx), Network: args.Network, Packages: args.Packages}
	if t := args.TimeoutSeconds; t != nil {
		var err error
		if spec.Limits.Timeout, err = h.timeout(*t); err != nil {
			return h.toolError(err), nil
		}
	}
	info, err := h.cfg.Sessions.CreateSession(ctx, spec)
	if err != nil {
		return h.toolError(err), nil
	}
	text := fmt.Sprintf("session_id: %s (%s). Pass it to run_code, write_file, read_file and list_files; end it with close_session. It expires at %s if unused.",
		info.ID, info.Language, info.ExpiresAt.UTC().Format(time.RFC3339))
	return &mcpgo.CallToolResult{Content: []mcpgo.Content{mcpgo.NewTextContent(text)}, StructuredContent: info}, nil
}

func (h *handler) closeSession(ctx context.Context, args closeSessionArgs) (*mcpgo.CallToolResult, error) {
	ac, ok := h.cfg.Sessions.(sandbox.ActivityCloser)
	if !ok {
		if err := h.cfg.Sessions.CloseSession(ctx, args.SessionID); err != nil {
			return h.toolError(err), nil
		}
		return mcpgo.NewToolResultText("session " + args.SessionID + " closed"), nil
	}
	act, err := ac.CloseSessionActivity(ctx, args.SessionID)
	if err != nil {
		return h.toolError(err), nil
	}
	text := "session " + args.SessionID + " closed"
	if act == nil {
		return mcpgo.NewToolResultText(text), nil
	}
	// The whole tree of the session: what every call's sandbox did.
	return &mcpgo.CallToolResult{Content: []mcpgo.Content{mcpgo.NewTextContent(text + "\n" + ActivityLine(act))},
		StructuredContent: closeSessionOutput{SessionID: args.SessionID, Activity: act}}, nil
}

// closeSessionOutput is close_session's structured content when the
// session's sandboxes were monitored.
type closeSessionOutput struct {
	SessionID string            `json:"session_id"`
	Activity  *sandbox.Activity `json:"activity"`
}

func (h *handler) listSessions(ctx context.Context, _ listSessionsArgs) (*mcpgo.CallToolResult, error) {
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

func (h *handler) writeFile(ctx context.Context, args writeFileArgs) (*mcpgo.CallToolResult, error) {
	file, err := args.file()
	if err != nil {
		return h.toolError(err), nil
	}
	if err := h.cfg.Sessions.WriteFiles(ctx, args.SessionID, []sandbox.File{file}); err != nil {
		return h.toolError(err), nil
	}
	return mcpgo.NewToolResultText(fmt.Sprintf("wrote /workspace/%s (%d bytes)", EscapeName(file.Path), len(file.Data))), nil
}

// file is the file write_file writes; errors are *sandbox.InputError
// naming the argument.
func (a writeFileArgs) file() (sandbox.File, error) {
	content, err := decodeContent(inputFile{Path: a.Path, Content: a.Content, Encoding: a.Encoding})
	if err != nil {
		field := "content"
		if a.Encoding != "" && a.Encoding != "text" && a.Encoding != "base64" {
			field = "encoding"
		}
		return sandbox.File{}, argError(field, "argument %q: %v", field, err)
	}
	return sandbox.File{Path: a.Path, Data: content}, nil
}

func (h *handler) readFile(ctx context.Context, args readFileArgs) (*mcpgo.CallToolResult, error) {
	f, err := h.cfg.Sessions.ReadFile(ctx, args.SessionID, unescapeName(args.Path))
	if err != nil {
		return h.toolError(err), nil
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

func (h *handler) listFiles(ctx context.Context, args listFilesArgs) (*mcpgo.CallToolResult, error) {
	files, err := h.cfg.Sessions.ListFiles(ctx, args.SessionID, unescapeName(args.Path))
	if err != nil {
		return h.toolError(err), nil
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
