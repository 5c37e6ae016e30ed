package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// tlsFlags are serve's settings for TLS on the HTTP listener: a server
// others can reach should not take bearer tokens in the clear.
type tlsFlags struct {
	cert, key    string
	insecureHTTP bool
}

func (t *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.cert, "tls-cert", "", "serve HTTPS with this PEM certificate `file` (chain included); reloaded on SIGHUP and when it changes")
	fs.StringVar(&t.key, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.BoolVar(&t.insecureHTTP, "insecure-http", false, "allow plain HTTP on a non-loopback address (tokens and code cross the network in the clear)")
}

// scheme is the URL scheme the listener serves.
func (t tlsFlags) scheme() string {
	if t.cert != "" {
		return "https"
	}
	return "http"
}

// secure returns l serving TLS when a certificate is configured, reloading
// it on SIGHUP (until ctx ends) and when its files change. Without one, it
// refuses a listener beyond loopback unless --insecure-http says so. On an
// error l is closed.
func (t tlsFlags) secure(ctx context.Context, l net.Listener, logger *slog.Logger) (_ net.Listener, err error) {
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if (t.cert == "") != (t.key == "") {
		return nil, usageError("--tls-cert and --tls-key go together; give both (or neither, for plain HTTP)")
	}
	if t.cert == "" {
		if tcp, ok := l.Addr().(*net.TCPAddr); !t.insecureHTTP && (!ok || !tcp.IP.IsLoopback()) {
			return nil, usageError("--http listens on %s, beyond this machine, without TLS; give --tls-cert and --tls-key, or --insecure-http to send tokens in the clear, or listen on 127.0.0.1", l.Addr())
		}
		return l, nil
	}
	r, err := newCertReloader(t.cert, t.key, logger)
	if err != nil {
		return nil, err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-hup:
				r.reload(true)
			case <-ctx.Done():
				return
			}
		}
	}()
	// HTTP/1.1 only: http.Server.Serve does not set up HTTP/2 on a listener
	// it is given, and MCP's streams need nothing more.
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.getCertificate, NextProtos: []string{"http/1.1"}}
	return tls.NewListener(l, cfg), nil
}

// certReloader holds the serving certificate, loaded again when asked
// (SIGHUP) or when a handshake finds that its files changed. A new pair
// that does not load keeps the old one in use, and is logged once.
type certReloader struct {
	certFile, keyFile string
	logger            *slog.Logger

	mu    sync.Mutex
	cert  *tls.Certificate
	stamp string // the files' identity and times when last loaded or tried
}

func newCertReloader(certFile, keyFile string, logger *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, logger: logger}
	r.stamp = r.fileStamp()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, usageError("--tls-cert %s, --tls-key %s: %v; give a PEM certificate and its private key", certFile, keyFile, err)
	}
	r.cert = &cert
	return r, nil
}

// fileStamp identifies the current contents of both files as far as
// stat can: a rename over them or a write in place changes it.
func (r *certReloader) fileStamp() string {
	stamp := ""
	for _, name := range []string{r.certFile, r.keyFile} {
		var st syscall.Stat_t
		if err := syscall.Stat(name, &st); err != nil {
			stamp += "missing;"
			continue
		}
		stamp += fmt.Sprintf("%d:%d:%d:%d.%d;", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec)
	}
	return stamp
}

// reload loads the pair again if its files changed, or always if force.
func (r *certReloader) reload(force bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamp := r.fileStamp()
	if !force && stamp == r.stamp {
		return
	}
	r.stamp = stamp
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.logger.Error("TLS certificate not reloaded; still serving the previous one", "cert", r.certFile, "key", r.keyFile, "err", err)
		return
	}
	r.cert = &cert
	r.logger.Info("TLS certificate reloaded", "cert", r.certFile)
}

func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.reload(false)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert, nil
}
