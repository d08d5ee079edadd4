package stream_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// The PKI helpers are those of the root package's tls_test.go.

// testPKI is a CA and the leaf certificates it signed, made in memory.
type testPKI struct {
	pool           *x509.CertPool
	server, client tls.Certificate
	other          tls.Certificate // signed by another CA
}

var (
	pkiOnce sync.Once
	pki     testPKI
)

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	pkiOnce.Do(func() {
		ca, caKey := makeCA(t, "test CA")
		pki.pool = x509.NewCertPool()
		pki.pool.AddCert(ca)
		pki.server = makeLeaf(t, ca, caKey, "server", x509.ExtKeyUsageServerAuth)
		pki.client = makeLeaf(t, ca, caKey, "client", x509.ExtKeyUsageClientAuth)
		other, otherKey := makeCA(t, "other CA")
		pki.other = makeLeaf(t, other, otherKey, "stranger", x509.ExtKeyUsageClientAuth)
	})
	require.NotNil(t, pki.pool)
	return pki
}

var serial int64

func makeCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return ca, key
}

func makeLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, use x509.ExtKeyUsage) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{use},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serverTLS requires and verifies a client certificate: mutual TLS.
func (p testPKI) serverTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: p.pool}
}

func (p testPKI) clientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: p.pool, Certificates: certs}
}

// peerName is the common name of the peer's verified leaf certificate.
func peerName(t *testing.T, state func() (tls.ConnectionState, bool)) string {
	t.Helper()
	st, ok := state()
	require.True(t, ok, "no TLS state")
	require.True(t, st.HandshakeComplete)
	require.NotEmpty(t, st.VerifiedChains, "the peer's certificate was not verified")
	return st.VerifiedChains[0][0].Subject.CommonName
}

// dialRefused dials ln (with opts) while it accepts, and returns the

// Rule: the stream runs over TLS too: net/http over it, with each side
// seeing the other's verified certificate on its stream.Conn.
func TestTLSStreamHTTP(t *testing.T) { eachTCPSetup(t, testTLSStreamHTTP) }

func testTLSStreamHTTP(t *testing.T, opts []rdma.Option) {
	p := newTestPKI(t)
	ln, err := stream.Listen("rdma", "127.0.0.1:0", append(opts, rdma.WithTLS(p.serverTLS()))...)
	require.NoError(t, err)
	srv := &http.Server{
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	// The handler's peer comes from the stream.Conn's TLS state.
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc := r.Context().Value(connKey{}).(*stream.Conn)
		st, ok := sc.ConnectionState()
		if !ok || len(st.VerifiedChains) == 0 {
			http.Error(w, "no verified peer", http.StatusForbidden)
			return
		}
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, st.VerifiedChains[0][0].Subject.CommonName+": "+strings.ToUpper(string(body)))
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	var mu sync.Mutex
	var conns []*stream.Conn
	d := &stream.Dialer{Options: append(opts, rdma.WithTLS(p.clientTLS(p.client)))}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, "rdma", addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c.(*stream.Conn))
			mu.Unlock()
		}
		return c, err
	}}
	client := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	for range 3 {
		resp, err := client.Post("http://"+ln.Addr().String()+"/", "text/plain", strings.NewReader("over tls"))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		assert.Equal(t, "client: OVER TLS", string(body))
	}
	mu.Lock()
	require.NotEmpty(t, conns)
	assert.Equal(t, "server", peerName(t, conns[0].ConnectionState))
	mu.Unlock()
	tr.CloseIdleConnections()
	require.NoError(t, srv.Close())
	assert.ErrorIs(t, <-served, http.ErrServerClosed)
}

type connKey struct{}
