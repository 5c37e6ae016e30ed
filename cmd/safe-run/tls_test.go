package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// newTestPair makes a CA and the paths of a certificate and key below a
// temporary directory, for ca.issue.
func newTestPair(t *testing.T) (ca *testCA, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	return newTestCA(t, "safe-run test CA"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
}

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(ca.pem)
	return p
}

// issue writes a server certificate for 127.0.0.1 and localhost, with
// serial, to certFile and keyFile.
func (ca *testCA) issue(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "safe-run test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
}

// writeFile replaces name by a rename, as certificate tools do, so that a
// reader never sees half a file.
func writeFile(t *testing.T, name string, data []byte, mode os.FileMode) {
	t.Helper()
	tmp := name + ".new"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

// tlsServer serves "ok" over t's secure listener on 127.0.0.1 and returns
// its address.
func tlsServer(t *testing.T, flags tlsFlags) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := flags.secure(ctx, raw, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ErrorLog: nil}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// servedSerial is the serial number of the certificate addr presents to a
// client trusting pool, or the handshake's error.
func servedSerial(addr string, pool *x509.CertPool) (int64, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

func TestTLSHandshakeAndRefusals(t *testing.T) {
	ca, cert, key := newTestPair(t)
	ca.issue(t, 10, cert, key)
	addr := tlsServer(t, tlsFlags{cert: cert, key: key})

	// A client trusting the CA gets through and is served.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}}}
	resp, err := client.Get("https://" + addr + "/")
	if err != nil {
		t.Fatalf("a client trusting the CA: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" || resp.TLS == nil {
		t.Errorf("served %q over TLS %v; want ok over TLS", body, resp.TLS != nil)
	}

	// A client that trusts another CA refuses the certificate.
	if _, err := servedSerial(addr, newTestCA(t, "another CA").pool()); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client not trusting the CA: %v; want unknown authority", err)
	}

	// Plain HTTP to the TLS port is answered 400 and nothing is served.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	plain, _ := io.ReadAll(bufio.NewReader(conn))
	if !strings.HasPrefix(string(plain), "HTTP/1.0 400") || strings.Contains(string(plain), "ok") {
		t.Errorf("plain HTTP to the TLS port got %q; want a 400 and nothing served", plain)
	}
}

func TestTLSReload(t *testing.T) {
	ca, cert, key := newTestPair(t)
	ca.issue(t, 1, cert, key)
	addr := tlsServer(t, tlsFlags{cert: cert, key: key})
	steps := []struct {
		name   string
		change func()
		want   int64
	}{
		{"unchanged", func() {}, 1},
		{"files replaced", func() { ca.issue(t, 2, cert, key) }, 2},
		{"a certificate that is not PEM keeps the old one", func() { writeFile(t, cert, []byte("not a certificate"), 0o644) }, 2},
		{"a key of another certificate keeps the old one", func() {
			other := filepath.Join(filepath.Dir(cert), "other")
			ca.issue(t, 3, other+".pem", other+".key")
			data, _ := os.ReadFile(other + ".key")
			ca.issue(t, 4, cert, key)
			writeFile(t, key, data, 0o600)
		}, 2},
		{"a good pair again", func() { ca.issue(t, 5, cert, key) }, 5},
	}
	for _, s := range steps {
		s.change()
		got, err := servedSerial(addr, ca.pool())
		if err != nil || got != s.want {
			t.Errorf("%s: served serial %d (%v); want %d", s.name, got, err, s.want)
		}
	}
}

// TestTLSReloadOnSIGHUP: a change stat cannot see (same inode, size and
// time) is picked up when the process gets SIGHUP.
func TestTLSReloadOnSIGHUP(t *testing.T) {
	ca, cert, key := newTestPair(t)
	ca.issue(t, 1, cert, key)
	addr := tlsServer(t, tlsFlags{cert: cert, key: key})
	// Write the new pair in place and put back the old times, so that only
	// the signal can tell: a new pair of the same sizes (ECDSA signatures
	// vary by a byte or two; P-256 keys do not).
	sameSize := func(a, b string) bool {
		sa, errA := os.Stat(a)
		sb, errB := os.Stat(b)
		return errA == nil && errB == nil && sa.Size() == sb.Size()
	}
	for i := 0; ; i++ {
		ca.issue(t, 2, cert+".2", key+".2")
		if sameSize(cert, cert+".2") && sameSize(key, key+".2") {
			break
		}
		if i == 100 {
			t.Fatal("no new certificate of the old one's size in 100 tries")
		}
	}
	for _, f := range []string{cert, key} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(f + ".2")
		if err := os.WriteFile(f, data, st.Mode()); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := servedSerial(addr, ca.pool()); got != 1 {
		t.Fatalf("before SIGHUP served serial %d; want 1 (the change was visible to stat)", got)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := servedSerial(addr, ca.pool())
		if got == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGHUP served serial %d (%v); want 2", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestTLSSettingsRefused(t *testing.T) {
	ca, cert, key := newTestPair(t)
	ca.issue(t, 1, cert, key)
	tests := []struct {
		name    string
		addr    string
		flags   tlsFlags
		wantErr string
	}{
		{"loopback, plain", "127.0.0.1:0", tlsFlags{}, ""},
		{"beyond loopback, plain", "0.0.0.0:0", tlsFlags{}, "without TLS; give --tls-cert and --tls-key, or --insecure-http"},
		{"beyond loopback, --insecure-http", "0.0.0.0:0", tlsFlags{insecureHTTP: true}, ""},
		{"beyond loopback, TLS", "0.0.0.0:0", tlsFlags{cert: cert, key: key}, ""},
		{"certificate without key", "127.0.0.1:0", tlsFlags{cert: cert}, "--tls-cert and --tls-key go together"},
		{"key without certificate", "127.0.0.1:0", tlsFlags{key: key}, "--tls-cert and --tls-key go together"},
		{"missing files", "127.0.0.1:0", tlsFlags{cert: cert + ".no", key: key}, "give a PEM certificate and its private key"},
		{"key and certificate swapped", "127.0.0.1:0", tlsFlags{cert: key, key: cert}, "give a PEM certificate and its private key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			l, err := tt.flags.secure(context.Background(), raw, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err %v; want one containing %q", err, tt.wantErr)
			}
			if l != nil {
				t.Errorf("a listener was returned with the error")
			}
		})
	}
}
