package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// Presets are named groups of host names an operator or a call may list by
// name instead of the hosts, e.g. "pypi". Each host allows the default ports.
var Presets = map[string][]string{
	"pypi":   {"pypi.org", "files.pythonhosted.org"},
	"npm":    {"registry.npmjs.org"},
	"github": {"github.com", "api.github.com", "codeload.github.com", "raw.githubusercontent.com", "objects.githubusercontent.com"},
}

// Name lengths of RFC 1035, counted on the ASCII form without the root dot.
const (
	maxLabelLen = 63
	maxNameLen  = 253
)

// NormalizeName returns the form of a host name the allowlist compares:
// lower case, no trailing dot, internationalised labels as punycode
// (xn--…), so that every spelling of a name gets the same decision. It
// refuses what is not a host name: empty labels, labels over 63 or names
// over 253 characters, characters other than letters, digits and inner
// hyphens, and names whose last label is all digits (IP addresses in
// disguise, like 127.1).
func NormalizeName(name string) (string, error) {
	n := strings.TrimSuffix(name, ".")
	if n == "" {
		return "", errors.New("empty host name")
	}
	if len(n) > 4*maxNameLen {
		return "", fmt.Errorf("host name of %d bytes is too long (at most %d characters)", len(n), maxNameLen)
	}
	if !isASCII(n) {
		a, err := idna.Lookup.ToASCII(n)
		if err != nil {
			return "", fmt.Errorf("host name %q is not a valid internationalised name: %v", name, err)
		}
		if !strings.HasSuffix(name, ".") {
			a = strings.TrimSuffix(a, ".") // a full stop IDNA maps to a dot
		}
		n = a
	}
	n = strings.ToLower(n)
	if len(n) > maxNameLen {
		return "", fmt.Errorf("host name %q is too long (%d characters, at most %d)", name, len(n), maxNameLen)
	}
	labels := strings.Split(n, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", fmt.Errorf("host name %q: %v", name, err)
		}
		if strings.HasPrefix(l, "xn--") {
			// A punycode label must decode to a valid name: the same
			// name spelled in Unicode must not differ from it.
			if _, err := idna.Lookup.ToUnicode(l); err != nil {
				return "", fmt.Errorf("host name %q: label %q is not valid punycode: %v", name, l, err)
			}
		}
	}
	if allDigits(labels[len(labels)-1]) {
		return "", fmt.Errorf("host name %q ends in a numeric label: an IP address is not a name (use a CIDR entry)", name)
	}
	return n, nil
}

