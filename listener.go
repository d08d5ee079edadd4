package rdma

import (
	"bufio"
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/loglimit"
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Listener accepts RDMA connections. Every connection it accepts shares
// its device context, protection domain, completion pollers and buffer
// pool.
type Listener struct {
	ln   net.Listener    // go-rdma's handshake over TCP
	cmln *ibv.CMListener // or rdma_cm
	addr net.Addr
	eng  *engine
	cfg  config
	ctx  context.Context // ends at Close
	stop context.CancelFunc

	logLimit loglimit.Limiter // refused handshakes, for their log
	hs       *handshakes      // the handshakes holding a queue pair

	conns     chan *conn
	hmu       sync.Mutex
	hellos    list.List // accepted sockets waiting for their hello
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// maxHandshakes bounds the connections a Listener sets up at once, after
// their hello: each holds a queue pair and its receives until the dialer
// finishes (bounded by WithHandshakeTimeout, and by busyGrace while
// other hellos wait).
const maxHandshakes = 64

// maxHellos bounds the accepted sockets waiting for their hello; each
// costs a goroutine and a file descriptor, nothing more. Past the bound
// the one that has waited longest is dropped: a dialer sends its hello at
// once, so idle sockets cannot keep a real client out.
const maxHellos = 1024

// Listen listens for RDMA connections on address ("host:port") over
// network "rdma". The handshake with each peer runs in the background;
// Accept returns connections that completed it.
func Listen(network, address string, opts ...Option) (*Listener, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	cfg := defaultConfig()
	if err := applyOptions(&cfg, opts); err != nil {
		return nil, err
	}
	return listen(nil, cfg, address)
}

// listen listens on address with eng, or, when eng is nil, with the
// shared engine of the device that serves the listening address.
func listen(eng *engine, cfg config, address string) (*Listener, error) {
	const network = "rdma"
	if err := cfg.checkSecurity(false); err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if cfg.cm {
		l, err := listenCM(eng, cfg, address)
		if err != nil {
			return nil, &net.OpError{Op: "listen", Net: network, Err: err}
		}
		return l, nil
	}
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if eng, err = engineFor(eng, cfg, rc.AddrIP(ln.Addr())); err != nil {
		ln.Close()
		return nil, &net.OpError{Op: "listen", Net: network, Addr: ln.Addr(), Err: err}
	}
	if err := eng.Lacks(verbs.FeatureManualConnect); err != nil {
		eng.Release()
		ln.Close()
		return nil, &net.OpError{Op: "listen", Net: network, Addr: ln.Addr(), Err: fmt.Errorf("rdma: %w; dial and listen WithRDMACM", err)}
	}
	l := &Listener{ln: ln, eng: eng, cfg: cfg, conns: make(chan *conn), addr: ln.Addr(), hs: newHandshakes(cfg.setup)}
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the listener's address: TCP, or rdma_cm's with WithRDMACM.
func (l *Listener) Addr() net.Addr { return l.addr }

// Provider is "verbs" or "soft".
func (l *Listener) Provider() string { return l.eng.Prov.Name() }

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		tc, err := l.ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		e := l.waitHello(tc)
		l.wg.Add(1)
		go l.serve(tc, e)
	}
}

// waitHello adds tc to the sockets waiting for their hello, dropping the
// oldest when there are maxHellos.
func (l *Listener) waitHello(tc net.Conn) *list.Element {
	l.hmu.Lock()
	defer l.hmu.Unlock()
	if l.hellos.Len() >= maxHellos {
		old := l.hellos.Remove(l.hellos.Front()).(net.Conn)
		old.Close()
	}
	return l.hellos.PushBack(tc)
}

// dropWaiting takes e off the sockets waiting for their hello; a no-op
// if it was dropped.
func (l *Listener) dropWaiting(e *list.Element) {
	l.hmu.Lock()
	l.hellos.Remove(e)
	l.hmu.Unlock()
}

// serve runs the listener's side of one handshake: the hello first, with
// nothing made for the peer; then, in one of maxHandshakes slots, the
// connection.
func (l *Listener) serve(tc net.Conn, e *list.Element) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.setup)
	defer cancel()
	release := bound(ctx, tc, l.cfg.setup)
	defer release()
	if l.cfg.tls != nil {
		// Until the session is up the socket counts among those waiting
		// for their hello: a peer that never finishes TLS costs no more.
		t, err := acceptTLS(ctx, tc, l.cfg.tls)
		if err != nil {
			l.dropWaiting(e)
			l.logRefused(tc.RemoteAddr(), err, false)
			return
		}
		tc = t
	}
	br := bufio.NewReaderSize(tc, ctrlReadBuffer)
	peer, tcp, err := readPeerHello(l.eng, &l.cfg, tc, br)
	l.dropWaiting(e)
	refused := false
	if err == nil {
		var closed bool
		if closed, err = l.checkPeer(ctx, tc, release); closed {
			return // the check's peer is refused when the check returns
		}
		if err != nil {
			rc.WriteRefusal(tc, err.Error())
			refused = true
		}
	}
	if err != nil {
		l.logRefused(tc.RemoteAddr(), err, refused)
		tc.Close()
		return
	}
	if tcp {
		// No queue pair: no handshake slot either.
		c, err := acceptTCP(l.eng, l.cfg, tc, br, release)
		if err != nil {
			l.logRefused(tc.RemoteAddr(), err, false)
			return
		}
		l.deliver(c)
		return
	}
	h, err := l.hs.acquire(ctx)
	if err != nil {
		rc.WriteRefusal(tc, "the listener is busy setting up other connections")
		l.eng.lifecycle.handshakeRefused.Add(1)
		tc.Close()
		return
	}
	// Given up (cancel), the handshake fails at its next read, or at the
	// release of its bound, never after it: a dialer that answers in
	// time is not cut off.
	c, err := acceptConn(l.eng, l.cfg, tc, br, peer, release, func() { h.waiting(cancel) })
	if evicted := h.release(); evicted && err != nil {
		err = fmt.Errorf("rdma: handshake given up: the dialer said nothing for %v while other dialers waited: %w", l.hs.grace, err)
	}
	if err != nil {
		l.logRefused(tc.RemoteAddr(), err, false)
		return // the peer got the reason; the listener goes on
	}
	l.deliver(c)
}

