// Package pkgindex is test support: a PEP 503 simple index and an npm
// registry, served over HTTPS on loopback with a test CA it generates.
//
// It has a home of its own because the tests of three packages use it (the
// engine's installs, cmd/safe-run's integration and threat tests): they need
// real pip and npm, inside real sandboxes, to install from a server the test
// controls and can inspect afterwards — every request is recorded, so a test
// can assert that a refused package was never fetched. The wheels and
// tarballs are built here, in memory, so no test needs the internet.
package pkgindex

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// Wheel is a pure-Python distribution the index serves as a wheel.
type Wheel struct {
	Name    string // distribution name, e.g. "tinypkg"
	Version string // e.g. "1.0.0"
	// Files are extra files of the wheel, relative to site-packages; the
	// package's __init__.py (with __version__) is always there unless Files
	// names it.
	Files map[string]string
}

// NPMPackage is a package the registry serves as a tarball.
type NPMPackage struct {
	Name    string // e.g. "tiny-npm"
	Version string // e.g. "1.0.0"
	// IndexJS is package/index.js; empty gives one exporting the version.
	IndexJS string
}

// DefaultWheels are the wheels of a zero Config.
var DefaultWheels = []Wheel{
	{Name: "tinypkg", Version: "1.0.0"},
	{Name: "tinypkg", Version: "2.0.0"},
	{Name: "otherpkg", Version: "1.0.0"},
}

// DefaultNPM are the npm packages of a zero Config.
var DefaultNPM = []NPMPackage{
	{Name: "tiny-npm", Version: "1.0.0"},
}

// DefaultNames are the names the certificate of a zero Config covers.
var DefaultNames = []string{"pypi.test", "npm.test", "localhost", "127.0.0.1"}

// Config says what a Server serves; zero fields take the defaults.
type Config struct {
	// Names are the DNS names and IP addresses the server certificate is
	// valid for.
	Names  []string
	Wheels []Wheel
	NPM    []NPMPackage
}

// Request is one request the server received.
type Request struct {
	Method string
	Host   string // the Host header, port included
	Path   string
	Status int
}

// Server is a running index and registry.
type Server struct {
	dir      string
	ca       *authority
	listener net.Listener
	srv      *http.Server
	files    map[string][]byte     // /packages/<file> and /<npm name>/-/<file>
	simple   map[string][]fileLink // normalised name → its wheels
	npm      map[string][]npmVersion

	mu       sync.Mutex
	requests []Request
}

type fileLink struct {
	file   string
	sha256 string
}

type npmVersion struct {
	pkg       NPMPackage
	file      string
	integrity string
	shasum    string
}

// Start builds the packages, writes the CA into a new temporary directory
// and serves on 127.0.0.1 at a free port until Close.
func Start(cfg Config) (*Server, error) {
	if len(cfg.Names) == 0 {
		cfg.Names = DefaultNames
	}
	if cfg.Wheels == nil {
		cfg.Wheels = DefaultWheels
	}
	if cfg.NPM == nil {
		cfg.NPM = DefaultNPM
	}
	s := &Server{files: map[string][]byte{}, simple: map[string][]fileLink{}, npm: map[string][]npmVersion{}}
	for _, w := range cfg.Wheels {
		file, data, err := BuildWheel(w)
		if err != nil {
			return nil, err
		}
		s.files["/packages/"+file] = data
		sum := sha256.Sum256(data)
		n := Normalize(w.Name)
		s.simple[n] = append(s.simple[n], fileLink{file: file, sha256: hex.EncodeToString(sum[:])})
	}
	for _, p := range cfg.NPM {
		data, err := BuildTarball(p)
		if err != nil {
			return nil, err
		}
		file := fmt.Sprintf("%s-%s.tgz", npmBase(p.Name), p.Version)
		s.files["/"+p.Name+"/-/"+file] = data
		s512 := sha512.Sum512(data)
		s1 := sha1.Sum(data)
		s.npm[p.Name] = append(s.npm[p.Name], npmVersion{pkg: p, file: file,
			integrity: "sha512-" + base64.StdEncoding.EncodeToString(s512[:]), shasum: hex.EncodeToString(s1[:])})
	}
	ca, err := newAuthority(cfg.Names)
	if err != nil {
		return nil, err
	}
	s.ca = ca
	s.dir, err = os.MkdirTemp("", "pkgindex-")
	if err != nil {
		return nil, fmt.Errorf("pkgindex: %w", err)
	}
	// Readable by all: sandboxes and the tests' unprivileged users read it.
	if err := os.Chmod(s.dir, 0o755); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("pkgindex: %w", err)
	}
	if err := os.WriteFile(s.CAFile(), ca.caPEM, 0o644); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("pkgindex: write CA: %w", err)
	}
	s.listener, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("pkgindex: listen: %w", err)
	}
	s.srv = &http.Server{Handler: s, TLSConfig: ca.serverTLS(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.ServeTLS(s.listener, "", "") }()
	return s, nil
}