func checkLabel(l string) error {
	switch {
	case l == "":
		return errors.New("empty label")
	case len(l) > maxLabelLen:
		return fmt.Errorf("label %q is longer than %d characters", l, maxLabelLen)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("label %q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("label %q has the character %q (only letters, digits and hyphens)", l, c)
		}
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// entryError is the one line a bad entry gets: the entry and the fix.
func entryError(entry, format string, a ...any) error {
	return fmt.Errorf("network entry %q: %s", entry, fmt.Sprintf(format, a...))
}

// entryHelp is the fix for an entry of no known form; %s is presetNames.
const entryHelp = "write a host name (pypi.org), a host and port (api.example.com:443), a wildcard (*.example.com), a CIDR (203.0.113.0/24, [2001:db8::/32]:443), a pin (mirror.example=10.1.2.3:443) or a preset (%s)"

func presetNames() string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// Parse reads allowlist entries (see docs/network.md "Allowlist entries"):
// host names with an optional port, wildcards (*.example.com: every name
// below example.com, not example.com itself), CIDRs with an optional port,
// pins (name=ip:port) and presets. Entries naming the same destination
// are merged (their ports joined); the result is canonical, so that
// Parse(a.Strings()) equals a. An error names the entry and the fix.
func Parse(entries []string) (Allowlist, error) {
	var a Allowlist
	for _, raw := range entries {
		es, err := parseEntry(raw)
		if err != nil {
			return Allowlist{}, err
		}
		for _, e := range es {
			a.add(e)
		}
	}
	if err := a.checkPins(); err != nil {
		return Allowlist{}, err
	}
	return a, nil
}

// add merges e into the entry with the same destination, or appends it.
func (a *Allowlist) add(e Entry) {
	for i := range a.Entries {
		o := &a.Entries[i]
		if o.Host == e.Host && o.Prefix == e.Prefix && o.Pin == e.Pin && o.Preset == e.Preset {
			o.Ports = joinPorts(o.Ports, e.Ports)
			return
		}
	}
	a.Entries = append(a.Entries, e)
}

// joinPorts is the union of two port sets, sorted; nil (the default ports)
// when it is exactly DefaultPorts.
func joinPorts(a, b []uint16) []uint16 {
	u := append(slices.Clone(portsOf(a)), portsOf(b)...)
	slices.Sort(u)
	u = slices.Compact(u)
	if slices.Equal(u, DefaultPorts) {
		return nil
	}
	return u
}

func portsOf(p []uint16) []uint16 {
	if len(p) == 0 {
		return DefaultPorts
	}
	return p
}

// checkPins refuses two entries that would send one name and port to two
// places (two pins, or a pin and a lookup on the host).
func (a Allowlist) checkPins() error {
	for i, e := range a.Entries {
		if !e.Pin.IsValid() {
			continue
		}
		for j, o := range a.Entries {
			if i == j || o.Host != e.Host {
				continue
			}
			for _, p := range portsOf(o.Ports) {
				if p == e.Pin.Port() {
					return fmt.Errorf("network entries %q and %q both decide %s:%d: keep one of them", e.String(), o.String(), e.Host, p)
				}
			}
		}
	}
	return nil
}

// parseEntry reads one entry; a preset gives several.
func parseEntry(raw string) ([]Entry, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return nil, entryError(raw, "empty entry: "+entryHelp, presetNames())
	}
	if strings.ContainsAny(s, " \t\r\n,") {
		return nil, entryError(raw, "one destination per entry (no spaces or commas inside): "+entryHelp, presetNames())
	}
	if name, pin, ok := strings.Cut(s, "="); ok {
		return parsePin(raw, name, pin)
	}
	if hosts, ok := Presets[strings.ToLower(s)]; ok {
		p := strings.ToLower(s)
		es := make([]Entry, 0, len(hosts))
		for _, h := range hosts {
			es = append(es, Entry{Host: h, Preset: p})
		}
		return es, nil
	}
	if e, ok, err := parseCIDR(raw, s); ok || err != nil {
		if err != nil {
			return nil, err
		}
		return []Entry{e}, nil
	}
	host, ports, err := splitPort(raw, s)
	if err != nil {
		return nil, err
	}
	h, err := parseHost(raw, host)
	if err != nil {
		return nil, err
	}
	return []Entry{{Host: h, Ports: ports}}, nil
}

// splitPort splits "host:port" (the port optional).
func splitPort(raw, s string) (string, []uint16, error) {
	host, port, ok := strings.Cut(s, ":")
	if !ok {
		return s, nil, nil
	}
	p, err := parsePort(raw, port)
	if err != nil {
		return "", nil, err
	}
	return host, joinPorts([]uint16{p}, []uint16{p}), nil
}

func parsePort(raw, port string) (uint16, error) {
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 || port[0] == '+' || (len(port) > 1 && port[0] == '0') {
		return 0, entryError(raw, "port %q is not a number from 1 to 65535: write host:443", port)
	}
	return uint16(n), nil
}

// parseHost reads a host name or a wildcard of one.
func parseHost(raw, host string) (string, error) {
	if strings.Contains(host, "/") || strings.Contains(host, "[") {
		return "", entryError(raw, "not a host name nor a CIDR: "+entryHelp, presetNames())
	}
	if host == "*" || host == "*." {
		return "", entryError(raw, "a wildcard must name a domain: write *.example.com (every name below example.com)")
	}
	base, wild := strings.CutPrefix(host, "*.")
	if strings.Contains(base, "*") {
		return "", entryError(raw, "a wildcard is only allowed as the whole first label: write *.example.com")
	}
	if _, err := netip.ParseAddr(strings.TrimSuffix(base, ".")); err == nil && !wild {
		return "", entryError(raw, "an IP address is a CIDR entry: write it with its prefix length")
	}
	n, err := NormalizeName(base)
	if err != nil {
		return "", entryError(raw, "%v: write a host name like pypi.org", err)
	}
	if !strings.Contains(n, ".") {
		if wild {
			return "", entryError(raw, "a wildcard must cover a domain of at least two labels: write *.example.com, not *.com")
		}
		return "", entryError(raw, "not a preset (%s) nor a host name with a dot: write pypi.org or a preset", presetNames())
	}
	if wild {
		return "*." + n, nil
	}
	return n, nil
}

// parsePin reads "name=ip:port".
func parsePin(raw, name, pin string) ([]Entry, error) {
	if strings.Contains(pin, "=") {
		return nil, entryError(raw, "one pin per entry: write name=ip:port")
	}
	if strings.HasPrefix(name, "*") {
		return nil, entryError(raw, "a pin names one host, not a wildcard: write mirror.example=10.1.2.3:443")
	}
	if strings.Contains(name, ":") {
		return nil, entryError(raw, "the port of a pin goes after the address: write mirror.example=10.1.2.3:443")
	}
	h, err := parseHost(raw, name)
	if err != nil {
		return nil, err
	}
	ap, err := netip.ParseAddrPort(pin)
	if err != nil {
		return nil, entryError(raw, "the pin %q is not ip:port: write mirror.example=10.1.2.3:443 or mirror.example=[fd00::1]:443", pin)
	}
	if ap.Port() == 0 {
		return nil, entryError(raw, "the pin's port must be from 1 to 65535")
	}
	if ap.Addr().Zone() != "" {
		return nil, entryError(raw, "the pin's address must not have a zone")
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if a := ap.Addr(); a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return nil, entryError(raw, "the pin's address %s cannot be dialled: pin the server's address", a)
	}
	return []Entry{{Host: h, Pin: ap, Ports: []uint16{ap.Port()}}}, nil
}

// parseCIDR reads "prefix", "v4prefix:port" or "[v6prefix]:port"; ok says
// the entry is a CIDR (or an IP address) at all.
func parseCIDR(raw, s string) (Entry, bool, error) {
	body, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return Entry{}, true, entryError(raw, "missing ]: write [2001:db8::/32]:443")
		}
		body = s[1:end]
		rest := s[end+1:]
		if rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok {
				return Entry{}, true, entryError(raw, "after ] comes :port: write [2001:db8::/32]:443")
			}
			port = p
		}
	} else if strings.Count(s, ":") == 1 {
		body, port, _ = strings.Cut(s, ":")
	} else if strings.Count(s, ":") > 1 && strings.Contains(s, "]") {
		return Entry{}, true, entryError(raw, "an IPv6 CIDR with a port is written in brackets: [2001:db8::/32]:443")
	}
	var prefix netip.Prefix
	if strings.Contains(body, "/") {
		p, err := netip.ParsePrefix(body)
		if err != nil {
			if looksIP(body) {
				return Entry{}, true, entryError(raw, "not a CIDR (%v): write 203.0.113.0/24 or [2001:db8::/32]:443", err)
			}
			return Entry{}, false, nil
		}
		prefix = p
	} else {
		a, err := netip.ParseAddr(body)
		if err != nil {
			if strings.HasPrefix(s, "[") || strings.Count(body, ":") > 1 {
				return Entry{}, true, entryError(raw, "not an IPv6 address (%v): write [2001:db8::1/128]:443", err)
			}
			return Entry{}, false, nil
		}
		if a.Zone() != "" {
			return Entry{}, true, entryError(raw, "an address with a zone cannot be allowed: write it without %%%s", a.Zone())
		}
		prefix = netip.PrefixFrom(a, a.BitLen())
	}
	if prefix.Addr().Is4In6() && prefix.Bits() >= 96 {
		prefix = netip.PrefixFrom(prefix.Addr().Unmap(), prefix.Bits()-96)
	}
	prefix = prefix.Masked()
	var ports []uint16
	if port != "" {
		p, err := parsePort(raw, port)
		if err != nil {
			return Entry{}, true, err
		}
		ports = joinPorts([]uint16{p}, []uint16{p})
	}
	if r, ok := blockedPrefix(prefix); ok {
		return Entry{}, true, entryError(raw, "%s is %s, which no sandbox reaches: pin a name to the server instead (name=ip:port)", prefix, r)
	}
	return Entry{Prefix: prefix, Ports: ports}, true, nil
}