// deliver hands c to Accept, or closes it when the listener closes
// first.
func (l *Listener) deliver(c *conn) {
	select {
	case l.conns <- c:
	case <-l.ctx.Done():
		c.api.Close()
	}
}

// Accept waits for the next connection, or for ctx to end, or for Close.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	select {
	case c := <-l.conns:
		return c.public(), nil
	case <-ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: ctx.Err()}
	case <-l.ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: ErrClosed}
	}
}

// Close stops accepting: the handshakes under way fail, and it returns
// without waiting for accept checks still running (WithAcceptCheck),
// whose peers are refused when the checks return. Connections already
// accepted stay open; the shared resources are freed when the last of
// them closes.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.stop()
		var err error
		if l.ln != nil {
			err = l.ln.Close()
		} else {
			err = l.cmln.Close()
		}
		l.wg.Wait()
		if l.hs != nil {
			l.hs.stop()
		}
		l.closeErr = errors.Join(err, l.eng.Release())
	})
	return l.closeErr
}

// PoolStats reports the buffer pool shared by the listener's
// connections.
func (l *Listener) PoolStats() PoolStats { return PoolStats(l.eng.Pool.Stats()) }

// Alloc returns n bytes of registered memory, zero to its capacity, from
// the pool of the listener's engine, so one buffer can be used, or
// exposed, on any of its connections.
func (l *Listener) Alloc(n int) (*Buffer, error) {
	if l.ctx.Err() != nil {
		return nil, fmt.Errorf("rdma: listener %v: %w", l.addr, ErrClosed)
	}
	return l.eng.alloc(n)
}
