package rootfs

import (
	"strings"
	"testing"
)

// The checks that replaced counted-repetition regexps accept and refuse
// exactly what those did, at the length limits too.
func TestNameAndDigestChecks(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct {
		what string
		got  bool
		want bool
	}{
		{"sha256 hex", isSHA256Hex(hex64), true},
		{"sha256 hex, 63 digits", isSHA256Hex(hex64[1:]), false},
		{"sha256 hex, 65 digits", isSHA256Hex(hex64 + "a"), false},
		{"sha256 hex, upper case", isSHA256Hex(strings.ToUpper(hex64)), false},
		{"sha256 hex, a g", isSHA256Hex(hex64[1:] + "g"), false},
		{"digest name <hex>/layer.tar", digestName(hex64 + "/layer.tar"), true},
		{"digest name sha256:<hex>", digestName("sha256:" + hex64), true},
		{"digest name, 63 digits then a dot", digestName(hex64[1:] + ".json"), false},
		{"digest name, split run", digestName(hex64[:32] + "-" + hex64[32:]), false},
		{"key of 64", validKey(strings.Repeat("a", 64)), true},
		{"key of 65", validKey(strings.Repeat("a", 65)), false},
		{"key starting with a dot", validKey(".a"), false},
		{"empty key", validKey(""), false},
		{"name of 200", checkName(strings.Repeat("a", 200)) == nil, true},
		{"name of 201", checkName(strings.Repeat("a", 201)) == nil, false},
		{"reference", checkName("registry.example:5000/team/python:3.12@sha256:"+hex64) == nil, true},
		{"reference, short digest", checkName("python@sha256:"+hex64[1:]) == nil, false},
		{"upper-case first letter", checkName("Python") == nil, false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.what, tc.got, tc.want)
		}
	}
}
