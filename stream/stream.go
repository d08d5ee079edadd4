// Package stream gives Go programs a net.Conn and a net.Listener over
// RDMA: net/http, gRPC and any other net.Conn user run over RDMA by
// swapping their listener and dialer for this package's.
//
// It is built on the public API of package rdma alone (a protocol of the
// user's own could be built the same way): each stream is an *rdma.Conn
// whose hello names the stream's protocol and version (rdma.WithProtocol),
// so a stream dial to a plain async-API listener, or to a stream of
// another version, is refused at the dial with an error that names both.
// Where there is no RDMA device, a stream falls back to TCP
// (rdma.WithTCPFallback, Conn.Transport).
// See docs/stream.md for the protocol, its flow control and its figures.
package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/go-rdma/rdma"
)

// This file holds the API: Dial, Listen, Dialer and ListenConfig. The
// connection itself is in conn.go, its protocol in ring.go.

// Protocol is the name (and version) the stream gives its connections'
// hello (rdma.WithProtocol). Only peers that name it connect.
const Protocol = "go-rdma-stream/2"

// Dial connects to a stream listener (Listen) at address ("host:port")
// over network "rdma" and returns a net.Conn; its concrete type is
// *Conn. opts configure the connection as for rdma.Dial (provider,
// device, queue depths ...); its ring is DefaultRingSize (Dialer.RingSize
// sets another). Where a side has no RDMA device and the provider is
// "auto" (the default), the stream falls back to TCP: its bytes go over
// the handshake's TCP connection (Conn.Transport says so;
// rdma.WithTCPFallback(false) among opts turns that off). On error the
// net.Conn is nil; a dial that ran out of time (the context's deadline,
// WithHandshakeTimeout) fails with a *net.OpError whose Timeout() is
// true.
func Dial(ctx context.Context, network, address string, opts ...rdma.Option) (net.Conn, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", rdma.ErrInvalid, network)}
	}
	s, err := dial(ctx, nil, address, 0, opts)
	if err != nil {
		return nil, err // a nil net.Conn, not one holding a nil *Conn
	}
	return s, nil
}

func dial(ctx context.Context, eng *rdma.Engine, address string, ringSize int, opts []rdma.Option) (*Conn, error) {
	ringSize, err := checkRingSize(ringSize)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rdma", Err: err}
	}
	opts = streamOptions(opts)
	var c *rdma.Conn
	if eng != nil {
		var copts []rdma.ConnOption
		if copts, err = engineOptions[rdma.ConnOption](opts); err != nil {
			return nil, &net.OpError{Op: "dial", Net: "rdma", Err: err}
		}
		c, err = eng.Dial(ctx, "rdma", address, copts...)
	} else {
		c, err = rdma.Dial(ctx, "rdma", address, opts...)
	}
	if err != nil {
		return nil, err
	}
	s, err := newStream(c, ringSize)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rdma", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return s, nil
}

// streamOptions are the caller's options after the stream's defaults,
// which they override, and before the stream's protocol name, which they
// cannot. The TCP fallback is one of the defaults: where a side has no
// RDMA device, the stream's bytes go over TCP (fallback.go). The default
// send depth leaves room for the few messages a stream has in flight:
// its WRITEs gather behind one another. Its messages carry at most a
// header and a hello (its bytes go by WRITE into the ring), so its
// receives are that small, not the async API's 64 KiB, and a window of
// 128 of them costs 8 KiB of the engine's shared receives. The window is
// that wide because message credits go back in batches of an eighth of
// it, each an RDMA WRITE that the reader posts on its way to its reply:
// with 32, one message in 4 of a ping-pong paid one, on rxe a system
// call ahead of the reply (the round trip with Adaptive pollers 42-45 %
// longer, typical; TestStreamPingPongCreditWrites).
func streamOptions(opts []rdma.Option) []rdma.Option {
	// The stream's defaults are connection options, which every kind of
	// Dial and Listen takes.
	all := make([]rdma.Option, 0, len(opts)+4)
	all = append(all, rdma.WithQueueDepth(64, 128), rdma.WithMaxMessage(maxMessage), rdma.WithTCPFallback(true))
	all = append(all, opts...)
	return append(all, rdma.WithProtocol(Protocol))
}

