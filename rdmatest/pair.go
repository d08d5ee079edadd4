package rdmatest

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// connectTimeout bounds a dial and its accept. It is there to turn a hang
// into a failure; an emulated device (rxe in a VM) connects in well under
// a second.
const connectTimeout = 20 * time.Second

// Pair returns a connected client and server. Each is on an engine of its
// own (rdma.OpenEngine), as they would be in two processes: their buffer
// pools, completion queues and pollers are apart, so the test sees what a
// peer in another process would. opts configure both engines (the
// engine options), both connections (the connection options: provider,
// queue depths, message size, handlers ...) and the listener (the
// listener options). When the test ends both connections are closed,
// then both engines, and each Close must succeed. A test may close
// either connection itself first.
func Pair(t testing.TB, opts ...rdma.Option) (client, server *rdma.Conn) {
	t.Helper()
	eopts, copts, lopts := Split(opts)
	se := openEngine(t, eopts)
	ce := openEngine(t, eopts)
	ln, err := se.Listen("rdma", "127.0.0.1:0", lopts...)
	require.NoError(t, err)
	defer ln.Close() // if Connect fails the test; Close is idempotent
	client, server = Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return ce.Dial(ctx, "rdma", address, copts...)
	})
	require.NoError(t, ln.Close())
	return client, server
}

// Split sorts opts by what takes them: OpenEngine (engine), an Engine's
// Dial (conn) and an Engine's Listen (listen: the listener's own and the
// connection options). An option of two kinds (rdma.WithLogger) goes to
// each.
func Split(opts []rdma.Option) (engine []rdma.EngineOption, conn []rdma.ConnOption, listen []rdma.ListenOption) {
	for _, o := range opts {
		if e, ok := o.(rdma.EngineOption); ok {
			engine = append(engine, e)
		}
		if c, ok := o.(rdma.ConnOption); ok {
			conn = append(conn, c)
		}
		if l, ok := o.(rdma.ListenOption); ok {
			listen = append(listen, l)
		}
	}
	return engine, conn, listen
}

// openEngine opens an engine that is closed when the test ends, after
// the connections made on it (cleanups run last first).
func openEngine(t testing.TB, opts []rdma.EngineOption) *rdma.Engine {
	t.Helper()
	e, err := rdma.OpenEngine(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.Close(), "close engine %s", e.Device()) })
	return e
}

// Connect dials ln with dial while ln accepts, and returns what dial
// returned as client and what ln accepted as server. dial is a closure
// over rdma.Dial or an engine's Dial, such as
//
//	func(ctx context.Context, address string) (*rdma.Conn, error) {
//		return rdma.Dial(ctx, "rdma", address, opts...)
//	}
//
// When the test ends both connections are closed, and each Close must
// succeed; ln stays the caller's. Connect is for a listener with options
// of its own (rdma.WithRecvHandler on the server only) or engines the
// test shares between connections; Pair makes its own.
func Connect(t testing.TB, ln *rdma.Listener, dial func(ctx context.Context, address string) (*rdma.Conn, error)) (client, server *rdma.Conn) {
	t.Helper()
	return connect(t, ln.Addr().String(), ln.Accept, dial)
}

// connect runs accept and dial at once, as a connection's two ends must,
// and registers the close of both. On a failure it closes what did
// connect and waits for the accept, so that a failed test leaves no
// goroutine behind.
func connect[C io.Closer](t testing.TB, address string, accept func(context.Context) (C, error), dial func(context.Context, string) (C, error)) (client, server C) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	type accepted struct {
		c   C
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := accept(ctx)
		acc <- accepted{c, err}
	}()
	client, err := dial(ctx, address)
	if err != nil {
		cancel() // ends the accept
	}
	a := <-acc
	if err != nil || a.err != nil {
		if err == nil {
			client.Close()
		}
		if a.err == nil {
			a.c.Close()
		}
		require.NoError(t, err, "dial %s", address)
		require.NoError(t, a.err, "accept on %s", address)
	}
	t.Cleanup(func() {
		assert.NoError(t, client.Close(), "close the client")
		assert.NoError(t, a.c.Close(), "close the server")
	})
	return client, a.c
}
