package rdma_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

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

// strangerTLS offers the certificate of another CA: a client offers
// none the listener's CAs did not sign, unless made to.
func (p testPKI) strangerTLS() *tls.Config {
	cfg := p.clientTLS()
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &p.other, nil }
	return cfg
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
// dial's error, which must not be nil; the listener must accept nothing.
func dialRefused(t *testing.T, ln *rdma.Listener, dial func(ctx context.Context, addr string) (*rdma.Conn, error)) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dial(ctx, ln.Addr().String())
	if err == nil {
		c.Close()
	}
	require.Error(t, err, "the dial went through")
	t.Logf("dial: %v", err)
	actx, acancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer acancel()
	s, aerr := ln.Accept(actx)
	if aerr == nil {
		s.Close()
	}
	require.ErrorIs(t, aerr, context.DeadlineExceeded, "the listener accepted the refused peer")
	return err
}

// Rule: with mutual TLS, a pair connects, moves data, and each side sees
// the other's verified certificate; a plain pair has no TLS state.
func TestTLSMutual(t *testing.T) { eachProvider(t, testTLSMutual) }

func testTLSMutual(t *testing.T, opts []rdma.Option) {
	p := newTestPKI(t)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", append(opts, rdma.WithTLS(p.serverTLS()))...)
	require.NoError(t, err)
	defer ln.Close()
	c, s := rdmatest.Connect(t, ln, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, append(opts, rdma.WithTLS(p.clientTLS(p.client)))...)
	})
	assert.Equal(t, "server", peerName(t, c.ConnectionState))
	assert.Equal(t, "client", peerName(t, s.ConnectionState))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := s.Recv()
	b, err := c.Alloc(5)
	require.NoError(t, err)
	copy(b.Bytes(), "hello")
	require.NoError(t, c.Send(b).Wait(ctx))
	require.NoError(t, r.Wait(ctx))
	got := r.Buffer()
	assert.Equal(t, "hello", string(got.Bytes()))
	got.Release()
	b.Release()
	// The control channel runs over TLS too: a region goes across.
	reg, err := s.Alloc(64)
	require.NoError(t, err)
	defer reg.Release()
	x, err := s.Expose(reg, rdma.RemoteRead)
	require.NoError(t, err)
	require.NoError(t, s.SendRegion(ctx, x))
	rr, err := c.RecvRegion(ctx)
	require.NoError(t, err)
	assert.Equal(t, x, rr)
	require.NoError(t, s.Revoke(ctx, x))
	// The orderly close goes over TLS as well: the peer sees it.
	r = s.Recv()
	require.NoError(t, c.Close())
	failedWith(t, r, rdma.ErrPeerClosed)

	pc, ps := rdmatest.Pair(t, opts...)
	_, ok := pc.ConnectionState()
	assert.False(t, ok, "a plain connection has TLS state")
	_, ok = ps.ConnectionState()
	assert.False(t, ok, "a plain connection has TLS state")
}

// Rule: a listener that requires a client certificate refuses a dialer
// without one, or with one it cannot verify, and the dial says so.
func TestTLSClientCertRequired(t *testing.T) { eachProvider(t, testTLSClientCertRequired) }

func testTLSClientCertRequired(t *testing.T, opts []rdma.Option) {
	p := newTestPKI(t)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", append(opts, rdma.WithTLS(p.serverTLS()))...)
	require.NoError(t, err)
	defer ln.Close()
	for name, cfg := range map[string]*tls.Config{"no cert": p.clientTLS(), "unknown CA": p.strangerTLS()} {
		err := dialRefused(t, ln, func(ctx context.Context, addr string) (*rdma.Conn, error) {
			return rdma.Dial(ctx, "rdma", addr, append(opts, rdma.WithTLS(cfg))...)
		})
		assert.ErrorIs(t, err, rdma.ErrRefused, name)
		assert.Contains(t, err.Error(), "tls: ", name)
	}
	// A dialer that does not trust the listener's certificate stops.
	err = dialRefused(t, ln, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, append(opts, rdma.WithTLS(&tls.Config{Certificates: []tls.Certificate{p.client}}))...)
	})
	var unknown x509.UnknownAuthorityError
	assert.ErrorAs(t, err, &unknown)
}