// engineOptions are opts as an Engine's Dial (O is rdma.ConnOption) or
// Listen (rdma.ListenOption) takes them: an option that sets up an
// engine has no place there.
func engineOptions[O rdma.Option](opts []rdma.Option) ([]O, error) {
	out := make([]O, 0, len(opts))
	for _, o := range opts {
		if o == nil {
			continue
		}
		x, ok := o.(O)
		if !ok {
			return nil, fmt.Errorf("rdma: stream: %w: an engine option (%T) with Engine set: give it to rdma.OpenEngine", rdma.ErrInvalid, o)
		}
		out = append(out, x)
	}
	return out, nil
}

// streamReserve is how many send slots a stream leaves free of its own
// messages: for the credit and fin messages that must never wait behind
// data.
const streamReserve = 2

// maxMessage is the size of a stream's receives: its largest message,
// header mode's hello (44 bytes), rounded up to the smallest the async
// API takes.
const maxMessage = 64

var _ [maxMessage - hdrSize - helloSize]struct{} // the hello fits

// minWindow is the smallest receive window of the peer's a stream in
// header mode works with: half of it for data, the rest for credits.
const minWindow = 4

// checkDepths refuses queue depths too small for a stream.
func checkDepths(send, recv int) error {
	if send <= 2*streamReserve || recv <= 2*streamReserve {
		return fmt.Errorf("rdma: stream: %w: queue depths %d/%d (a stream needs more than %d each)", rdma.ErrInvalid, send, recv, 2*streamReserve)
	}
	return nil
}

// checkRingSize is the ring size to use for size (0: the default), or
// why it cannot be used.
func checkRingSize(size int) (int, error) {
	if size == 0 {
		return DefaultRingSize, nil
	}
	if size < MinRingSize || size > MaxRingSize {
		return 0, fmt.Errorf("rdma: stream: %w: ring of %d bytes (a ring has %d to %d)", rdma.ErrInvalid, size, MinRingSize, MaxRingSize)
	}
	return size, nil
}

// Dialer dials stream connections. Its DialContext fits
// http.Transport.DialContext and, wrapped, grpc.WithContextDialer.
type Dialer struct {
	// Options configure each connection (provider, device, message
	// size, queue depths ...).
	Options []rdma.Option
	// Timeout bounds each dial, as net.Dialer's does: the TCP connect,
	// the handshake and the stream's hello. Zero means no bound other
	// than the context's and the handshake's (WithHandshakeTimeout). A
	// dial it ends fails with a *net.OpError whose Timeout() is true,
	// matching context.DeadlineExceeded.
	Timeout time.Duration
	// Engine, if not nil, is the engine the connections are made on
	// (rdma.Engine.Dial), shared with whatever else uses it; Options
	// must then not set the engine's own settings. Nil means the
	// package-level rdma.Dial's shared engines.
	Engine *rdma.Engine
	// RingSize is the size in bytes of the receive ring each
	// connection exposes to its peer, MinRingSize to MaxRingSize; the
	// peer writes at most that much ahead of this side's Reads. Zero
	// means DefaultRingSize.
	RingSize int
}

// DialContext connects to address like Dial. network may be "rdma", or
// "tcp", "tcp4" or "tcp6" as http.Transport passes them: the connection
// is a stream in every case (address names the listener's TCP port,
// which carries the handshake), over RDMA or, where there is none, its
// TCP fallback.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "rdma", "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", rdma.ErrInvalid, network)}
	}
	if d.Timeout < 0 {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: negative Timeout %v", rdma.ErrInvalid, d.Timeout)}
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	s, err := dial(ctx, d.Engine, address, d.RingSize, d.Options)
	if err != nil {
		return nil, err // a nil net.Conn, not one holding a nil *Conn
	}
	return s, nil
}

