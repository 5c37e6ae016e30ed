package egress

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestNormalizeName(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	name253 := long63 + "." + long63 + "." + long63 + "." + strings.Repeat("d", 61)
	tests := []struct {
		in, want string
		err      string // a substring of the error; "" for none
	}{
		{"example.com", "example.com", ""},
		{"Example.COM", "example.com", ""},
		{"example.com.", "example.com", ""},
		{"EXAMPLE.com.", "example.com", ""},
		{"bücher.de", "xn--bcher-kva.de", ""},
		{"BÜCHER.de", "xn--bcher-kva.de", ""},
		{"XN--BCHER-KVA.DE", "xn--bcher-kva.de", ""},
		{"xn--bcher-kva.de.", "xn--bcher-kva.de", ""},
		{"bücher。de", "xn--bcher-kva.de", ""}, // an ideographic full stop is a dot
		{"a-b.example", "a-b.example", ""},
		{long63 + ".example", long63 + ".example", ""},
		{name253, name253, ""},
		{name253 + ".", name253, ""},
		{"x" + name253, "", "too long"},
		{"bücher.de.", "xn--bcher-kva.de", ""},
		{"bücher.de..", "", "empty label"},
		{"bücher.de。.", "", "empty label"},
		{"", "", "empty host name"},
		{".", "", "empty host name"},
		{"example..com", "", "empty label"},
		{".example.com", "", "empty label"},
		{"example.com..", "", "empty label"},
		{long63 + "a.example", "", "longer than 63"},
		{strings.Repeat("abcdefghi.", 26) + "com", "", "too long"},
		{"exa_mple.com", "", "character '_'"},
		{"exa mple.com", "", "character"},
		{"*.example.com", "", "character '*'"},
		{"-example.com", "", "hyphen"},
		{"example-.com", "", "hyphen"},
		{"example.com:443", "", "character ':'"},
		{"127.0.0.1", "", "numeric label"},
		{"127.1", "", "numeric label"},
		{"xn--zz.example", "", "punycode"},
		{"exa\x00mple.com", "", "character"},
		{"exam\u200bple.com", "", ""}, // mapped away by IDNA (zero-width space)
	}
	for _, tt := range tests {
		got, err := NormalizeName(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("NormalizeName(%q) = %q, %v; want an error with %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if tt.in == "exam\u200bple.com" {
			// Either refused or mapped to the plain name; never anything else.
			if err == nil && got != "example.com" {
				t.Errorf("NormalizeName(%q) = %q; want example.com or an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestParse(t *testing.T) {
	v4 := netip.MustParsePrefix
	tests := []struct {
		in   []string
		want []Entry
		strs []string
	}{
		{[]string{"pypi.org"}, []Entry{{Host: "pypi.org"}}, []string{"pypi.org"}},
		{[]string{" PyPI.org. "}, []Entry{{Host: "pypi.org"}}, []string{"pypi.org"}},
		{[]string{"api.example.com:443"}, []Entry{{Host: "api.example.com", Ports: []uint16{443}}}, []string{"api.example.com:443"}},
		{[]string{"api.example.com:443", "api.example.com:80"}, []Entry{{Host: "api.example.com"}}, []string{"api.example.com"}},
		{[]string{"example.com", "example.com:8443"}, []Entry{{Host: "example.com", Ports: []uint16{80, 443, 8443}}}, []string{"example.com", "example.com:8443"}},
		{[]string{"example.com:8443", "example.com:22"}, []Entry{{Host: "example.com", Ports: []uint16{22, 8443}}}, []string{"example.com:22", "example.com:8443"}},
		{[]string{"*.example.com"}, []Entry{{Host: "*.example.com"}}, []string{"*.example.com"}},
		{[]string{"*.Example.COM.:8443"}, []Entry{{Host: "*.example.com", Ports: []uint16{8443}}}, []string{"*.example.com:8443"}},
		{[]string{"*.bücher.de"}, []Entry{{Host: "*.xn--bcher-kva.de"}}, []string{"*.xn--bcher-kva.de"}},
		{[]string{"203.0.113.0/24"}, []Entry{{Prefix: v4("203.0.113.0/24")}}, []string{"203.0.113.0/24"}},
		{[]string{"203.0.113.9/24:443"}, []Entry{{Prefix: v4("203.0.113.0/24"), Ports: []uint16{443}}}, []string{"203.0.113.0/24:443"}},
		{[]string{"203.0.113.7"}, []Entry{{Prefix: v4("203.0.113.7/32")}}, []string{"203.0.113.7/32"}},
		{[]string{"203.0.113.7:8080"}, []Entry{{Prefix: v4("203.0.113.7/32"), Ports: []uint16{8080}}}, []string{"203.0.113.7/32:8080"}},
		{[]string{"2001:db8::/32"}, []Entry{{Prefix: v4("2001:db8::/32")}}, []string{"2001:db8::/32"}},
		{[]string{"[2001:db8::/32]:443"}, []Entry{{Prefix: v4("2001:db8::/32"), Ports: []uint16{443}}}, []string{"[2001:db8::/32]:443"}},
		{[]string{"[2001:DB8::1]:443"}, []Entry{{Prefix: v4("2001:db8::1/128"), Ports: []uint16{443}}}, []string{"[2001:db8::1/128]:443"}},
		{[]string{"::ffff:203.0.113.0/120"}, []Entry{{Prefix: v4("203.0.113.0/24")}}, []string{"203.0.113.0/24"}},
		{[]string{"mirror.corp=10.1.2.3:443"}, []Entry{{Host: "mirror.corp", Pin: netip.MustParseAddrPort("10.1.2.3:443"), Ports: []uint16{443}}}, []string{"mirror.corp=10.1.2.3:443"}},
		{[]string{"Pypi.TEST.=127.0.0.1:8443"}, []Entry{{Host: "pypi.test", Pin: netip.MustParseAddrPort("127.0.0.1:8443"), Ports: []uint16{8443}}}, []string{"pypi.test=127.0.0.1:8443"}},
		{[]string{"v6.test=[::1]:8443"}, []Entry{{Host: "v6.test", Pin: netip.MustParseAddrPort("[::1]:8443"), Ports: []uint16{8443}}}, []string{"v6.test=[::1]:8443"}},
		{[]string{"mapped.test=[::ffff:127.0.0.1]:80"}, []Entry{{Host: "mapped.test", Pin: netip.MustParseAddrPort("127.0.0.1:80"), Ports: []uint16{80}}}, []string{"mapped.test=127.0.0.1:80"}},
		{[]string{"a.test=127.0.0.1:1000", "a.test=127.0.0.1:2000"}, []Entry{
			{Host: "a.test", Pin: netip.MustParseAddrPort("127.0.0.1:1000"), Ports: []uint16{1000}},
			{Host: "a.test", Pin: netip.MustParseAddrPort("127.0.0.1:2000"), Ports: []uint16{2000}},
		}, []string{"a.test=127.0.0.1:1000", "a.test=127.0.0.1:2000"}},
		{[]string{"pypi"}, []Entry{{Host: "pypi.org", Preset: "pypi"}, {Host: "files.pythonhosted.org", Preset: "pypi"}}, []string{"pypi"}},
		{[]string{"NPM", "npm"}, []Entry{{Host: "registry.npmjs.org", Preset: "npm"}}, []string{"npm"}},
		{[]string{"pypi", "pypi.org:8080"}, []Entry{{Host: "pypi.org", Preset: "pypi"}, {Host: "files.pythonhosted.org", Preset: "pypi"}, {Host: "pypi.org", Ports: []uint16{8080}}}, []string{"pypi", "pypi.org:8080"}},
		{[]string{"pypi.org", "example.com", "pypi.org"}, []Entry{{Host: "pypi.org"}, {Host: "example.com"}}, []string{"pypi.org", "example.com"}},
		{nil, nil, nil},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got.Entries, tt.want) {
			t.Errorf("Parse(%q) = %#v; want %#v", tt.in, got.Entries, tt.want)
		}
		if s := got.Strings(); !reflect.DeepEqual(s, tt.strs) {
			t.Errorf("Parse(%q).Strings() = %q; want %q", tt.in, s, tt.strs)
		}
		again, err := Parse(got.Strings())
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("Parse(Parse(%q).Strings()) = %#v, %v; want %#v", tt.in, again, err, got)
		}
		if got.Empty() != (len(tt.want) == 0) {
			t.Errorf("Parse(%q).Empty() = %v", tt.in, got.Empty())
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string // a substring of the error, which also names the entry
	}{
		{"", "empty entry"},
		{"  ", "empty entry"},
		{"a.com b.com", "one destination per entry"},
		{"a.com,b.com", "one destination per entry"},
		{"localhost", "not a preset"},
		{"pip", "not a preset (github, npm, pypi)"},
		{"*", "a wildcard must name a domain"},
		{"*.com", "at least two labels"},
		{"*.*.example.com", "whole first label"},
		{"a.*.example.com", "whole first label"},
		{"*example.com", "whole first label"},
		{"example.com:0", "from 1 to 65535"},
		{"example.com:65536", "from 1 to 65535"},
		{"example.com:http", "from 1 to 65535"},
		{"example.com:", "from 1 to 65535"},
		{"example.com:+443", "from 1 to 65535"},
		{"example.com:0443", "from 1 to 65535"},
		{"exa_mple.com", "write a host name"},
		{"example..com", "empty label"},
		{"127.1", "numeric label"},
		{"10.0.0.0/8", "a private address (RFC 1918)"},
		{"10.1.0.0/16:443", "pin a name"},
		{"127.0.0.1", "a loopback address"},
		{"[::1]:443", "a loopback address"},
		{"::1", "a loopback address"},
		{"169.254.169.254", "the cloud metadata address"},
		{"169.254.0.0/16", "a link-local address"},
		{"[fd00:ec2::254]:80", "the cloud metadata address"},
		{"fd00::/8", "a unique local address"},
		{"fe80::/10", "a link-local address"},
		{"::ffff:127.0.0.1", "a loopback address"},
		{"::ffff:10.0.0.0/104", "RFC 1918"},
		{"64:ff9b::a00:1", "RFC 1918"},
		{"100.64.0.0/10", "carrier-grade NAT"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.19.0.5", "benchmarking"},
		{"224.0.0.1", "multicast"},
		{"255.255.255.255", "broadcast"},
		{"0.0.0.0/8", "0.0.0.0/8"},
		{"203.0.113.0/33", "not a CIDR"},
		{"203.0.113.0/24:x", "from 1 to 65535"},
		{"[2001:db8::/32", "missing ]"},
		{"[2001:db8::/32]443", "after ] comes :port"},
		{"[2001:db8::zz]:443", "not an IPv6 address"},
		{"2001:db8::/200", "not a CIDR"},
		{"fe80::1%eth0", "zone"},
		{"example.com/24", "not a host name nor a CIDR"},
		{"*.example.com=10.0.0.1:443", "not a wildcard"},
		{"mirror.corp:443=10.0.0.1:443", "goes after the address"},
		{"mirror.corp=10.0.0.1", "is not ip:port"},
		{"mirror.corp=10.0.0.1:0", "from 1 to 65535"},
		{"mirror.corp=mirror:443", "is not ip:port"},
		{"mirror.corp=0.0.0.0:443", "cannot be dialled"},
		{"mirror.corp=224.0.0.1:443", "cannot be dialled"},
		{"mirror.corp=10.0.0.1:443=x", "one pin per entry"},
		{"mirror=10.0.0.1:443", "host name with a dot"},
		{"pypi:443", "not a preset"},
	}
	for _, tt := range tests {
		_, err := Parse([]string{"pypi.org", tt.in})
		if err == nil {
			t.Errorf("Parse(%q) accepted it; want an error with %q", tt.in, tt.want)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tt.want) || !strings.Contains(msg, fmt.Sprintf("%q", tt.in)) || strings.Contains(msg, "\n") {
			t.Errorf("Parse(%q) = %q; want one line naming the entry, with %q", tt.in, msg, tt.want)
		}
	}
}

func TestParseConflictingPins(t *testing.T) {
	for _, in := range [][]string{
		{"a.test=127.0.0.1:443", "a.test"},
		{"a.test:443", "a.test=127.0.0.1:443"},
		{"a.test=127.0.0.1:443", "a.test=127.0.0.2:443"},
	} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), "a.test:443") || !strings.Contains(err.Error(), "keep one") {
			t.Errorf("Parse(%q) = %v; want the conflict on a.test:443", in, err)
		}
	}
	if _, err := Parse([]string{"a.test=127.0.0.1:8443", "a.test"}); err != nil {
		t.Errorf("a pin on another port than the entry's: %v", err)
	}
}

func mustParse(t *testing.T, entries ...string) Allowlist {
	t.Helper()
	a, err := Parse(entries)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestMatch(t *testing.T) {
	a := mustParse(t, "pypi", "api.example.com:443", "*.cdn.example", "exact.test:8443", "mirror.test=127.0.0.1:8443", "*.mirror.test", "bücher.de")
	tests := []struct {
		name string
		port uint16
		want string // the matching entry's String, "" for none
	}{
		{"pypi.org", 443, "pypi.org"},
		{"pypi.org", 80, "pypi.org"},
		{"pypi.org", 8080, ""},
		{"PYPI.ORG.", 443, "pypi.org"},
		{"files.pythonhosted.org", 443, "files.pythonhosted.org"},
		{"evil.pypi.org", 443, ""},
		{"pypi.org.evil.test", 443, ""},
		{"api.example.com", 443, "api.example.com:443"},
		{"api.example.com", 80, ""},
		{"example.com", 443, ""},
		{"a.cdn.example", 443, "*.cdn.example"},
		{"a.b.c.cdn.example", 80, "*.cdn.example"},
		{"A.CDN.Example.", 80, "*.cdn.example"},
		{"cdn.example", 443, ""},
		{"xcdn.example", 443, ""},
		{"exact.test", 8443, "exact.test:8443"},
		{"exact.test", 443, ""},
		{"mirror.test", 8443, "mirror.test=127.0.0.1:8443"},
		{"Mirror.Test.", 8443, "mirror.test=127.0.0.1:8443"},
		{"mirror.test", 443, ""},
		{"www.mirror.test", 443, "*.mirror.test"},
		{"bücher.de", 443, "xn--bcher-kva.de"},
		{"BÜCHER.de.", 443, "xn--bcher-kva.de"},
		{"xn--bcher-kva.de", 443, "xn--bcher-kva.de"},
		{"XN--BCHER-KVA.DE", 80, "xn--bcher-kva.de"},
		{"", 443, ""},
		{"pypi..org", 443, ""},
		{"127.0.0.1", 443, ""},
	}
	for _, tt := range tests {
		e, ok := a.Match(tt.name, tt.port)
		got := ""
		if ok {
			got = e.strings()[0]
		}
		if got != tt.want {
			t.Errorf("Match(%q, %d) = %q; want %q", tt.name, tt.port, got, tt.want)
		}
		if e, ok := a.Match(tt.name, tt.port); ok && e.Host == "mirror.test" && e.Pin != netip.MustParseAddrPort("127.0.0.1:8443") {
			t.Errorf("Match(%q) lost the pin: %#v", tt.name, e)
		}
	}
}

// A pinned name wins over a wildcard covering it, whatever the order.
func TestMatchExactBeforeWildcard(t *testing.T) {
	a := mustParse(t, "*.corp.example", "pkg.corp.example=10.0.0.5:443")
	e, ok := a.Match("pkg.corp.example", 443)
	if !ok || e.Pin != netip.MustParseAddrPort("10.0.0.5:443") {
		t.Fatalf("Match = %#v, %v; want the pin", e, ok)
	}
}

func TestAllowsName(t *testing.T) {
	a := mustParse(t, "pypi", "exact.test:8443", "*.cdn.example", "mirror.test=127.0.0.1:8443", "203.0.113.0/24")
	tests := []struct {
		name string
		want bool
	}{
		{"pypi.org", true},
		{"Pypi.Org.", true},
		{"files.pythonhosted.org", true},
		{"exact.test", true},
		{"x.cdn.example", true},
		{"cdn.example", false},
		{"mirror.test", true},
		{"MIRROR.test.", true},
		{"other.test", false},
		{"203.0.113.5", false},
		{"", false},
		{"*.cdn.example", false},
	}
	for _, tt := range tests {
		if got := a.AllowsName(tt.name); got != tt.want {
			t.Errorf("AllowsName(%q) = %v; want %v", tt.name, got, tt.want)
		}
	}
	if (Allowlist{}).AllowsName("pypi.org") {
		t.Error("the empty allowlist allows a name")
	}
}

func TestMatchAddr(t *testing.T) {
	a := mustParse(t, "203.0.113.0/24:443", "[2001:db8::/32]", "0.0.0.0/0:8080", "pypi.org")
	tests := []struct {
		addr string
		port uint16
		want bool
	}{
		{"203.0.113.9", 443, true},
		{"203.0.113.9", 80, false},
		{"::ffff:203.0.113.9", 443, true},
		{"203.0.114.1", 443, false},
		{"2001:db8::1", 80, true},
		{"2001:db8::1", 443, true},
		{"2001:db8::1", 22, false},
		{"2001:db9::1", 80, false},
		{"198.51.100.7", 8080, true},
		// Inside 0.0.0.0/0, and still refused: the blocked ranges win.
		{"127.0.0.1", 8080, false},
		{"::ffff:127.0.0.1", 8080, false},
		{"10.0.0.1", 8080, false},
		{"169.254.169.254", 8080, false},
		{"198.18.0.1", 8080, false},
		{"198.19.0.1", 8080, false},
	}
	for _, tt := range tests {
		if got := a.MatchAddr(netip.MustParseAddr(tt.addr), tt.port); got != tt.want {
			t.Errorf("MatchAddr(%s, %d) = %v; want %v", tt.addr, tt.port, got, tt.want)
		}
	}
	if (Allowlist{}).MatchAddr(netip.MustParseAddr("203.0.113.9"), 443) {
		t.Error("the empty allowlist allows an address")
	}
}

func TestNarrow(t *testing.T) {
	policy := mustParse(t, "pypi", "api.example.com:443", "*.cdn.example", "pypi.test=127.0.0.1:8443", "203.0.113.0/24", "[2001:db8::/32]:443", "exact.test", "exact.test:8443")
	tests := []struct {
		req  []string
		want []string // the narrowed list's Strings
	}{
		{nil, nil},
		{[]string{"pypi"}, []string{"pypi"}},
		{[]string{"PyPI"}, []string{"pypi"}},
		{[]string{"pypi.org"}, []string{"pypi.org"}},
		{[]string{"pypi.org:443"}, []string{"pypi.org:443"}},
		{[]string{"Pypi.Org."}, []string{"pypi.org"}},
		{[]string{"api.example.com"}, []string{"api.example.com:443"}},
		{[]string{"api.example.com:443"}, []string{"api.example.com:443"}},
		{[]string{"a.cdn.example"}, []string{"a.cdn.example"}},
		{[]string{"a.cdn.example:80"}, []string{"a.cdn.example:80"}},
		{[]string{"*.cdn.example"}, []string{"*.cdn.example"}},
		{[]string{"*.a.cdn.example:443"}, []string{"*.a.cdn.example:443"}},
		{[]string{"pypi.test"}, []string{"pypi.test=127.0.0.1:8443"}},
		{[]string{"PYPI.test.:8443"}, []string{"pypi.test=127.0.0.1:8443"}},
		{[]string{"pypi.test=127.0.0.1:8443"}, []string{"pypi.test=127.0.0.1:8443"}},
		{[]string{"203.0.113.0/24"}, []string{"203.0.113.0/24"}},
		{[]string{"203.0.113.128/25:80"}, []string{"203.0.113.128/25:80"}},
		{[]string{"203.0.113.7"}, []string{"203.0.113.7/32"}},
		{[]string{"2001:db8:1::/48"}, []string{"[2001:db8:1::/48]:443"}},
		{[]string{"exact.test"}, []string{"exact.test", "exact.test:8443"}},
		{[]string{"exact.test:8443"}, []string{"exact.test:8443"}},
		{[]string{"pypi", "pypi.org", "api.example.com"}, []string{"pypi", "pypi.org", "api.example.com:443"}},
	}
	for _, tt := range tests {
		got, err := policy.Narrow(tt.req)
		if err != nil {
			t.Errorf("Narrow(%q): %v", tt.req, err)
			continue
		}
		if s := got.Strings(); !reflect.DeepEqual(s, tt.want) {
			t.Errorf("Narrow(%q) = %q; want %q", tt.req, s, tt.want)
		}
		again, err := Parse(got.Strings())
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("Narrow(%q) does not round-trip: %#v, %v; want %#v", tt.req, again, err, got)
		}
	}
}

func TestNarrowPresetByHosts(t *testing.T) {
	policy := mustParse(t, "pypi.org", "files.pythonhosted.org")
	got, err := policy.Narrow([]string{"pypi"})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Strings(); !reflect.DeepEqual(s, []string{"pypi.org", "files.pythonhosted.org"}) {
		t.Errorf("Narrow(pypi) = %q", s)
	}
	if _, err := mustParse(t, "pypi.org").Narrow([]string{"pypi"}); err == nil {
		t.Error("a preset half covered was allowed")
	}
}

func TestNarrowRefused(t *testing.T) {
	policy := mustParse(t, "pypi", "api.example.com:443", "*.cdn.example", "pypi.test=127.0.0.1:8443", "203.0.113.0/24:443")
	allowed := "allowed: pypi, api.example.com:443, *.cdn.example, pypi.test=127.0.0.1:8443, 203.0.113.0/24:443"
	for _, req := range []string{
		"npm",
		"evil.test",
		"example.com",
		"api.example.com:80",
		"api.example.com:8443",
		"cdn.example",
		"*.other.example",
		"*.example.com",
		"pypi.org:8080",
		"pypi.test:443",
		"pypi.test=127.0.0.1:9999",
		"pypi.test=127.0.0.2:8443",
		"evil.test=127.0.0.1:8443",
		"203.0.113.0/23",
		"203.0.113.7:80",
		"198.51.100.0/24",
		"[2001:db8::1]:443",
	} {
		_, err := policy.Narrow([]string{"pypi", req})
		want := fmt.Sprintf("network entry %q is not allowed here; %s", req, allowed)
		if err == nil || err.Error() != want {
			t.Errorf("Narrow(%q) = %v; want %q", req, err, want)
		}
	}
	_, err := (Allowlist{}).Narrow([]string{"pypi.org"})
	if err == nil || !strings.Contains(err.Error(), `network entry "pypi.org" is not allowed here`) || !strings.Contains(err.Error(), "--allow-net") {
		t.Errorf("Narrow on the empty list = %v; want the --allow-net hint", err)
	}
	if _, err := policy.Narrow([]string{"10.0.0.0/8"}); err == nil || !strings.Contains(err.Error(), "RFC 1918") {
		t.Errorf("Narrow(10.0.0.0/8) = %v; want the parse error", err)
	}
	if got, err := (Allowlist{}).Narrow(nil); err != nil || !got.Empty() {
		t.Errorf("Narrow(nil) on the empty list = %v, %v", got, err)
	}
}

// Every spelling of a name gets the same decision, from every function.
func TestNameVariantsSameDecision(t *testing.T) {
	a := mustParse(t, "bücher.de", "Pypi.Org", "*.Example.Test.")
	groups := [][]string{
		{"bücher.de", "BÜCHER.DE", "bücher.de.", "xn--bcher-kva.de", "XN--BCHER-KVA.DE.", "Bücher.De"},
		{"pypi.org", "PYPI.ORG", "pypi.org.", "PyPi.Org."},
		{"a.example.test", "A.EXAMPLE.TEST.", "a.Example.test"},
		{"evil.test", "EVIL.test", "evil.test."},
		{"example.test", "EXAMPLE.TEST.", "Example.Test"},
	}
	for _, g := range groups {
		_, m0 := a.Match(g[0], 443)
		n0 := a.AllowsName(g[0])
		_, err0 := a.Narrow([]string{g[0]})
		for _, v := range g[1:] {
			_, m := a.Match(v, 443)
			_, err := a.Narrow([]string{v})
			if m != m0 || a.AllowsName(v) != n0 || (err == nil) != (err0 == nil) {
				t.Errorf("%q and %q get different decisions", g[0], v)
			}
		}
	}
}

func ExampleAllowlist_Narrow() {
	policy, err := Parse([]string{"pypi", "api.example.com:443", "*.cdn.example", "pypi.test=127.0.0.1:8443"})
	if err != nil {
		fmt.Println(err)
		return
	}
	call, err := policy.Narrow([]string{"pypi.test", "img.cdn.example"})
	fmt.Println(call.Strings(), err)
	e, ok := call.Match("PYPI.TEST.", 8443)
	fmt.Println(e.Pin, ok)
	_, ok = call.Match("pypi.org", 443)
	fmt.Println(ok)
	_, err = policy.Narrow([]string{"evil.test"})
	fmt.Println(err)
	// Output:
	// [pypi.test=127.0.0.1:8443 img.cdn.example] <nil>
	// 127.0.0.1:8443 true
	// false
	// network entry "evil.test" is not allowed here; allowed: pypi, api.example.com:443, *.cdn.example, pypi.test=127.0.0.1:8443
}

// A name both pinned and under a wildcard narrows to what Match decides:
// the pin for its port, the wildcard for the others.
func TestNarrowPinUnderWildcard(t *testing.T) {
	policy := mustParse(t, "*.corp.example", "pkg.corp.example=10.0.0.5:443")
	got, err := policy.Narrow([]string{"pkg.corp.example"})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Strings(); !reflect.DeepEqual(s, []string{"pkg.corp.example=10.0.0.5:443", "pkg.corp.example:80"}) {
		t.Errorf("Narrow = %q", s)
	}
	for _, port := range []uint16{80, 443} {
		want, _ := policy.Match("pkg.corp.example", port)
		e, ok := got.Match("pkg.corp.example", port)
		if !ok || e.Pin != want.Pin {
			t.Errorf("port %d: narrowed %#v, policy %#v", port, e, want)
		}
	}
}

// A wildcard request keeps the pins of the names below it.
func TestNarrowWildcardKeepsPins(t *testing.T) {
	policy := mustParse(t, "*.corp.example", "pkg.corp.example=10.0.0.5:443")
	got, err := policy.Narrow([]string{"*.corp.example"})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Strings(); !reflect.DeepEqual(s, []string{"*.corp.example", "pkg.corp.example=10.0.0.5:443"}) {
		t.Errorf("Narrow = %q", s)
	}
	got, err = policy.Narrow([]string{"*.corp.example:80"})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Strings(); !reflect.DeepEqual(s, []string{"*.corp.example:80"}) {
		t.Errorf("Narrow(:80) = %q", s)
	}
	if _, err := mustParse(t, "pkg.corp.example=10.0.0.5:443").Narrow([]string{"*.corp.example"}); err == nil {
		t.Error("a wildcard was allowed by a pin below it")
	}
}
