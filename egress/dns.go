package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// DNSTTL is the time to live of an answer, in seconds: short, so that a
// program keeps asking the helper rather than a cache of its own.
const DNSTTL = 5

// MaxDNSQuery is the largest query AnswerDNS reads (EDNS's usual payload
// size); a bigger datagram is no query a resolver sends.
const MaxDNSQuery = 4096

// AnswerDNS answers one DNS query from the sandbox. lookup is asked for
// the question's name, normalised (see NormalizeName): false means the
// name is not allowed, answered NXDOMAIN; true gives the address of an A
// answer (TTL DNSTTL). An allowed name's AAAA and other questions get an
// empty NOERROR answer, so that resolvers fall back to IPv4 at once. name
// is the question's name (normalised when it is a valid host name) and ok
// says it was allowed; a name that is no host name comes back with its
// unprintable bytes escaped. A query that cannot be read, or a response, gets
// an error and no reply; a query of another opcode, class or more than
// one question gets a reply with an error code and ok false.
func AnswerDNS(query []byte, lookup func(name string) (netip.Addr, bool)) (reply []byte, name string, ok bool, err error) {
	if len(query) > MaxDNSQuery {
		return nil, "", false, fmt.Errorf("dns query of %d bytes (at most %d)", len(query), MaxDNSQuery)
	}
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, "", false, fmt.Errorf("dns query: %w", err)
	}
	if h.Response {
		return nil, "", false, errors.New("dns message is a response, not a query")
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil, "", false, fmt.Errorf("dns query: %w", err)
	}
	rh := dnsmessage.Header{
		ID:                 h.ID,
		Response:           true,
		OpCode:             h.OpCode,
		Authoritative:      true,
		RecursionDesired:   h.RecursionDesired,
		RecursionAvailable: true,
	}
	switch {
	case h.OpCode != 0:
		rh.RCode = dnsmessage.RCodeNotImplemented
		return buildDNS(rh, nil, nil)
	case len(qs) != 1:
		rh.RCode = dnsmessage.RCodeFormatError
		return buildDNS(rh, nil, nil)
	}
	q := qs[0]
	raw := strings.TrimSuffix(q.Name.String(), ".")
	name, nerr := NormalizeName(raw)
	if nerr != nil {
		name = printable(strings.ToLower(raw))
	}
	if q.Class != dnsmessage.ClassINET {
		rh.RCode = dnsmessage.RCodeRefused
		reply, _, _, err := buildDNS(rh, &q, nil)
		return reply, name, false, err
	}
	var addr netip.Addr
	if nerr == nil {
		addr, ok = lookup(name)
	}
	if !ok {
		rh.RCode = dnsmessage.RCodeNameError
		reply, _, _, err := buildDNS(rh, &q, nil)
		return reply, name, false, err
	}
	var answer *dnsmessage.AResource
	if q.Type == dnsmessage.TypeA && addr.Unmap().Is4() {
		answer = &dnsmessage.AResource{A: addr.Unmap().As4()}
	}
	reply, _, _, err = buildDNS(rh, &q, answer)
	return reply, name, err == nil, err
}

// buildDNS writes a reply: the header, the question echoed, an A answer.
func buildDNS(h dnsmessage.Header, q *dnsmessage.Question, a *dnsmessage.AResource) ([]byte, string, bool, error) {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	if q != nil {
		if err := b.StartQuestions(); err != nil {
			return nil, "", false, fmt.Errorf("dns reply: %w", err)
		}
		if err := b.Question(*q); err != nil {
			return nil, "", false, fmt.Errorf("dns reply: %w", err)
		}
	}
	if a != nil {
		if err := b.StartAnswers(); err != nil {
			return nil, "", false, fmt.Errorf("dns reply: %w", err)
		}
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: DNSTTL}
		if err := b.AResource(rh, *a); err != nil {
			return nil, "", false, fmt.Errorf("dns reply: %w", err)
		}
	}
	reply, err := b.Finish()
	if err != nil {
		return nil, "", false, fmt.Errorf("dns reply: %w", err)
	}
	return reply, "", false, nil
}

// printable is a name that is no host name, fit for a record and the
// message a model reads: bytes other than printable ASCII as \xNN.
func printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c > ' ' && c < 0x7f && c != '\\' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "\\x%02x", c)
		}
	}
	return b.String()
}