func looksIP(s string) bool {
	return strings.ContainsAny(s, ":") || strings.Trim(s, "0123456789./") == ""
}

// String is the entry's canonical form for one of its ports, or for its
// default ports; see Allowlist.Strings for every port.
func (e Entry) String() string {
	s := e.strings()
	return strings.Join(s, ",")
}

func (e Entry) strings() []string {
	if e.Pin.IsValid() {
		return []string{e.Host + "=" + e.Pin.String()}
	}
	base := e.Host
	if e.Prefix.IsValid() {
		base = e.Prefix.String()
	}
	if len(e.Ports) == 0 {
		return []string{base}
	}
	var out []string
	ports := e.Ports
	if slices.Contains(ports, 80) && slices.Contains(ports, 443) {
		out = append(out, base)
		ports = slices.DeleteFunc(slices.Clone(ports), func(p uint16) bool { return p == 80 || p == 443 })
	}
	for _, p := range ports {
		if e.Prefix.IsValid() && e.Prefix.Addr().Is6() {
			out = append(out, "["+base+"]:"+strconv.Itoa(int(p)))
		} else {
			out = append(out, base+":"+strconv.Itoa(int(p)))
		}
	}
	return out
}

// Strings is the allowlist's canonical entries: presets by name, then one
// entry per destination and port beyond the defaults.
func (a Allowlist) Strings() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range a.Entries {
		if e.Preset != "" {
			if !seen[e.Preset] {
				seen[e.Preset] = true
				out = append(out, e.Preset)
			}
			continue
		}
		out = append(out, e.strings()...)
	}
	return out
}