// Rule: the accept check sees the peer (address, verified certificate)
// after its hello and before anything costly is made for it; its error
// refuses the peer, and the dialer's error carries the reason.
func TestAcceptCheck(t *testing.T) { eachProvider(t, testAcceptCheck) }

func testAcceptCheck(t *testing.T, opts []rdma.Option) {
	p := newTestPKI(t)
	x, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, x.Close()) }()
	var mu sync.Mutex
	var seen []rdma.PeerInfo
	check := func(pi rdma.PeerInfo) error {
		mu.Lock()
		seen = append(seen, pi)
		mu.Unlock()
		// Nothing is made for the peer before the check: no connection
		// (no QP), no registered memory.
		st := x.Stats()
		if st.Conns != 0 || st.Pool.Registrations != 0 {
			return errors.New("something was made before the check")
		}
		if pi.TLS != nil && len(pi.TLS.VerifiedChains) > 0 && pi.TLS.VerifiedChains[0][0].Subject.CommonName == "client" {
			return errors.New("client is not on the list")
		}
		return errors.New("no verified certificate")
	}
	ln, err := x.Listen("rdma", "127.0.0.1:0", rdma.WithTLS(p.serverTLS()), rdma.WithAcceptCheck(check))
	require.NoError(t, err)
	defer ln.Close()
	err = dialRefused(t, ln, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, append(opts, rdma.WithTLS(p.clientTLS(p.client)))...)
	})
	assert.ErrorIs(t, err, rdma.ErrRefused)
	assert.Contains(t, err.Error(), "client is not on the list")
	mu.Lock()
	require.Len(t, seen, 1)
	pi := seen[0]
	mu.Unlock()
	assert.Equal(t, "127.0.0.1", pi.RemoteAddr.(*net.TCPAddr).IP.String())
	assert.Equal(t, ln.Addr().String(), pi.LocalAddr.String())
	require.NotNil(t, pi.TLS)
	assert.Len(t, pi.TLS.PeerCertificates, 1)
	st := x.Stats()
	assert.Zero(t, st.Conns)
	assert.Zero(t, st.Pool.Registrations)

	// Without TLS the check sees the address alone.
	pln, err := x.Listen("rdma", "127.0.0.1:0", rdma.WithAcceptCheck(check))
	require.NoError(t, err)
	defer pln.Close()
	err = dialRefused(t, pln, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, opts...)
	})
	assert.ErrorIs(t, err, rdma.ErrRefused)
	assert.Contains(t, err.Error(), "no verified certificate")
	mu.Lock()
	require.Len(t, seen, 2)
	assert.Nil(t, seen[1].TLS)
	mu.Unlock()
}

// Rule: a TLS dialer against a plain listener, and a plain dialer
// against a TLS listener, fail at the dial with an error that says so.
func TestTLSMismatch(t *testing.T) { eachProvider(t, testTLSMismatch) }

func testTLSMismatch(t *testing.T, opts []rdma.Option) {
	p := newTestPKI(t)
	plain, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer plain.Close()
	err = dialRefused(t, plain, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, append(opts, rdma.WithTLS(p.clientTLS(p.client)))...)
	})
	assert.ErrorIs(t, err, rdma.ErrRefused)
	assert.Contains(t, err.Error(), "the listener does not use TLS")

	secure, err := rdma.Listen("rdma", "127.0.0.1:0", append(opts, rdma.WithTLS(p.serverTLS()))...)
	require.NoError(t, err)
	defer secure.Close()
	err = dialRefused(t, secure, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, opts...)
	})
	assert.ErrorIs(t, err, rdma.ErrRefused)
	assert.Contains(t, err.Error(), "requires TLS")
}

