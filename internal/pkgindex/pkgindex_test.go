package pkgindex_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/internal/pkgindex"
)

// client trusts only the server's CA and reaches it under any name.
func client(t *testing.T, s *pkgindex.Server) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(s.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("CAFile holds no certificate")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, s.Addr())
	}
	return &http.Client{Transport: tr}
}

func get(t *testing.T, c *http.Client, u string) []byte {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	return b
}

func start(t *testing.T) *pkgindex.Server {
	t.Helper()
	s, err := pkgindex.Start(pkgindex.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSimpleIndexWheels(t *testing.T) {
	s := start(t)
	c := client(t, s)
	root := string(get(t, c, s.PipIndexURL("pypi.test")))
	for _, n := range []string{"tinypkg", "otherpkg"} {
		if !strings.Contains(root, `href="`+n+`/"`) {
			t.Errorf("/simple/ lacks %s: %s", n, root)
		}
	}
	page := s.PipIndexURL("pypi.test") + "tinypkg/"
	body := string(get(t, c, page))
	links := regexp.MustCompile(`href="([^"#]+)#sha256=([0-9a-f]{64})"`).FindAllStringSubmatch(body, -1)
	if len(links) != 2 {
		t.Fatalf("tinypkg page has %d links, want 2: %s", len(links), body)
	}
	base, _ := url.Parse(page)
	for i, want := range []string{"1.0.0", "2.0.0"} {
		u, _ := base.Parse(links[i][1])
		whl := get(t, c, u.String())
		if sum := sha256.Sum256(whl); hex.EncodeToString(sum[:]) != links[i][2] {
			t.Errorf("%s: sha256 differs from the link's", u)
		}
		checkWheel(t, whl, "tinypkg", want)
	}
}

// checkWheel checks what pip checks: the RECORD's hashes and the version.
func checkWheel(t *testing.T, whl []byte, pkg, version string) {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(whl), int64(len(whl)))
	if err != nil {
		t.Fatalf("wheel is no zip: %v", err)
	}
	files := map[string]string{}
	for _, f := range zr.File {
		r, _ := f.Open()
		b, _ := io.ReadAll(r)
		r.Close()
		files[f.Name] = string(b)
	}
	info := pkg + "-" + version + ".dist-info/"
	if got := files[pkg+"/__init__.py"]; !strings.Contains(got, `__version__ = "`+version+`"`) {
		t.Errorf("__init__.py = %q", got)
	}
	if !strings.Contains(files[info+"METADATA"], "Version: "+version) || !strings.Contains(files[info+"WHEEL"], "Root-Is-Purelib: true") {
		t.Errorf("METADATA/WHEEL wrong: %q %q", files[info+"METADATA"], files[info+"WHEEL"])
	}
	rows := strings.Split(strings.TrimSpace(files[info+"RECORD"]), "\n")
	if len(rows) != len(files) {
		t.Errorf("RECORD has %d rows for %d files", len(rows), len(files))
	}
	for _, row := range rows {
		f := strings.Split(row, ",")
		if f[0] == info+"RECORD" {
			continue
		}
		sum := sha256.Sum256([]byte(files[f[0]]))
		if want := "sha256=" + base64.RawURLEncoding.EncodeToString(sum[:]); f[1] != want {
			t.Errorf("RECORD %s: hash %s, want %s", f[0], f[1], want)
		}
	}
}

func TestSimpleIndexNormalizes(t *testing.T) {
	s := start(t)
	c := client(t, s)
	body := string(get(t, c, s.PipIndexURL("pypi.test")+"TinyPkg/"))
	if !strings.Contains(body, "tinypkg-1.0.0-py3-none-any.whl") {
		t.Errorf("redirected page: %s", body)
	}
	resp, err := c.Get(s.PipIndexURL("pypi.test") + "nosuch/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown package: %s, want 404", resp.Status)
	}
}

func TestNPMRegistry(t *testing.T) {
	s := start(t)
	c := client(t, s)
	var doc struct {
		DistTags map[string]string `json:"dist-tags"`
		Versions map[string]struct {
			Dist struct{ Tarball, Integrity, Shasum string }
		}
	}
	if err := json.Unmarshal(get(t, c, s.NPMRegistry("npm.test")+"tiny-npm"), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.DistTags["latest"] != "1.0.0" {
		t.Errorf("dist-tags = %v", doc.DistTags)
	}
	d := doc.Versions["1.0.0"].Dist
	if want := s.NPMRegistry("npm.test") + "tiny-npm/-/tiny-npm-1.0.0.tgz"; d.Tarball != want {
		t.Errorf("tarball %q, want %q (through the name the client used)", d.Tarball, want)
	}
	tgz := get(t, c, d.Tarball)
	sum := sha512.Sum512(tgz)
	if want := "sha512-" + base64.StdEncoding.EncodeToString(sum[:]); d.Integrity != want {
		t.Errorf("integrity %s, want %s", d.Integrity, want)
	}
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "package/package.json package/index.js" {
		t.Errorf("tarball holds %q", names)
	}
}

func TestRequestsRecorded(t *testing.T) {
	s := start(t)
	c := client(t, s)
	get(t, c, s.PipIndexURL("pypi.test")+"tinypkg/")
	get(t, c, s.NPMRegistry("npm.test")+"tiny-npm")
	if !s.Fetched("tinypkg") || !s.Fetched("tiny-npm") {
		t.Errorf("Fetched misses a request: %v", s.Requests())
	}
	if s.Fetched("otherpkg") {
		t.Errorf("Fetched(otherpkg) with no request for it: %v", s.Requests())
	}
	r := s.Requests()
	if len(r) != 2 || r[0].Host != "pypi.test:"+strconv.Itoa(s.Port()) || r[0].Path != "/simple/tinypkg/" || r[0].Status != 200 {
		t.Errorf("Requests() = %+v", r)
	}
}

func TestCertificateNames(t *testing.T) {
	s := start(t)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CAPEM())
	for _, tt := range []struct {
		name string
		ok   bool
	}{{"pypi.test", true}, {"npm.test", true}, {"127.0.0.1", true}, {"evil.test", false}} {
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{RootCAs: pool, ServerName: tt.name})
		if conn != nil {
			conn.Close()
		}
		if (err == nil) != tt.ok {
			t.Errorf("TLS as %s: err %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}
