package rdmatest

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// StreamPair returns a connected stream client and server
// (rdma.DialStream to an rdma.ListenStream listener) with opts on both.
// The stream API has no engine of its own to give, so both ends are on
// the engine the process shares for opts, as the package-level Dial and
// Listen are. When the test ends both connections are closed, and each
// Close must succeed. A test may close either itself first.
func StreamPair(t testing.TB, opts ...rdma.Option) (client, server *rdma.StreamConn) {
	t.Helper()
	l, err := rdma.ListenStream("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	ln := l.(*rdma.StreamListener)
	defer ln.Close() // if the connect fails the test; Close is idempotent
	c, s := connect(t, ln.Addr().String(), ln.AcceptContext, func(ctx context.Context, address string) (net.Conn, error) {
		return rdma.DialStream(ctx, "rdma", address, opts...)
	})
	require.NoError(t, ln.Close())
	return c.(*rdma.StreamConn), s.(*rdma.StreamConn)
}
