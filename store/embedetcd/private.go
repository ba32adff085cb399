package embedetcd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// A Private member (Config.Private) is no side door: its client and peer
// listeners are TLS on loopback and require a client certificate of a CA that
// exists only in its data directory. At every Start a new CA and one
// certificate for 127.0.0.1 (server and client use) are generated into
// <Dir>/tls (mode 0700, keys 0600); the member uses it to serve and to talk to
// itself as a peer, verdict's store to connect (ClientTLS). Another local
// process — a pod neighbour on the same loopback — reaches the ports but can
// neither read, write nor send raft messages; one that can read the data
// directory could change the data files anyway.

// privateDir is where a Private member's certificates are kept, under Dir.
const privateDir = "tls"

type privateCerts struct {
	info   transport.TLSInfo
	client *tls.Config
}

// newPrivateCerts generates a CA and a certificate for loopback into
// dir/tls, replacing what was there.
func newPrivateCerts(dir string) (*privateCerts, error) {
	tdir := filepath.Join(dir, privateDir)
	if err := os.MkdirAll(tdir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(tdir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "verdict embedded etcd CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "verdict embedded etcd"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.pem":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"key.pem":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(tdir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	pair, err := tls.X509KeyPair(files["cert.pem"], files["key.pem"])
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &privateCerts{
		info: transport.TLSInfo{
			CertFile: filepath.Join(tdir, "cert.pem"), KeyFile: filepath.Join(tdir, "key.pem"),
			TrustedCAFile: filepath.Join(tdir, "ca.pem"), ClientCertAuth: true,
		},
		client: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // crypto/rand does not fail on supported platforms
	}
	return n
}