func (s *Server) cleanup() { os.RemoveAll(s.dir) }

// Close stops the server and removes its CA file.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.cleanup()
	return err
}

// CAFile is a PEM file of the CA that signed the server's certificate, for
// --net-ca, pip's --cert or NODE_EXTRA_CA_CERTS.
func (s *Server) CAFile() string { return filepath.Join(s.dir, "ca.pem") }

// CAPEM is the content of CAFile.
func (s *Server) CAPEM() []byte { return bytes.Clone(s.ca.caPEM) }

// Addr is the host:port the server listens on (127.0.0.1:PORT).
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Port is the port the server listens on.
func (s *Server) Port() int { return s.listener.Addr().(*net.TCPAddr).Port }

// PipIndexURL is the simple index's URL through host, e.g. PipIndexURL("pypi.test")
// is https://pypi.test:PORT/simple/.
func (s *Server) PipIndexURL(host string) string {
	return fmt.Sprintf("https://%s/simple/", net.JoinHostPort(host, fmt.Sprint(s.Port())))
}

// NPMRegistry is the registry's URL through host, e.g. https://npm.test:PORT/.
func (s *Server) NPMRegistry(host string) string {
	return fmt.Sprintf("https://%s/", net.JoinHostPort(host, fmt.Sprint(s.Port())))
}

// Pin is the allowlist entry that reaches the server by name, e.g.
// "pypi.test=127.0.0.1:PORT".
func (s *Server) Pin(name string) string { return name + "=" + s.Addr() }

// Requests returns every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Fetched reports whether any request asked for name (a wheel's or an npm
// package's): its index page, its document or its files.
func (s *Server) Fetched(name string) bool {
	n := Normalize(name)
	for _, r := range s.Requests() {
		p := strings.TrimPrefix(r.Path, "/")
		parts := strings.Split(strings.Trim(p, "/"), "/")
		switch {
		case len(parts) >= 2 && parts[0] == "simple" && Normalize(parts[1]) == n:
			return true
		case len(parts) == 2 && parts[0] == "packages" && Normalize(strings.SplitN(parts[1], "-", 2)[0]) == n:
			return true
		case p == name || strings.HasPrefix(p, name+"/-/"):
			return true
		}
	}
	return false
}

// ServeHTTP answers the index's and the registry's requests.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	s.serve(rec, r)
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Host: r.Host, Path: r.URL.Path, Status: rec.status})
	s.mu.Unlock()
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if data, ok := s.files[p]; ok {
		ct := "application/octet-stream"
		if strings.HasSuffix(p, ".tgz") {
			ct = "application/gzip"
		}
		w.Header().Set("Content-Type", ct)
		w.Write(data)
		return
	}
	switch {
	case p == "/simple/" || p == "/simple":
		s.serveSimpleRoot(w)
	case strings.HasPrefix(p, "/simple/"):
		s.serveSimple(w, r, strings.Trim(strings.TrimPrefix(p, "/simple/"), "/"))
	default:
		s.serveNPM(w, r, strings.TrimPrefix(p, "/"))
	}
}

