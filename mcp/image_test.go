package mcp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/sandbox"
)

// TestRunCodeImage checks the image argument: offered, described and
// passed on only for the operator's images; refused otherwise with a
// message the model can act on.
func TestRunCodeImage(t *testing.T) {
	policy := sandbox.Policy{Images: []string{"python:3.12-slim", "team/ds:1"}}
	env := testEnv()
	env.Images = policy.Images
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}, policy: policy}
	c := newClient(t, Config{Runner: runner, Environment: env, Sessions: unusedSessions{}})

	tools, err := c.ListTools(t.Context(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name != "run_code" {
			continue
		}
		schema, _ := json.Marshal(tool.InputSchema.Properties["image"])
		if !strings.Contains(string(schema), `"enum":["python:3.12-slim","team/ds:1"]`) {
			t.Errorf("input schema does not offer the images: %s", schema)
		}
		if !strings.Contains(tool.Description, "python:3.12-slim, team/ds:1") {
			t.Errorf("description does not name the images: %s", tool.Description)
		}
	}

	res := callRunCode(t, c, map[string]any{"language": "python", "code": "print(1)", "image": "team/ds:1"})
	if res.IsError {
		t.Fatalf("run in an allowed image: %s", firstText(t, res))
	}
	if jobs := runner.Jobs(); len(jobs) != 1 || jobs[0].Image != "team/ds:1" {
		t.Errorf("jobs %+v, want one in team/ds:1", jobs)
	}
	for _, tt := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"language": "python", "code": "print(1)", "image": "evil:latest"},
			`Invalid argument "image": "evil:latest" is not allowed; use one of python:3.12-slim, team/ds:1`},
		{map[string]any{"language": "python", "code": "print(1)", "image": 3},
			`argument "image" must be of type string`},
		{map[string]any{"language": "python", "code": "print(1)", "image": "team/ds:1", "session_id": "s"},
			"a session keeps the image it started in"},
	} {
		res := callRunCode(t, c, tt.args)
		if !res.IsError || !strings.Contains(firstText(t, res), tt.want) {
			t.Errorf("run_code(%v) = %q, want an error containing %q", tt.args, firstText(t, res), tt.want)
		}
	}
	if len(runner.Jobs()) != 1 {
		t.Errorf("refused calls reached the runner: %+v", runner.Jobs())
	}

	// Without images, the argument is neither offered nor accepted. (The
	// policy is the runner's, so this server has a runner without images.)
	plain := newClient(t, Config{Runner: &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}}})
	tools, err = plain.ListTools(t.Context(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if _, ok := tool.InputSchema.Properties["image"]; tool.Name == "run_code" && ok {
			t.Errorf("input schema offers an image without images: %+v", tool.InputSchema.Properties)
		}
	}
	res = callRunCode(t, plain, map[string]any{"language": "python", "code": "print(1)", "image": "python:3.12-slim"})
	if !res.IsError || !strings.Contains(firstText(t, res), "no image may be chosen") {
		t.Errorf("run_code with an image on a server without images = %q", firstText(t, res))
	}
}

// TestEnvironmentListsImages checks that the environment resource names
// the allowed images.
func TestEnvironmentListsImages(t *testing.T) {
	runner := &fakeRunner{err: context.Canceled, policy: sandbox.Policy{Images: []string{"ruby:3.3"}}}
	env := ProbeEnvironment(t.Context(), runner)
	data, _ := json.Marshal(env)
	if !strings.Contains(string(data), `"images":["ruby:3.3"]`) {
		t.Errorf("environment %s does not list the images", data)
	}
}

// unusedSessions offers sessions to a server whose test never reaches them.
type unusedSessions struct{ sandbox.Sessions }

// ListSessions lists none: a departing client's sessions are looked up.
func (unusedSessions) ListSessions() []sandbox.SessionInfo { return nil }
