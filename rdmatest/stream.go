package rdmatest

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// StreamPair returns a connected stream client and server
// (stream.Dial to a stream.Listen listener) with opts on both. Both ends
// are on the engine the process shares for opts, as the package-level
// Dial and Listen are. When the test ends both connections are closed, and each
// Close must succeed. A test may close either itself first.
func StreamPair(t testing.TB, opts ...rdma.Option) (client, server *stream.Conn) {
	t.Helper()
	l, err := stream.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	ln := l.(*stream.Listener)
	defer ln.Close() // if the connect fails the test; Close is idempotent
	c, s := connect(t, ln.Addr().String(), ln.AcceptContext, func(ctx context.Context, address string) (net.Conn, error) {
		return stream.Dial(ctx, "rdma", address, opts...)
	})
	require.NoError(t, ln.Close())
	return c.(*stream.Conn), s.(*stream.Conn)
}
