package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/pool"
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

	conns     chan *Conn
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// maxHandshakes bounds the handshakes a Listener runs at once, so slow or
// hostile peers cannot make it spawn without bound.
const maxHandshakes = 64

// Listen listens for RDMA connections on address ("host:port") over
// network "rdma". The handshake with each peer runs in the background;
// Accept returns connections that completed it.
func Listen(network, address string, opts ...Option) (*Listener, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	cfg := defaultConfig()
	if err := cfg.apply(opts); err != nil {
		return nil, err
	}
	if cfg.cm {
		l, err := listenCM(cfg, address)
		if err != nil {
			return nil, &net.OpError{Op: "listen", Net: network, Err: err}
		}
		return l, nil
	}
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	eng, err := newEngine(cfg, addrIP(ln.Addr()))
	if err != nil {
		ln.Close()
		return nil, &net.OpError{Op: "listen", Net: network, Addr: ln.Addr(), Err: err}
	}
	l := &Listener{ln: ln, eng: eng, cfg: cfg, conns: make(chan *Conn), addr: ln.Addr()}
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the listener's address: TCP, or rdma_cm's with WithRDMACM.
func (l *Listener) Addr() net.Addr { return l.addr }

// Provider is "verbs" or "soft".
func (l *Listener) Provider() string { return l.eng.prov.Name() }

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	sem := make(chan struct{}, maxHandshakes)
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
		select {
		case sem <- struct{}{}:
		case <-l.ctx.Done():
			tc.Close()
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-sem }()
			c, err := handshake(l.ctx, l.eng, tc, false)
			if err != nil {
				return // the peer got the reason; the listener goes on
			}
			select {
			case l.conns <- c:
			case <-l.ctx.Done():
				c.Close()
			}
		}()
	}
}

// Accept waits for the next connection, or for ctx to end, or for Close.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: ctx.Err()}
	case <-l.ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "rdma", Addr: l.addr, Err: ErrClosed}
	}
}

// Close stops accepting. Connections already accepted stay open; the
// shared resources are freed when the last of them closes.
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
		l.closeErr = errors.Join(err, l.eng.release())
	})
	return l.closeErr
}

// PoolStats reports the buffer pool shared by the listener's
// connections.
func (l *Listener) PoolStats() pool.Stats { return l.eng.pool.Stats() }

// Alloc returns n bytes of registered memory, zero to its capacity, from the pool the
// listener's connections share, so one buffer can be used, or exposed,
// on any of them.
func (l *Listener) Alloc(n int) (*Buffer, error) {
	if l.ctx.Err() != nil {
		return nil, ErrClosed
	}
	if n <= 0 {
		return nil, fmt.Errorf("rdma: alloc %d bytes: %w", n, ErrInvalid)
	}
	pb, err := l.eng.pool.Get(n)
	if err != nil {
		return nil, fmt.Errorf("rdma: alloc %d bytes: %w", n, err)
	}
	return newBuffer(pb), nil
}
