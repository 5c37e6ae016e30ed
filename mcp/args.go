package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"
)

// Every tool's arguments are a struct type, the one truth for both sides of
// a call: the input schema listed to clients is generated from it (then
// given what only the server knows, such as the languages: see the tools'
// patch functions), and decodeArgs decodes a call's arguments into it. A
// field is an argument named by its json tag; it is required unless the tag
// says omitempty. A required field tagged `absent:"policy"` is left to the
// policy when absent, which says in its own words what is allowed (run_code's
// language and code).

// argFields describes an argument struct type; see fieldsOf.
type argFields struct {
	names    []string       // in declaration order
	index    map[string]int // of each name's struct field
	required []string       // refused when absent
	schema   []string       // required in the schema: required and those absent:"policy"
}

var argFieldsCache sync.Map // reflect.Type → *argFields

// fieldsOf describes T, once per type.
func fieldsOf[T any]() *argFields {
	t := reflect.TypeFor[T]()
	if f, ok := argFieldsCache.Load(t); ok {
		return f.(*argFields)
	}
	f := &argFields{index: map[string]int{}}
	for i := range t.NumField() {
		field := t.Field(i)
		name, opts, _ := strings.Cut(field.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			panic(fmt.Sprintf("argument field %s.%s has no json name", t, field.Name))
		}
		f.names = append(f.names, name)
		f.index[name] = i
		if opts != "omitempty" {
			f.schema = append(f.schema, name)
			if field.Tag.Get("absent") != "policy" {
				f.required = append(f.required, name)
			}
		}
	}
	argFieldsCache.Store(t, f)
	return f
}

// decodeArgs decodes a call's arguments (as the protocol layer decoded
// them: any JSON value) into T. It refuses, each with an argumentError
// naming the argument and saying what is allowed: anything but an object
// (null passes as no arguments when T requires none), a name T does not
// have, a required argument left out, a value of the wrong type and, in an
// object argument, a field its type does not have. It also returns the
// arguments as sent, by name.
func decodeArgs[T any](raw any) (T, map[string]json.RawMessage, error) {
	var args T
	f := fieldsOf[T]()
	data, err := json.Marshal(raw)
	if err != nil {
		return args, nil, argError("arguments", "arguments are not a JSON object")
	}
	sent := map[string]json.RawMessage{}
	if err := json.Unmarshal(data, &sent); err != nil || string(data) == "null" && len(f.schema) > 0 {
		if len(f.schema) == 0 {
			return args, nil, argError("arguments", "arguments must be a JSON object")
		}
		return args, nil, argError("arguments", "arguments must be a JSON object with %s", strings.Join(f.schema, " and "))
	}
	// The first unknown name by sort order, so that the same call always
	// gets the same error.
	for _, name := range slices.Sorted(maps.Keys(sent)) {
		if _, ok := f.index[name]; !ok {
			return args, nil, argError(name, "unknown argument %q; the arguments are %s", name, strings.Join(f.names, ", "))
		}
	}
	for _, name := range f.required {
		if _, ok := sent[name]; !ok {
			return args, nil, argError(name, "argument %q is required", name)
		}
	}
	v := reflect.ValueOf(&args).Elem()
	for _, name := range f.names {
		value, ok := sent[name]
		if !ok {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(value))
		dec.DisallowUnknownFields() // a misspelt "encoding" must not pass silently
		if err := dec.Decode(v.Field(f.index[name]).Addr().Interface()); err != nil {
			return args, nil, decodeError(name, v.Field(f.index[name]).Type(), err)
		}
	}
	return args, sent, nil
}

// decodeError is the argumentError for argument name of type t that did
// not decode.
func decodeError(name string, t reflect.Type, err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		at := name
		if typeErr.Field != "" {
			at += "." + typeErr.Field
		}
		return argError(name, "argument %q must be of type %s", at, jsonType(typeErr.Type.Kind().String()))
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		for t.Kind() == reflect.Slice || t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		var names []string
		for i := range t.NumField() {
			n, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			names = append(names, n)
		}
		return argError(name, "argument %q: unknown field %s; its fields are %s", name, field, strings.Join(names, ", "))
	}
	return argError(name, "argument %q: %v", name, err)
}

// jsonType names a Go kind as JSON calls it.
func jsonType(kind string) string {
	switch kind {
	case "float64", "int", "int64":
		return "number"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	}
	return kind
}

// schemaOf generates the input schema of T. An argument may be left out
// but not sent as null, so it has one type, never ["null", …]; the
// required list counts the arguments the policy checks (see fieldsOf).
func schemaOf[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("input schema of %T: %v", *new(T), err)) // a bug in the argument type
	}
	s.Required = fieldsOf[T]().schema
	var single func(*jsonschema.Schema)
	single = func(s *jsonschema.Schema) {
		if len(s.Types) == 2 && s.Types[0] == "null" {
			s.Type, s.Types = s.Types[1], nil
		}
		for _, p := range s.Properties {
			single(p)
		}
		if s.Items != nil {
			single(s.Items)
		}
	}
	single(s)
	return s
}

// rawSchema is s as a tool's input schema: an object schema lists its
// properties, if only as {}.
func rawSchema(s *jsonschema.Schema) json.RawMessage {
	data, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("input schema: %v", err))
	}
	if len(s.Properties) == 0 {
		data = append([]byte(`{"properties":{},`), data[1:]...)
	}
	return data
}
