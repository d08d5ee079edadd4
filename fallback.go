package rdma

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/rc"
)

// The TCP fallback: where a side has no RDMA device, a dialer and a
// listener that both allow it (WithTCPFallback) agree in their hellos to
// carry the connection's bytes over the handshake's TCP connection
// itself, as SMC-R falls back to TCP. The dialer's queue pair, made
// before its hello, is torn down; the listener makes none. The Conn
// that results has Transport TCP: NetConn is the socket, and every RDMA
// operation fails at the call with ErrNotSupported.

// WithTCPFallback lets connections fall back to TCP (on true) where a
// side has no usable RDMA device: its provider was chosen by "auto"
// (WithProvider, $RDMA_PROVIDER) and is soft. The dial falls back when
// the dialer and the listener both allow it and at least one of them
// has no device; the Conn it gives then has Transport TCP, and carries
// no operation: its NetConn carries the bytes. Off by default in this
// package; package stream turns it on for its connections. A side whose
// provider was named (WithProvider("soft"), or "verbs") never falls
// back, nor do connections set up through rdma_cm (WithRDMACM).
// Without the fallback, a side with a device and one without refuse
// each other as before: a soft queue pair cannot talk to a verbs one.
func WithTCPFallback(on bool) ConnOption {
	return connOpt(func(c *config) error { c.fallback = on; return nil })
}

// claimDevice makes this side's hello claim a device, as the dialer
// (index 0) or the listener (1): tests play a host with a device on one
// without.
var claimDevice [2]atomic.Bool

// beforeAnswer, if set, runs in Dial's handshake before it reads the
// listener's answer (tests).
var beforeAnswer atomic.Pointer[func()]

func claimsDevice(dialing bool) bool {
	if dialing {
		return claimDevice[0].Load()
	}
	return claimDevice[1].Load()
}

// fallbackFlags are this side's TCP fallback flags for its hello.
func fallbackFlags(eng *engine, cfg *config, dialing bool) uint8 {
	if !cfg.fallback || cfg.provider != ProviderAuto || cfg.cm {
		return 0
	}
	var f uint8 = rc.HelloFallback
	if eng.Prov.Name() == ProviderSoft && !claimsDevice(dialing) {
		f |= rc.HelloNoDevice
	}
	return f
}

// helloProvider is the provider this side's hello names.
func helloProvider(eng *engine, dialing bool) string {
	if claimsDevice(dialing) {
		return ProviderVerbs
	}
	return eng.Prov.Name()
}

// acceptTCP is the listener's side of a connection that falls back: it
// answers so, and the socket is the connection's. It closes tc on
// failure.
func acceptTCP(eng *engine, cfg config, tc net.Conn, br *bufio.Reader, release func() bool) (*conn, error) {
	me := rc.Hello{Flags: rc.HelloTCP}
	copy(me.Provider[:], helloProvider(eng, false))
	var b bytes.Buffer
	b.WriteByte(rc.AnswerAccept)
	rc.WriteHello(&b, &me)
	_, err := tc.Write(b.Bytes())
	if err == nil && !release() {
		err = fmt.Errorf("rdma: handshake with %v: %w", tc.RemoteAddr(), context.Canceled)
	}
	if err != nil {
		tc.Close()
		return nil, err
	}
	return newTCPConn(eng, cfg, tc, br)
}

// dialTCP is the dialer's side once the listener answered that the
// connection falls back: c, the queue pair it made, goes, and the socket
// is the new connection's. It closes tc on failure.
func dialTCP(c *conn, me *rc.Hello, tc net.Conn, br *bufio.Reader, release func() bool) (*conn, error) {
	eng, cfg := c.eng, c.cfg
	c.rc.Ctl.Detach() // the socket is the new connection's
	c.rc.AbortSetup()
	var err error
	switch {
	case me.Flags&rc.HelloFallback == 0:
		err = fmt.Errorf("rdma: %w: the listener answered with the TCP fallback, which this dialer does not allow", ErrProtocol)
	case !release():
		err = fmt.Errorf("rdma: handshake with %v: %w", tc.RemoteAddr(), context.Canceled)
	}
	if err != nil {
		tc.Close()
		return nil, err
	}
	return newTCPConn(eng, cfg, tc, br)
}

// tcpSide is what a connection that fell back holds instead of a queue
// pair: the socket (TLS's when WithTLS), and its end.
type tcpSide struct {
	sock net.Conn // the handshake's connection: TLS's, or the TCP socket
	nc   net.Conn // what NetConn gives: sock, after what the handshake read ahead
	done chan struct{}
	once sync.Once
	err  error
}