// Dial is DialContext with a background context.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// Compile-time checks: the stream is a net.Conn and a net.Listener.
var (
	_ net.Conn      = (*Conn)(nil)
	_ io.ReaderFrom = (*Conn)(nil)
	_ io.WriterTo   = (*Conn)(nil)
	_ net.Listener  = (*Listener)(nil)
)

// Listener accepts stream connections. It is a net.Listener.
type Listener struct {
	l        *rdma.Listener
	ringSize int
}

// Listen listens for stream connections on address over network "rdma".
// The listener's Accept returns *Conn values as net.Conn. A dialer that
// does not speak the stream (a plain rdma.Dial) is refused at its dial.
func Listen(network, address string, opts ...rdma.Option) (net.Listener, error) {
	lc := ListenConfig{Options: opts}
	return lc.Listen(context.Background(), network, address)
}

// ListenConfig holds the settings of a stream listener, as
// net.ListenConfig does.
type ListenConfig struct {
	// Options configure the listener and the connections it accepts.
	Options []rdma.Option
	// Engine, if not nil, is the engine the listener and its
	// connections are on (rdma.Engine.Listen); Options must then not set
	// the engine's own settings. Nil means the package-level
	// rdma.Listen's shared engines.
	Engine *rdma.Engine
	// RingSize is the receive ring of each accepted connection, as
	// Dialer.RingSize.
	RingSize int
}

// Listen listens for stream connections on address over network "rdma".
// ctx is not used after Listen returns, as with net.ListenConfig.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", rdma.ErrInvalid, network)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	ringSize, err := checkRingSize(lc.RingSize)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	opts := streamOptions(lc.Options)
	var l *rdma.Listener
	if lc.Engine != nil {
		var lopts []rdma.ListenOption
		if lopts, err = engineOptions[rdma.ListenOption](opts); err != nil {
			return nil, &net.OpError{Op: "listen", Net: network, Err: err}
		}
		l, err = lc.Engine.Listen(network, address, lopts...)
	} else {
		l, err = rdma.Listen(network, address, opts...)
	}
	if err != nil {
		return nil, err
	}
	err = checkTransport(l.Transport())
	if err == nil {
		err = checkDepths(l.QueueDepth())
	}
	if err != nil {
		l.Close()
		return nil, &net.OpError{Op: "listen", Net: network, Addr: l.Addr(), Err: err}
	}
	return &Listener{l: l, ringSize: ringSize}, nil
}

// Accept waits for the next connection. Close unblocks it with an error
// wrapping net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	return l.AcceptContext(context.Background())
}

// AcceptContext waits for the next connection, for ctx to end, or for
// Close.
func (l *Listener) AcceptContext(ctx context.Context) (net.Conn, error) {
	for {
		c, err := l.l.Accept(ctx)
		if err != nil {
			return nil, err
		}
		s, err := newStream(c, l.ringSize)
		if err != nil {
			// This peer's connection is unusable as a stream; the
			// listener goes on, as it does after a failed handshake.
			continue
		}
		return s, nil
	}
}

// Close stops listening. Connections already accepted stay open.
func (l *Listener) Close() error { return l.l.Close() }

// Addr is the listener's address (its TCP port carries the handshake).
func (l *Listener) Addr() net.Addr { return l.l.Addr() }

// RDMAListener is the underlying listener of the async API.
func (l *Listener) RDMAListener() *rdma.Listener { return l.l }

// Errors the stream returns inside its *net.OpError values.
var (
	// errWriteClosed: Write after CloseWrite, as TCP's EPIPE.
	errWriteClosed = fmt.Errorf("write after CloseWrite: %w", syscall.EPIPE)
)

// resetError is the error of a stream whose peer went away without an
// orderly close (or broke the protocol): it matches syscall.ECONNRESET
// and the cause.
type resetError struct{ cause error }

func (e *resetError) Error() string {
	return "connection reset by peer: " + e.cause.Error()
}

func (e *resetError) Unwrap() []error { return []error{syscall.ECONNRESET, e.cause} }

func streamReset(cause error) error {
	var re *resetError
	if errors.As(cause, &re) {
		return cause
	}
	return &resetError{cause: cause}
}