// Empty says the allowlist allows nothing.
func (a Allowlist) Empty() bool { return len(a.Entries) == 0 }

// covers says whether the entry's host pattern names the (normalised) name.
func (e Entry) covers(name string) bool {
	if e.Host == "" {
		return false
	}
	if base, ok := strings.CutPrefix(e.Host, "*."); ok {
		return strings.HasSuffix(name, "."+base)
	}
	return e.Host == name
}

func (e Entry) allowsPort(port uint16) bool {
	return slices.Contains(portsOf(e.Ports), port)
}

// AllowsName says whether some entry names the host, on any port: the DNS
// question for it is answered.
func (a Allowlist) AllowsName(name string) bool {
	n, err := NormalizeName(name)
	if err != nil || strings.HasPrefix(n, "*") {
		return false
	}
	for _, e := range a.Entries {
		if e.covers(n) {
			return true
		}
	}
	return false
}

// Match returns the entry that allows a connection to name:port. An entry
// naming the host exactly wins over a wildcard, so a pin is never bypassed
// by a wider entry. The name is normalised here.
func (a Allowlist) Match(name string, port uint16) (Entry, bool) {
	n, err := NormalizeName(name)
	if err != nil {
		return Entry{}, false
	}
	for _, exact := range []bool{true, false} {
		for _, e := range a.Entries {
			if e.Host == "" || strings.HasPrefix(e.Host, "*.") == exact {
				continue
			}
			if e.covers(n) && e.allowsPort(port) {
				return e, true
			}
		}
	}
	return Entry{}, false
}

// MatchAddr says whether a CIDR entry allows a connection to an IP
// literal. An always-blocked address (see Blocked) is never allowed, even
// inside a wider CIDR such as 0.0.0.0/0.
func (a Allowlist) MatchAddr(addr netip.Addr, port uint16) bool {
	addr = addr.Unmap().WithZone("")
	if _, blocked := Blocked(addr, nil); blocked {
		return false
	}
	for _, e := range a.Entries {
		if e.Prefix.IsValid() && e.Prefix.Contains(addr) && e.allowsPort(port) {
			return true
		}
	}
	return false
}

