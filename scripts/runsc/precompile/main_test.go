package main

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
)

// TestRender checks that the generated source parses and that each case of
// its lookup holds its program: the bytecode decodes back to the original
// and the variable offsets, an optimized-away variable's nil included, are
// the original ones.
func TestRender(t *testing.T) {
	programs := []precompiledseccomp.Program{
		{Name: "b", Bytecode32: []uint32{0x20, 0, 0, 4, 0x15, 0x13371337, 1, 0}, VarOffsets: map[string][]int{"fd": {5}, "gone": nil}},
		{Name: "a", Bytecode32: []uint32{0x6, 0, 0, 0x7fff0000}, VarOffsets: map[string][]int{}},
	}
	want := map[string]precompiledseccomp.Program{}
	for _, p := range programs {
		want[p.Name] = p
	}
	src, err := render(slices.Clone(programs))
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "gen.go", src, 0)
	if err != nil {
		t.Fatalf("generated source does not parse: %v\n%s", err, src)
	}
	got := map[string]precompiledseccomp.Program{}
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			if n.Names[0].Name == "precompiledNames" {
				for _, e := range n.Values[0].(*ast.CompositeLit).Elts {
					names = append(names, unquote(t, e))
				}
			}
		case *ast.CaseClause:
			if len(n.List) != 1 {
				return true
			}
			ret := n.Body[0].(*ast.ReturnStmt)
			name := unquote(t, n.List[0])
			got[name] = precompiledseccomp.Program{Name: name, Bytecode32: decode(t, unquote(t, ret.Results[0])), VarOffsets: offsets(t, ret.Results[1])}
		}
		return true
	})
	if !reflect.DeepEqual(names, []string{"a", "b"}) {
		t.Errorf("precompiledNames = %q, want the names sorted", names)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded programs\n%+v\nwant\n%+v", got, want)
	}
}

// TestRenderRejectsDuplicates checks that two programs of one name, which
// the lookup could not tell apart, fail the generation.
func TestRenderRejectsDuplicates(t *testing.T) {
	p := precompiledseccomp.Program{Name: "x", Bytecode32: []uint32{6, 0, 0, 0}}
	if _, err := render([]precompiledseccomp.Program{p, p}); err == nil {
		t.Error("render accepted two programs named x")
	}
}

func unquote(t *testing.T, e ast.Expr) string {
	t.Helper()
	s, err := strconv.Unquote(e.(*ast.BasicLit).Value)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// decode reverses encode as the generated GetPrecompiled does.
func decode(t *testing.T, code string) []uint32 {
	t.Helper()
	z, err := base64.StdEncoding.DecodeString(code)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(z)))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint32, len(raw)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	return out
}

// offsets evaluates a generated map[string][]int literal.
func offsets(t *testing.T, e ast.Expr) map[string][]int {
	t.Helper()
	m := map[string][]int{}
	for _, kv := range e.(*ast.CompositeLit).Elts {
		kv := kv.(*ast.KeyValueExpr)
		var offs []int
		if lit, ok := kv.Value.(*ast.CompositeLit); ok {
			offs = []int{}
			for _, o := range lit.Elts {
				n, err := strconv.Atoi(o.(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				offs = append(offs, n)
			}
		}
		m[unquote(t, kv.Key)] = offs
	}
	return m
}
