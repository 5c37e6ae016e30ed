package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/sandbox"
)

func TestJSONLenIsEncodingJSONs(t *testing.T) {
	for _, s := range []string{"", "plain", `"quoted" \ back`, "<a href='x'>&amp;</a>", "\n\r\t\b\f\x00\x01\x1f",
		"héllo wörld ☃ 𝄞", "bad \xff\xfe utf-8 \xc3", "\u2028\u2029", strings.Repeat("<", 1000)} {
		data, _ := json.Marshal(s)
		if got := jsonLen(s); got != int64(len(data)) {
			t.Errorf("jsonLen(%q) = %d, encoding/json writes %d bytes", s, got, len(data))
		}
	}
}

func TestResponseSizeBoundsTheEncodedResult(t *testing.T) {
	png := bytes.Repeat([]byte{0x89, 'P', 'N', 'G', 0}, 3000)
	for _, res := range []sandbox.Result{
		{Status: sandbox.StatusOK, Stdout: "hi\n"},
		{Status: sandbox.StatusError, ExitCode: 1, Stdout: strings.Repeat("<&>", 20000), Stderr: strings.Repeat("trace\n", 9000)},
		{Status: sandbox.StatusOK, Files: []sandbox.OutputFile{
			{Path: "plot.png", Size: int64(len(png)), Data: png},
			{Path: "t.txt", Size: 30000, Data: bytes.Repeat([]byte("<"), 30000)},
			{Path: "d.bin", Size: 9000, Data: bytes.Repeat([]byte{0xff}, 9000)},
			{Path: "big.bin", Size: 1 << 30, Skipped: "too large"}}},
	} {
		data, err := json.Marshal(result(res))
		if err != nil {
			t.Fatal(err)
		}
		if est := responseSize(res); est < int64(len(data)) {
			t.Errorf("responseSize = %d, below the %d bytes of the encoded result", est, len(data))
		}
	}
}

func TestTextExcerpt(t *testing.T) {
	if s := strings.Repeat("x", textOutputBytes); textExcerpt(s, "stdout") != s {
		t.Error("output within the limit is not kept whole")
	}
	long := strings.Repeat("é", textOutputBytes) // two bytes each
	got := textExcerpt(long, "stdout")
	if !utf8.ValidString(got) || len(got) > textOutputBytes+200 || !strings.Contains(got, `bytes of stdout left out here; the structured content's "stdout" has them all`) {
		t.Errorf("excerpt of %d bytes: %d bytes, valid %v, %q...", len(long), len(got), utf8.ValidString(got), got[textOutputBytes/2-4:textOutputBytes/2+100])
	}
}

func TestFitResponse(t *testing.T) {
	files := func() []sandbox.OutputFile {
		return []sandbox.OutputFile{
			{Path: "a.bin", Size: 100 << 10, Data: bytes.Repeat([]byte{0xff}, 100<<10)},
			{Path: "b.bin", Size: 100 << 10, Data: bytes.Repeat([]byte{0xfe}, 100<<10)}}
	}
	budget := func(perResponse, total int64) *responseTicket {
		return &responseTicket{budget: newResponseBudget(HTTPConfig{MaxResponseBytes: perResponse, MaxInFlightBytes: total})}
	}
	t.Run("over stdio nothing changes", func(t *testing.T) {
		res, refused := fitResponse(context.Background(), sandbox.Result{Files: files()})
		if refused != nil || res.Files[1].Skipped != "" {
			t.Errorf("refused %v, files %+v", refused, res.Files)
		}
	})
	t.Run("files over the response limit are left out, last first, without touching the original", func(t *testing.T) {
		orig := files()
		tk := budget(200<<10, 1<<20)
		res, refused := fitResponse(context.WithValue(context.Background(), ticketKey{}, tk), sandbox.Result{Files: orig})
		if refused != nil || res.Files[0].Skipped != "" || !strings.Contains(res.Files[1].Skipped, "--max-response") || res.Files[1].Data != nil {
			t.Errorf("refused %v, files %+v", refused, res.Files[1].Skipped)
		}
		if orig[1].Skipped != "" || orig[1].Data == nil {
			t.Error("the caller's result was changed")
		}
		if tk.n != responseSize(res) || tk.budget.held.Load() != tk.n {
			t.Errorf("reserved %d (held %d), want %d", tk.n, tk.budget.held.Load(), responseSize(res))
		}
		tk.release()
		if tk.budget.held.Load() != 0 {
			t.Errorf("held %d after release", tk.budget.held.Load())
		}
	})
	t.Run("output over the response limit is refused", func(t *testing.T) {
		tk := budget(64<<10, 1<<20)
		_, refused := fitResponse(context.WithValue(context.Background(), ticketKey{}, tk), sandbox.Result{Status: sandbox.StatusOK, Stdout: strings.Repeat("<", 20<<10)})
		if refused == nil || !refused.IsError || !strings.Contains(refused.Content[0].(mcpgo.TextContent).Text, "--max-response") {
			t.Errorf("got %+v", refused)
		}
	})
	t.Run("no room among the results in flight", func(t *testing.T) {
		first := budget(300<<10, 300<<10)
		ctx := context.WithValue(context.Background(), ticketKey{}, first)
		if _, refused := fitResponse(ctx, sandbox.Result{Files: files()}); refused != nil {
			t.Fatalf("the first result: %v", refused)
		}
		second := &responseTicket{budget: first.budget}
		cancelled, cancel := context.WithCancel(context.WithValue(context.Background(), ticketKey{}, second))
		cancel()
		_, refused := fitResponse(cancelled, sandbox.Result{Files: files()})
		if refused == nil || !strings.Contains(refused.Content[0].(mcpgo.TextContent).Text, "--max-responses-in-flight") {
			t.Errorf("the second result while the first is unread: %+v", refused)
		}
		first.release()
		if _, refused := fitResponse(context.WithValue(context.Background(), ticketKey{}, second), sandbox.Result{Files: files()}); refused != nil {
			t.Errorf("after the first was written: %v", refused)
		}
	})
}