// newTCPConn makes the connection that fell back to TCP over tc, whose
// handshake reads went through br. It holds a reference to eng, for
// Provider, Device, Alloc and PoolStats. It closes tc on failure.
func newTCPConn(eng *engine, cfg config, tc net.Conn, br *bufio.Reader) (*conn, error) {
	if err := eng.Acquire(); err != nil {
		tc.Close()
		return nil, err
	}
	cfg.transport = TCP
	c := &conn{eng: eng, cfg: cfg, local: tc.LocalAddr()}
	c.api.conn = c
	c.rc.Remote = tc.RemoteAddr()
	c.rc.Life.Init(c.rc.Remote)
	c.tcp = &tcpSide{sock: tc, nc: tc, done: make(chan struct{})}
	if n := br.Buffered(); n > 0 {
		// The peer's first bytes came with its answer or hello.
		ahead, _ := br.Peek(n)
		c.tcp.nc = &aheadConn{Conn: tc, ahead: bytes.Clone(ahead)}
	}
	return c, nil
}

// NetConn is the connection that carries the bytes of a Conn whose
// Transport is TCP (WithTCPFallback): the handshake's TCP connection, or
// its TLS session with WithTLS, perhaps wrapped so that bytes the peer
// sent right after the handshake are read first. Close the Conn, not
// it, so that the engine's reference goes too. On an RDMA connection
// (RC or UC) it is nil.
func (c *Conn) NetConn() net.Conn {
	if c.tcp == nil {
		return nil
	}
	return c.tcp.nc
}

// refuseOnTCP fails an RDMA operation of a connection that fell back to
// TCP, at the call.
func (c *conn) refuseOnTCP(what string) error {
	if c.tcp == nil {
		return nil
	}
	return fmt.Errorf("rdma: %s: %w on a connection that fell back to TCP: its bytes go over NetConn (WithTCPFallback)", what, ErrNotSupported)
}

// closeTCP ends a connection that fell back: it closes the socket (reset
// when cause is not nil: Abort) and lets the engine go.
func (c *conn) closeTCP(cause error) error {
	t := c.tcp
	t.once.Do(func() {
		c.rc.Life.CallClose()
		err := fmt.Errorf("rdma: conn %v: %w", c.rc.Remote, ErrClosed)
		if cause != nil {
			err = fmt.Errorf("rdma: conn %v: %w: aborted: %w", c.rc.Remote, ErrClosed, cause)
			raw := t.sock
			if tc, ok := raw.(*tls.Conn); ok {
				raw = tc.NetConn()
			}
			if tc, ok := raw.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
		}
		c.rc.Life.Fail(err)
		if a, ok := t.nc.(*aheadConn); ok {
			a.closed.Store(true)
		}
		if cerr := t.sock.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			t.err = cerr
		}
		close(t.done)
		t.err = errors.Join(t.err, c.eng.Release())
	})
	if cause != nil {
		return nil
	}
	return t.err
}

// aheadConn is a connection whose first bytes were read ahead, with the
// handshake: Read returns them first. Every other method is the
// connection's.
type aheadConn struct {
	net.Conn
	mu      sync.Mutex
	ahead   []byte
	drained atomic.Bool // ahead is empty
	closed  atomic.Bool
}

// take copies into p what is left of the bytes read ahead.
func (a *aheadConn) take(p []byte) int {
	if a.drained.Load() || a.closed.Load() {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n := copy(p, a.ahead)
	a.ahead = a.ahead[n:]
	if len(a.ahead) == 0 {
		a.ahead = nil
		a.drained.Store(true)
	}
	return n
}

func (a *aheadConn) Read(p []byte) (int, error) {
	if len(p) > 0 {
		if n := a.take(p); n > 0 {
			return n, nil
		}
	}
	return a.Conn.Read(p)
}

// WriteTo writes what was read ahead, then what comes, to w.
func (a *aheadConn) WriteTo(w io.Writer) (int64, error) {
	var n int64
	if !a.drained.Load() && !a.closed.Load() {
		a.mu.Lock()
		k, err := w.Write(a.ahead)
		a.ahead = a.ahead[k:]
		if len(a.ahead) == 0 {
			a.ahead = nil
			a.drained.Store(true)
		}
		a.mu.Unlock()
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	var m int64
	var err error
	if wt, ok := a.Conn.(io.WriterTo); ok {
		m, err = wt.WriteTo(w)
	} else {
		m, err = io.Copy(w, struct{ io.Reader }{a.Conn})
	}
	return n + m, err
}

// ReadFrom writes what r gives to the connection.
func (a *aheadConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := a.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{a.Conn}, r)
}

// CloseWrite shuts the connection's writing side.
func (a *aheadConn) CloseWrite() error {
	if cw, ok := a.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("rdma: close write: %w: %T has no CloseWrite", ErrNotSupported, a.Conn)
}
