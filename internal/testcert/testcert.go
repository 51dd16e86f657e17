// Package testcert issues certificates for tests: a CA of its own and the certificates it signs,
// written as PEM files, so that a test can set up TLS (mutual or not) on loopback.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority of a test.
type CA struct {
	t    testing.TB
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate's PEM file.
	File string
}

// NewCA makes a CA named name, its certificate written to a file in a directory of the test's.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca := &CA{t: t, dir: t.TempDir()}
	ca.cert, ca.key = ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, nil)
	ca.File = ca.write(name+"-ca.pem", "CERTIFICATE", ca.cert.Raw)
	return ca
}

// Issue makes a certificate for 127.0.0.1, ::1 and the DNS names given, for server and client
// authentication, signed by the CA; it returns the certificate's and the key's PEM files.
func (ca *CA) Issue(name string, dnsNames ...string) (certFile, keyFile string) {
	ca.t.Helper()
	cert, key := ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: name}, DNSNames: dnsNames,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}, ca.cert, ca.key)
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return ca.write(name+".pem", "CERTIFICATE", cert.Raw), ca.write(name+"-key.pem", "EC PRIVATE KEY", kb)
}

// issue signs tmpl with parent's key (itself when parent is nil) and returns the certificate
// and its new key.
func (ca *CA) issue(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	ca.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.t.Fatal(err)
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62)); err != nil {
		ca.t.Fatal(err)
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.BasicConstraintsValid = true
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		ca.t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		ca.t.Fatal(err)
	}
	return cert, key
}

func (ca *CA) write(name, typ string, der []byte) string {
	ca.t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return p
}
