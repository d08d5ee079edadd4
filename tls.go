package rdma

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
)

// TLS on the TCP bootstrap (docs/security.md): the hello, its answer and
// every control frame after it travel inside one TLS session on the
// connection's TCP socket. RDMA traffic itself does not.

// WithTLS runs go-rdma's handshake and control channel over TLS with cfg
// (crypto/tls); without it they run over plain TCP.
//
// On Dial, cfg is a client configuration: a ServerName left empty is
// taken from the dialed address's host, as tls.Dial does. On Listen, cfg
// must carry a certificate (Certificates, GetCertificate or
// GetConfigForClient); for mutual TLS set ClientAuth (e.g.
// tls.RequireAndVerifyClientCert) and ClientCAs. A peer whose TLS
// handshake fails is served nothing: the listener makes no queue pair,
// receive or registered memory for it. Both sides must use TLS: a TLS
// dialer against a plain listener, or a plain one against a TLS listener,
// fails at the dial with an error matching ErrRefused that says so.
//
// The TLS handshake runs under the handshake's bound
// (WithHandshakeTimeout) and, on a Listener, counts among the sockets
// waiting for their hello. It cannot be combined with WithRDMACM
// (ErrNotSupported): rdma_cm has no TCP channel. cfg must not be changed
// after it is passed.
func WithTLS(cfg *tls.Config) ConnOption {
	return connOpt(func(c *config) error {
		if cfg == nil {
			return fmt.Errorf("rdma: %w: WithTLS(nil)", ErrInvalid)
		}
		c.tls = cfg
		return nil
	})
}

// PeerInfo describes a peer to a Listener's accept check: who it is,
// once its TLS handshake (if any) and its hello came.
type PeerInfo struct {
	// RemoteAddr and LocalAddr are the addresses of the peer's TCP
	// connection, or with WithRDMACM of its connection request.
	RemoteAddr, LocalAddr net.Addr
	// TLS is the state of the TLS session (WithTLS), with the peer's
	// certificates and, when the listener verified them, their chains
	// (VerifiedChains); nil without TLS.
	TLS *tls.ConnectionState
	// Context ends when the listener closes or the handshake's bound
	// (WithHandshakeTimeout) passes: a check that waits, on a service
	// it asks, say, should give up then.
	Context context.Context
}

// WithAcceptCheck gives a Listener a check of each peer. It is called
// after the peer's TLS handshake (WithTLS) and a valid hello, and before
// anything costly is made for it: no queue pair, receive or registered
// memory exists yet. A non-nil error refuses the peer: the listener
// closes the socket, and the dialer's Dial fails with an error matching
// ErrRefused that carries the error's text (up to 512 bytes), so say
// only what the peer may know. check runs on a goroutine of its own per
// peer, possibly for many peers at once. Neither the listener's
// handshake bound nor Close interrupts it, but both end the
// PeerInfo.Context it is given: Close returns without waiting for the
// checks still running, and their peers are refused when they return; a
// peer whose check outlasts the handshake's bound fails its handshake.
//
// It is a Listener option: Dial refuses it with ErrInvalid (a dialer
// checks the listener through its tls.Config, e.g. VerifyConnection).
// With WithRDMACM it sees the connection request's addresses, and a
// refusal is rdma_cm's reject, carrying the first bytes of the text.
func WithAcceptCheck(check func(PeerInfo) error) ListenOption {
	return listenOpt(func(c *config) error {
		if check == nil {
			return fmt.Errorf("rdma: %w: WithAcceptCheck(nil)", ErrInvalid)
		}
		c.acceptCheck = check
		return nil
	})
}

// ConnectionState is the state of the TLS session of the connection's
// control channel (WithTLS), with the peer's certificates and their
// verified chains; ok is false without TLS, and on connections set up
// through rdma_cm.
func (c *Conn) ConnectionState() (state tls.ConnectionState, ok bool) {
	ctl := c.rc.Ctl.Conn()
	if c.tcp != nil {
		ctl = c.tcp.sock
	}
	tc, ok := ctl.(*tls.Conn)
	if !ok {
		return tls.ConnectionState{}, false
	}
	return tc.ConnectionState(), true
}

// checkSecurity refuses option combinations that cannot work, on Dial
// (dialing) or Listen.
func (c *config) checkSecurity(dialing bool) error {
	switch {
	case c.tls != nil && c.cm:
		return fmt.Errorf("rdma: %w: WithTLS with WithRDMACM: rdma_cm has no TCP channel to run TLS on (see docs/security.md)", ErrNotSupported)
	case c.acceptCheck != nil && dialing:
		return fmt.Errorf("rdma: %w: WithAcceptCheck is a Listener option; a dialer checks the listener through its tls.Config", ErrInvalid)
	case c.tls != nil && !dialing && len(c.tls.Certificates) == 0 && c.tls.GetCertificate == nil && c.tls.GetConfigForClient == nil:
		return fmt.Errorf("rdma: %w: WithTLS on a Listener needs a certificate (tls.Config.Certificates or GetCertificate)", ErrInvalid)
	}
	return nil
}

