package egress

import (
	"errors"
	"fmt"
)

// maxTLSRecord is the largest plaintext TLS record (RFC 8446 5.1), the
// most ParseSNI reads: the ClientHello must fit in the first record.
const maxTLSRecord = 1 << 14

// ParseSNI reads the server name of a TLS ClientHello, the first bytes a
// client sends. complete false means b is a valid beginning and more bytes
// are needed; name "" with complete true means the ClientHello names no
// server. The name is normalised (see NormalizeName), so that a trailing
// dot, upper case or a Unicode spelling gets the name's decision. A ClientHello must
// fit in the first TLS record (16 KiB, as every client sends it); anything
// else, a repeated extension or an invalid name is an error.
func ParseSNI(b []byte) (name string, complete bool, err error) {
	if len(b) >= 1 && b[0] != 0x16 {
		return "", false, fmt.Errorf("not a TLS handshake (first byte %#02x)", b[0])
	}
	if len(b) >= 2 && b[1] != 3 {
		return "", false, fmt.Errorf("not a TLS record (version %#02x)", b[1])
	}
	if len(b) < 5 {
		return "", false, nil
	}
	n := int(b[3])<<8 | int(b[4])
	if n > maxTLSRecord {
		return "", false, fmt.Errorf("TLS record of %d bytes (at most %d)", n, maxTLSRecord)
	}
	if n < 4 {
		return "", false, errors.New("TLS record too short for a handshake")
	}
	rec := b[5:]
	if len(rec) >= 1 && rec[0] != 1 {
		return "", false, fmt.Errorf("TLS handshake of type %d, not a ClientHello", rec[0])
	}
	if len(rec) < n {
		if len(rec) >= 4 && int(rec[1])<<16|int(rec[2])<<8|int(rec[3]) > n-4 {
			return "", false, errors.New("TLS ClientHello spans several records")
		}
		return "", false, nil
	}
	rec = rec[:n]
	hl := int(rec[1])<<16 | int(rec[2])<<8 | int(rec[3])
	if hl > n-4 {
		return "", false, errors.New("TLS ClientHello spans several records")
	}
	name, err = clientHelloSNI(cursor(rec[4 : 4+hl]))
	if err != nil {
		return "", false, fmt.Errorf("TLS ClientHello: %w", err)
	}
	return name, true, nil
}

// cursor reads a TLS structure front to back.
type cursor []byte

var errShort = errors.New("truncated")

func (c *cursor) skip(n int) bool {
	if n > len(*c) {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) u8() (int, bool) {
	if len(*c) < 1 {
		return 0, false
	}
	v := int((*c)[0])
	*c = (*c)[1:]
	return v, true
}

func (c *cursor) u16() (int, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := int((*c)[0])<<8 | int((*c)[1])
	*c = (*c)[2:]
	return v, true
}

// vec reads a vector whose length is an n-byte prefix (n is 1 or 2).
func (c *cursor) vec(n int) (cursor, bool) {
	var l int
	var ok bool
	if n == 1 {
		l, ok = c.u8()
	} else {
		l, ok = c.u16()
	}
	if !ok || l > len(*c) {
		return nil, false
	}
	v := (*c)[:l]
	*c = (*c)[l:]
	return v, true
}

// item reads a type of typeLen bytes and a vector of a 2-byte length:
// an extension, a server name.
func (c *cursor) item(typeLen int) (int, cursor, bool) {
	var typ int
	var ok bool
	if typeLen == 1 {
		typ, ok = c.u8()
	} else {
		typ, ok = c.u16()
	}
	if !ok {
		return 0, nil, false
	}
	v, ok := c.vec(2)
	return typ, v, ok
}

func clientHelloSNI(c cursor) (string, error) {
	if !c.skip(2 + 32) { // legacy_version, random
		return "", errShort
	}
	if sid, ok := c.vec(1); !ok || len(sid) > 32 {
		return "", errors.New("bad session id")
	}
	if cs, ok := c.vec(2); !ok || len(cs) == 0 || len(cs)%2 != 0 {
		return "", errors.New("bad cipher suites")
	}
	if cm, ok := c.vec(1); !ok || len(cm) == 0 {
		return "", errors.New("bad compression methods")
	}
	if len(c) == 0 {
		return "", nil // no extensions
	}
	exts, ok := c.vec(2)
	if !ok || len(c) != 0 {
		return "", errors.New("bad extensions")
	}
	seen := map[int]bool{}
	name := ""
	for len(exts) > 0 {
		typ, data, ok := exts.item(2)
		if !ok {
			return "", errShort
		}
		if seen[typ] {
			return "", fmt.Errorf("extension %d repeated", typ)
		}
		seen[typ] = true
		if typ != 0 { // server_name
			continue
		}
		n, err := serverName(data)
		if err != nil {
			return "", err
		}
		name = n
	}
	return name, nil
}

// serverName reads the server_name extension (RFC 6066 3): one host_name.
func serverName(data cursor) (string, error) {
	list, ok := data.vec(2)
	if !ok || len(data) != 0 || len(list) == 0 {
		return "", errors.New("bad server_name extension")
	}
	name := ""
	for len(list) > 0 {
		typ, n, ok := list.item(1)
		if !ok {
			return "", errShort
		}
		if typ != 0 {
			return "", fmt.Errorf("server_name of type %d", typ)
		}
		if name != "" {
			return "", errors.New("more than one server name")
		}
		// RFC 6066 wants an ASCII name without a trailing dot; a client
		// sending another spelling of the name gets the name's decision.
		norm, err := NormalizeName(string(n))
		if err != nil {
			return "", fmt.Errorf("server name: %w", err)
		}
		name = norm
	}
	return name, nil
}
