package peer

import (
	"crypto/tls"
	"crypto/x509"
)

// MutualTLS returns the TLS configs of a replica's event stream server and of its client for
// mutual verification (Config.ServerTLS and ClientTLS): the server requires a certificate of
// every replica that connects and verifies it against roots; the client verifies the server's
// against roots and serverName ("": the address dialled). Both present cert's certificate, asked
// at each handshake (so that a renewed one is taken up). Requests are still signed with the
// shared secret on top.
func MutualTLS(cert func() (*tls.Certificate, error), roots *x509.CertPool, serverName string) (server, client *tls.Config) {
	// Both ends are kvroute: no older version to speak to.
	server = &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert() },
		ClientAuth:     tls.RequireAndVerifyClientCert, ClientCAs: roots,
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert() },
		RootCAs:              roots, ServerName: serverName,
	}
	return server, client
}

// scheme is the event stream's URL scheme: https with ClientTLS.
func (n *Node) scheme() string {
	if n.cfg.ClientTLS != nil {
		return "https"
	}
	return "http"
}