func (s *Server) serveSimpleRoot(w http.ResponseWriter) {
	names := make([]string, 0, len(s.simple))
	for n := range s.simple {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html><body>\n")
	for _, n := range names {
		fmt.Fprintf(&b, "<a href=\"%s/\">%s</a>\n", html.EscapeString(n), html.EscapeString(n))
	}
	b.WriteString("</body></html>\n")
	w.Header().Set("Content-Type", "text/html")
	writeString(w, b.String())
}

func (s *Server) serveSimple(w http.ResponseWriter, r *http.Request, name string) {
	n := Normalize(name)
	if n != name {
		// PEP 503: redirect to the normalised name.
		http.Redirect(w, r, "/simple/"+n+"/", http.StatusMovedPermanently)
		return
	}
	links, ok := s.simple[n]
	if !ok {
		http.NotFound(w, r)
		return
	}
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html><body>\n")
	for _, l := range links {
		fmt.Fprintf(&b, "<a href=\"../../packages/%s#sha256=%s\">%s</a>\n", html.EscapeString(l.file), l.sha256, html.EscapeString(l.file))
	}
	b.WriteString("</body></html>\n")
	w.Header().Set("Content-Type", "text/html")
	writeString(w, b.String())
}

func (s *Server) serveNPM(w http.ResponseWriter, r *http.Request, name string) {
	name = strings.ReplaceAll(name, "%2f", "/")
	name = strings.ReplaceAll(name, "%2F", "/")
	versions, ok := s.npm[name]
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		writeString(w, `{"error":"Not found"}`)
		return
	}
	type dist struct {
		Tarball   string `json:"tarball"`
		Integrity string `json:"integrity"`
		Shasum    string `json:"shasum"`
	}
	type version struct {
		Name    string `json:"name"`
		Version string `json:"version"`
		Main    string `json:"main"`
		Dist    dist   `json:"dist"`
	}
	doc := struct {
		Name     string             `json:"name"`
		DistTags map[string]string  `json:"dist-tags"`
		Versions map[string]version `json:"versions"`
	}{Name: name, DistTags: map[string]string{}, Versions: map[string]version{}}
	for _, v := range versions {
		// The tarball is reached the way the document was: through the
		// name the client used, which is what its allowlist pinned.
		url := fmt.Sprintf("https://%s/%s/-/%s", r.Host, name, v.file)
		doc.Versions[v.pkg.Version] = version{Name: name, Version: v.pkg.Version, Main: "index.js",
			Dist: dist{Tarball: url, Integrity: v.integrity, Shasum: v.shasum}}
		doc.DistTags["latest"] = v.pkg.Version
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(doc)
}

func writeString(w http.ResponseWriter, s string) { _, _ = w.Write([]byte(s)) }

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

var normalizeRE = regexp.MustCompile(`[-_.]+`)

// Normalize is a distribution name as PEP 503 compares it.
func Normalize(name string) string {
	return strings.ToLower(normalizeRE.ReplaceAllString(name, "-"))
}

// npmBase is the tarball's base name of an npm package (a scope dropped).
func npmBase(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[i+1:]
	}
	return name
}

// BuildWheel builds w as a py3-none-any wheel and returns its file name.
func BuildWheel(w Wheel) (file string, data []byte, err error) {
	dist := strings.ReplaceAll(normalizeRE.ReplaceAllString(w.Name, "_"), "-", "_")
	pkg := strings.ToLower(dist)
	info := fmt.Sprintf("%s-%s.dist-info", dist, w.Version)
	files := map[string]string{
		pkg + "/__init__.py": fmt.Sprintf("__version__ = %q\n", w.Version),
	}
	for k, v := range w.Files {
		files[k] = v
	}
	files[info+"/METADATA"] = fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: a test package of safe-run's pkgindex\n", w.Name, w.Version)
	files[info+"/WHEEL"] = "Wheel-Version: 1.0\nGenerator: safe-run-pkgindex\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
	names := make([]string, 0, len(files))
	for k := range files {
		names = append(names, k)
	}
	sort.Strings(names)
	var record strings.Builder
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, n := range names {
		sum := sha256.Sum256([]byte(files[n]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(sum[:]), len(files[n]))
		if err := addZip(zw, n, files[n]); err != nil {
			return "", nil, err
		}
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", info)
	if err := addZip(zw, info+"/RECORD", record.String()); err != nil {
		return "", nil, err
	}
	if err := zw.Close(); err != nil {
		return "", nil, fmt.Errorf("build wheel %s: %w", w.Name, err)
	}
	return fmt.Sprintf("%s-%s-py3-none-any.whl", dist, w.Version), buf.Bytes(), nil
}

func addZip(zw *zip.Writer, name, content string) error {
	h := &zip.FileHeader{Name: name, Method: zip.Deflate, Modified: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.SetMode(0o644)
	f, err := zw.CreateHeader(h)
	if err != nil {
		return fmt.Errorf("build wheel: %w", err)
	}
	_, err = f.Write([]byte(content))
	return err
}

// BuildTarball builds p as an npm package tarball (.tgz).
func BuildTarball(p NPMPackage) ([]byte, error) {
	pj, err := json.MarshalIndent(map[string]string{"name": p.Name, "version": p.Version, "main": "index.js"}, "", "  ")
	if err != nil {
		return nil, err
	}
	index := p.IndexJS
	if index == "" {
		index = fmt.Sprintf("module.exports = { version: %q };\n", p.Version)
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, data string }{{"package/package.json", string(pj) + "\n"}, {"package/index.js", index}} {
		h := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("build tarball %s: %w", p.Name, err)
		}
		if _, err := tw.Write([]byte(f.data)); err != nil {
			return nil, fmt.Errorf("build tarball %s: %w", p.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("build tarball %s: %w", p.Name, err)
	}
	if err := gz.Close(); err != nil {
		return nil, fmt.Errorf("build tarball %s: %w", p.Name, err)
	}
	return buf.Bytes(), nil
}