// clientTLSConfig is cfg with its ServerName, if empty, taken from the
// host of address, as tls.Dial does.
func clientTLSConfig(cfg *tls.Config, address string) *tls.Config {
	if cfg == nil || cfg.ServerName != "" {
		return cfg
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	cfg = cfg.Clone()
	cfg.ServerName = host
	return cfg
}

// startTLS runs the dialer's TLS handshake on tc, which bound already
// limits; it closes tc on failure.
func startTLS(ctx context.Context, tc net.Conn, cfg *tls.Config) (net.Conn, error) {
	t := tls.Client(tc, cfg)
	if err := t.HandshakeContext(ctx); err != nil {
		tc.Close()
		return nil, tlsErr(tc.RemoteAddr(), err)
	}
	return t, nil
}

// tlsErr explains a failed TLS handshake with the peer at addr. A plain
// go-rdma listener answers a ClientHello with a refusal in clear text; a
// listener that refused the TLS session (no or a bad client certificate)
// sends an alert: both match ErrRefused. Any other answer that is no TLS
// record is a server of another protocol (ErrNotRDMA). The TLS error's
// text is quoted: it may carry what the peer sent (its certificate's
// names).
func tlsErr(addr net.Addr, err error) error {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		h := rh.RecordHeader[:]
		switch {
		case h[0] == rc.AnswerRefuse:
			return fmt.Errorf("rdma: TLS handshake with %v: %w: the listener does not use TLS (it answered in plain text)", addr, ErrRefused)
		case bytes.HasPrefix(h, []byte("HTTP/")):
			return fmt.Errorf("rdma: TLS handshake with %v: %w: an HTTP server answered: %q (dialed its port instead of the listener's?)", addr, ErrNotRDMA, h)
		}
		return fmt.Errorf("rdma: TLS handshake with %v: %w: the peer answered %q", addr, ErrNotRDMA, h)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" {
		return fmt.Errorf("rdma: TLS handshake with %v: %w: %w", addr, ErrRefused, peerText{err})
	}
	return fmt.Errorf("rdma: TLS handshake with %v: %w", addr, peerText{err})
}

// peerText is an error whose text may carry what a peer sent: its
// Error quotes that text, so that it cannot forge lines where it is
// logged, and errors.Is and As see through it.
type peerText struct{ err error }

func (e peerText) Error() string { return strconv.Quote(e.err.Error()) }
func (e peerText) Unwrap() error { return e.err }

// tlsAnswered reports the listener's refusal of the TLS session that
// comes after the dialer's side of the handshake completed: with TLS 1.3
// the listener checks the client's certificate after that, and its alert
// is the first thing the dialer reads. Other errors are left for
// readAnswer to explain.
func tlsAnswered(tc net.Conn, br *bufio.Reader) error {
	if _, err := br.Peek(1); err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "remote error" {
			return tlsErr(tc.RemoteAddr(), err)
		}
	}
	return nil
}

// acceptTLS runs the listener's TLS handshake on tc, which bound already
// limits. A dialer that does not speak TLS is told so in plain text. It
// closes tc on failure.
func acceptTLS(ctx context.Context, tc net.Conn, cfg *tls.Config) (*tls.Conn, error) {
	t := tls.Server(tc, cfg)
	err := t.HandshakeContext(ctx)
	if err == nil {
		return t, nil
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && string(rh.RecordHeader[:]) == rc.MagicBytes[:len(rh.RecordHeader)] {
		rc.WriteRefusal(tc, "rdma: this listener requires TLS (WithTLS)")
		tc.Close()
		return nil, fmt.Errorf("rdma: TLS handshake with %v: the dialer does not use TLS: %w", tc.RemoteAddr(), peerText{err})
	}
	tc.Close()
	return nil, fmt.Errorf("rdma: TLS handshake with %v: %w", tc.RemoteAddr(), peerText{err})
}

// checkPeer runs the listener's accept check on the peer of tc, bounded
// by ctx, the handshake's, which release lifts (bound). closed reports
// that the listener closed while the check ran: the peer is then refused
// when the check returns, and the caller must leave tc alone.
func (l *Listener) checkPeer(ctx context.Context, tc net.Conn, release func() bool) (closed bool, err error) {
	if l.cfg.acceptCheck == nil {
		return false, nil
	}
	info := PeerInfo{RemoteAddr: tc.RemoteAddr(), LocalAddr: tc.LocalAddr(), Context: ctx}
	if t, ok := tc.(*tls.Conn); ok {
		st := t.ConnectionState()
		info.TLS = &st
	}
	return l.runCheck(ctx, info, func(why error) {
		// The handshake's bound has ended with the listener: the
		// refusal gets a bound of its own.
		release()
		tc.SetWriteDeadline(time.Now().Add(lateRefusalBound))
		rc.WriteRefusal(tc, why.Error())
		tc.Close()
	})
}

// lateRefusalBound is how long the refusal of a peer whose check
// returned after Close may take to go out.
const lateRefusalBound = time.Second

// runCheck runs the accept check on info, on a goroutine of its own so
// that Close does not wait for a check that blocks. When the listener
// closes first, runCheck reports closed at once and leaves refuse to run
// when the check returns. A check that outlasts ctx, the handshake's
// bound, fails the handshake.
func (l *Listener) runCheck(ctx context.Context, info PeerInfo, refuse func(why error)) (closed bool, err error) {
	res := make(chan error, 1)
	go func() { res <- l.cfg.acceptCheck(info) }()
	closedErr := fmt.Errorf("rdma: the listener %v closed", l.addr)
	select {
	case err = <-res:
		if l.ctx.Err() != nil {
			refuse(closedErr)
			return true, nil
		}
	case <-l.ctx.Done():
		go func() {
			<-res
			refuse(closedErr)
		}()
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("rdma: the listener's check refused the peer: %w", err)
	}
	if ctx.Err() != nil {
		return false, fmt.Errorf("rdma: the listener's check took longer than the handshake's bound (%v)", l.cfg.setup)
	}
	return false, nil
}
