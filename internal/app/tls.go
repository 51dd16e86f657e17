package app

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certCheckEvery is how often, at most, a handshake looks at the certificate files for a renewal.
const certCheckEvery = 10 * time.Second

// certFiles serves the API listener's certificate from PEM files and reads them again when
// either file changes (a renewal by cert-manager or certbot), checking at most every `every`,
// at a handshake. A renewed pair that does not load is logged and the old one kept.
type certFiles struct {
	field             string // the config section, in errors: server.tls, extproc.tls
	certPath, keyPath string
	every             time.Duration
	log               *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	mod     [2]time.Time
	checked time.Time
}

func newCertFiles(certPath, keyPath string, every time.Duration, log *slog.Logger) (*certFiles, error) {
	return (&certFiles{field: "server.tls", certPath: certPath, keyPath: keyPath, every: every, log: log}).start()
}

// start loads the files a first time.
func (c *certFiles) start() (*certFiles, error) {
	mod, err := c.modTimes()
	if err != nil {
		return nil, err
	}
	if err := c.load(mod); err != nil {
		return nil, err
	}
	c.checked = time.Now()
	return c, nil
}

func (c *certFiles) modTimes() ([2]time.Time, error) {
	var mod [2]time.Time
	for i, p := range []string{c.certPath, c.keyPath} {
		fi, err := os.Stat(p)
		if err != nil {
			return mod, fmt.Errorf("%s: %w", c.field, err)
		}
		mod[i] = fi.ModTime()
	}
	return mod, nil
}

func (c *certFiles) load(mod [2]time.Time) error {
	cert, err := tls.LoadX509KeyPair(c.certPath, c.keyPath)
	if err != nil {
		return fmt.Errorf("%s: %w", c.field, err)
	}
	c.cur, c.mod = &cert, mod
	return nil
}

// get is tls.Config.GetCertificate.
func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= c.every {
		c.checked = now
		mod, err := c.modTimes()
		if err == nil && mod != c.mod {
			err = c.load(mod)
			if err == nil {
				c.log.Info("TLS certificate reloaded", "cert_file", c.certPath)
			}
		}
		if err != nil {
			c.log.Error("TLS certificate files unusable, keeping the certificate in force", "err", err)
		}
	}
	return c.cur, nil
}

// tlsConfig is the API listener's TLS setup: TLS 1.2 at least, and HTTP/2 offered only when
// net/http's server serves the listener (the built-in one speaks HTTP/1.1).
func tlsConfig(certs *certFiles, http2 bool) *tls.Config {
	protos := []string{"http/1.1"}
	if http2 {
		protos = []string{"h2", "http/1.1"}
	}
	return &tls.Config{GetCertificate: certs.get, MinVersion: tls.VersionTLS12, NextProtos: protos}
}
