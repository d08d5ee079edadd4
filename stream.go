package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// This file holds the stream API: net.Conn and net.Listener over RDMA.
// The connection itself is in stream_conn.go, its protocol in
// stream_frame.go.

// DialStream connects to a stream listener (ListenStream) at address
// ("host:port") over network "rdma" and returns a net.Conn; its concrete
// type is *StreamConn. opts configure the connection as for Dial:
// WithMaxMessage sets the size of each message, and WithQueueDepth how
// many messages may be in flight (see StreamConn for the memory this
// takes). On error the net.Conn is nil; a dial that ran out of time (the
// context's deadline, WithHandshakeTimeout) fails with a *net.OpError
// whose Timeout() is true.
func DialStream(ctx context.Context, network, address string, opts ...Option) (net.Conn, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	s, err := dialStream(ctx, address, opts)
	if err != nil {
		return nil, err // a nil net.Conn, not one holding a nil *StreamConn
	}
	return s, nil
}

func dialStream(ctx context.Context, address string, opts []Option) (*StreamConn, error) {
	opts = append(streamDefaults(), opts...)
	if err := checkStreamOptions(opts); err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rdma", Err: err}
	}
	c, err := Dial(ctx, "rdma", address, opts...)
	if err != nil {
		return nil, err
	}
	s, err := newStream(c)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rdma", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return s, nil
}

// streamDefaults are the options a stream starts from; the caller's
// options come after them and win. 32 receives of 64 KiB: 2 MiB posted
// per connection, and a window of 23 messages (1.44 MiB) in flight.
func streamDefaults() []Option {
	return []Option{WithQueueDepth(64, 32)}
}

// checkStreamOptions refuses queue depths too small for the stream's
// reserve of messages that are not data (see stream_frame.go).
func checkStreamOptions(opts []Option) error {
	cfg := defaultConfig()
	if err := cfg.apply(opts); err != nil {
		return err
	}
	if cfg.sqDepth <= streamReserve || streamWindow(cfg.rqDepth) < 1 {
		return fmt.Errorf("rdma: stream: %w: queue depths %d/%d (a stream needs more than %d each)", ErrInvalid, cfg.sqDepth, cfg.rqDepth, streamReserve)
	}
	return nil
}

// Dialer dials stream connections. Its DialContext fits
// http.Transport.DialContext and, wrapped, grpc.WithContextDialer.
type Dialer struct {
	// Options configure each connection (provider, device, message
	// size, queue depths ...).
	Options []Option
	// Timeout bounds each dial, as net.Dialer's does: the TCP connect,
	// the handshake and the stream's hello. Zero means no bound other
	// than the context's and the handshake's (WithHandshakeTimeout). A
	// dial it ends fails with a *net.OpError whose Timeout() is true,
	// matching context.DeadlineExceeded.
	Timeout time.Duration
}

// DialContext connects to address like DialStream. network may be
// "rdma", or "tcp", "tcp4" or "tcp6" as http.Transport passes them: the
// connection is RDMA in every case (address names the listener's TCP
// port, which carries the handshake).
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "rdma", "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	if d.Timeout < 0 {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: negative Timeout %v", ErrInvalid, d.Timeout)}
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	s, err := dialStream(ctx, address, d.Options)
	if err != nil {
		return nil, err // a nil net.Conn, not one holding a nil *StreamConn
	}
	return s, nil
}

// Dial is DialContext with a background context.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// Compile-time checks: the stream is a net.Conn and a net.Listener.
var (
	_ net.Conn     = (*StreamConn)(nil)
	_ net.Listener = (*StreamListener)(nil)
)

// StreamListener accepts stream connections. It is a net.Listener.
type StreamListener struct {
	l *Listener
}

// ListenStream listens for stream connections on address over network
// "rdma". The listener's Accept returns *StreamConn values as net.Conn.
func ListenStream(network, address string, opts ...Option) (net.Listener, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	opts = append(streamDefaults(), opts...)
	if err := checkStreamOptions(opts); err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	l, err := Listen(network, address, opts...)
	if err != nil {
		return nil, err
	}
	return &StreamListener{l: l}, nil
}

// Accept waits for the next connection. Close unblocks it with an error
// wrapping net.ErrClosed.
func (l *StreamListener) Accept() (net.Conn, error) {
	return l.AcceptContext(context.Background())
}

// AcceptContext waits for the next connection, for ctx to end, or for
// Close.
func (l *StreamListener) AcceptContext(ctx context.Context) (net.Conn, error) {
	for {
		c, err := l.l.Accept(ctx)
		if err != nil {
			return nil, err
		}
		s, err := newStream(c)
		if err != nil {
			// This peer's connection is unusable as a stream; the
			// listener goes on, as it does after a failed handshake.
			continue
		}
		return s, nil
	}
}

// Close stops listening. Connections already accepted stay open.
func (l *StreamListener) Close() error { return l.l.Close() }

// Addr is the listener's address (its TCP port carries the handshake).
func (l *StreamListener) Addr() net.Addr { return l.l.Addr() }

// Listener is the underlying async API listener.
func (l *StreamListener) Listener() *Listener { return l.l }

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