// Narrow returns the entries of a (the policy's list) that a call's
// requested entries select, or an error naming the first one a does not
// cover. A preset is covered if a has it or all its hosts; a host name by
// an entry naming it (the result keeps the entry's pin and ports, or just
// the requested port); a wildcard by the same or a wider wildcard; a CIDR
// by a CIDR containing it; a pin only by the same pin.
func (a Allowlist) Narrow(requested []string) (Allowlist, error) {
	var out Allowlist
	for _, raw := range requested {
		req, err := parseEntry(raw)
		if err != nil {
			return Allowlist{}, err
		}
		preset := strings.ToLower(strings.TrimSpace(raw))
		if _, ok := Presets[preset]; ok && a.hasPreset(preset) {
			for _, e := range a.Entries {
				if e.Preset == preset {
					out.add(e)
				}
			}
			continue
		}
		for _, r := range req {
			got := a.narrowOne(r)
			if len(got) == 0 {
				return Allowlist{}, a.notAllowed(raw)
			}
			for _, e := range got {
				out.add(e)
			}
		}
	}
	if err := out.checkPins(); err != nil {
		return Allowlist{}, err
	}
	return out, nil
}

func (a Allowlist) hasPreset(p string) bool {
	for _, e := range a.Entries {
		if e.Preset == p {
			return true
		}
	}
	return false
}

// narrowOne is what of a one requested entry selects: nil if nothing.
func (a Allowlist) narrowOne(r Entry) []Entry {
	var got []Entry
	for _, e := range a.Entries {
		ports, ok := narrowPorts(e, r)
		if !ok {
			continue
		}
		switch {
		case r.Pin.IsValid():
			if e.Pin == r.Pin && e.Host == r.Host {
				got = append(got, Entry{Host: r.Host, Pin: r.Pin, Ports: r.Ports})
			}
		case r.Prefix.IsValid():
			if e.Prefix.IsValid() && e.Prefix.Bits() <= r.Prefix.Bits() && e.Prefix.Contains(r.Prefix.Addr()) {
				got = append(got, Entry{Prefix: r.Prefix, Ports: ports})
			}
		case strings.HasPrefix(r.Host, "*."):
			if strings.HasPrefix(e.Host, "*.") && (e.Host == r.Host || e.covers(strings.TrimPrefix(r.Host, "*."))) {
				got = append(got, Entry{Host: r.Host, Ports: ports})
			}
		}
	}
	if strings.HasPrefix(r.Host, "*.") && len(got) > 0 {
		// The names pinned below an allowed wildcard stay pinned.
		for _, e := range a.Entries {
			if _, ok := narrowPorts(e, r); ok && e.Pin.IsValid() && r.covers(e.Host) {
				got = append(got, e)
			}
		}
	}
	if r.Pin.IsValid() || r.Prefix.IsValid() || strings.HasPrefix(r.Host, "*.") {
		return got
	}
	// A host name: each port goes where Match would send it, an entry
	// naming the host before a wildcard covering it.
	var claimed []uint16
	for _, exact := range []bool{true, false} {
		for _, e := range a.Entries {
			if e.Host == "" || strings.HasPrefix(e.Host, "*.") == exact || !e.covers(r.Host) {
				continue
			}
			ports, ok := narrowPorts(e, r)
			if !ok {
				continue
			}
			free := slices.DeleteFunc(slices.Clone(portsOf(ports)), func(p uint16) bool { return slices.Contains(claimed, p) })
			if len(free) == 0 {
				continue
			}
			claimed = append(claimed, free...)
			got = append(got, Entry{Host: r.Host, Pin: e.Pin, Ports: joinPorts(free, free)})
		}
	}
	return got
}

// narrowPorts is the ports a request r selects of the entry e: e's ports
// when r names none, else r's port if e allows it.
func narrowPorts(e, r Entry) ([]uint16, bool) {
	if len(r.Ports) == 0 && !r.Pin.IsValid() {
		return e.Ports, true
	}
	var ports []uint16
	for _, p := range portsOf(r.Ports) {
		if e.allowsPort(p) {
			ports = append(ports, p)
		}
	}
	if len(ports) == 0 {
		return nil, false
	}
	return joinPorts(ports, ports), true
}

func (a Allowlist) notAllowed(raw string) error {
	if a.Empty() {
		return fmt.Errorf("network entry %q is not allowed here: this server allows no network (the operator allows destinations with --allow-net)", raw)
	}
	return fmt.Errorf("network entry %q is not allowed here; allowed: %s", raw, strings.Join(a.Strings(), ", "))
}