// Rule: options that cannot work fail at the call.
func TestTLSOptions(t *testing.T) {
	p := newTestPKI(t)
	ctx := context.Background()
	_, err := rdma.Dial(ctx, "rdma", "127.0.0.1:1", rdma.WithTLS(p.clientTLS()), rdma.WithRDMACM())
	assert.ErrorIs(t, err, rdma.ErrNotSupported)
	_, err = rdma.Listen("rdma", "127.0.0.1:0", rdma.WithTLS(p.serverTLS()), rdma.WithRDMACM())
	assert.ErrorIs(t, err, rdma.ErrNotSupported)
	_, err = rdma.Listen("rdma", "127.0.0.1:0", rdma.WithTLS(&tls.Config{}))
	assert.ErrorIs(t, err, rdma.ErrInvalid)
	_, err = rdma.Dial(ctx, "rdma", "127.0.0.1:1", rdma.WithAcceptCheck(func(rdma.PeerInfo) error { return nil }))
	assert.ErrorIs(t, err, rdma.ErrInvalid)
	_, err = rdma.Dial(ctx, "rdma", "127.0.0.1:1", rdma.WithTLS(nil))
	assert.ErrorIs(t, err, rdma.ErrInvalid)
	_, err = rdma.Listen("rdma", "127.0.0.1:0", rdma.WithAcceptCheck(nil))
	assert.ErrorIs(t, err, rdma.ErrInvalid)
}

// Rule: a socket that never finishes its TLS handshake is closed at the
// handshake's bound, as one that never says hello is.
func TestTLSSilentPeer(t *testing.T) {
	p := newTestPKI(t)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft),
		rdma.WithTLS(p.serverTLS()), rdma.WithHandshakeTimeout(200*time.Millisecond))
	require.NoError(t, err)
	defer ln.Close()
	tc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer tc.Close()
	tc.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = io.ReadAll(tc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the listener kept a silent socket")
	}
}

// Rule: the TLS library's account of a failed handshake is quoted in
// the dialer's error: it may carry the peer's certificate's names.
func TestTLSErrorQuoted(t *testing.T) {
	ca, caKey := makeCA(t, "quoting CA")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "evil"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{forged}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	soft := rdma.WithProvider(rdma.ProviderSoft)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft,
		rdma.WithTLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}))
	require.NoError(t, err)
	defer ln.Close()
	err = dialRefused(t, ln, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, soft, rdma.WithTLS(&tls.Config{RootCAs: pool, ServerName: "rdma.test"}))
	})
	var hostname x509.HostnameError
	require.ErrorAs(t, err, &hostname, "the TLS error is still in the chain")
	require.Contains(t, hostname.Error(), forged, "the certificate carries the forged name")
	requirePrintable(t, err.Error())
}

// Rule: Close does not wait for accept checks that block: it returns at
// once and ends their PeerInfo.Context; a peer whose check returns after
// Close is refused, and nothing is left running once the checks return.
func TestCloseDoesNotWaitForChecks(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	const checks = 4
	entered := make(chan context.Context, checks)
	release := make(chan struct{})
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithAcceptCheck(func(pi rdma.PeerInfo) error {
		entered <- pi.Context
		<-release
		return nil
	}))
	require.NoError(t, err)
	released := false
	defer func() {
		if !released {
			close(release)
		}
		ln.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dials := make(chan error, checks)
	for range checks {
		go func() {
			c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), soft)
			if err == nil {
				c.Close()
			}
			dials <- err
		}()
	}
	var ctxs []context.Context
	for range checks {
		select {
		case c := <-entered:
			require.NotNil(t, c, "PeerInfo.Context")
			ctxs = append(ctxs, c)
		case <-ctx.Done():
			t.Fatal("the checks did not start")
		}
	}
	for _, c := range ctxs {
		require.NoError(t, c.Err(), "a check's context ended before Close")
	}
	closed := make(chan error, 1)
	go func() { closed <- ln.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second): // against a Close that waits until the checks return
		t.Fatal("Close waits for the accept checks")
	}
	for _, c := range ctxs {
		require.Error(t, c.Err(), "Close did not end a check's context")
	}
	close(release)
	released = true
	for range checks {
		err := <-dials
		require.ErrorIs(t, err, rdma.ErrRefused)
		assert.Contains(t, err.Error(), "closed")
	}
}
