package egress

import "testing"

func TestLogOpen(t *testing.T) {
	var l Log
	l.Add(Connection{ID: 1, Kind: KindTCP, Decision: Allowed, Open: true})
	l.Add(Connection{ID: 2, Kind: KindDNS, Decision: Denied})
	if n := l.Open(); n != 1 {
		t.Fatalf("Open = %d, want 1", n)
	}
	l.Add(Connection{ID: 1, Kind: KindTCP, Decision: Allowed, BytesIn: 5})
	if n := l.Open(); n != 0 {
		t.Fatalf("Open after the close record = %d, want 0", n)
	}
}
