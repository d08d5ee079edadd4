package rdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule (Expose's godoc, docs/security.md): a region is registered in the
// engine's protection domain, so its rkey is good on every connection of
// that engine, not only on the one it was exposed on. A second client of
// the same server engine, which was never sent the region, writes into
// it; a revoke ends that for every connection.
func TestExposeReachesEveryConnOfTheEngine(t *testing.T) {
	eachProvider(t, testExposeReachesEveryConnOfTheEngine)
}

func testExposeReachesEveryConnOfTheEngine(t *testing.T, opts []rdma.Option) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server := openEngine(t, opts)
	ln, err := server.Listen("rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	// Two clients, each on an engine of its own as in two processes.
	c1, s1 := rdmatest.Connect(t, ln, dialer(openEngine(t, opts)))
	c2, _ := rdmatest.Connect(t, ln, dialer(openEngine(t, opts)))

	mem, err := s1.Alloc(64)
	require.NoError(t, err)
	defer mem.Release()
	region, err := s1.Expose(mem, rdma.RemoteWrite)
	require.NoError(t, err)
	require.NoError(t, s1.SendRegion(ctx, region))
	got, err := c1.RecvRegion(ctx)
	require.NoError(t, err)
	require.Equal(t, region, got)

	// c2 was never sent the region: it has its address and rkey as a
	// peer that learned or guessed them would.
	src, err := c2.Alloc(64)
	require.NoError(t, err)
	defer src.Release()
	const text = "written through another connection"
	copy(src.Bytes(), text)
	require.NoError(t, c2.Write(src, region).Wait(ctx),
		"an rkey works on every connection of the engine that exposed it")
	require.Equal(t, text, string(mem.Bytes()[:len(text)]))

	// A connection of another engine, whose protection domain is its own,
	// cannot use the rkey: that is how tenants are kept apart today.
	other := openEngine(t, opts)
	ln2, err := other.Listen("rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln2.Close()
	c3, _ := rdmatest.Connect(t, ln2, dialer(openEngine(t, opts)))
	src3, err := c3.Alloc(64)
	require.NoError(t, err)
	defer src3.Release()
	require.ErrorIs(t, c3.Write(src3, region).Wait(ctx), rdma.ErrRemoteAccess)

	// Revoke deregisters the memory: the rkey is then dead on every
	// connection. c2 was never told, so its access goes out and fails at
	// the target.
	require.NoError(t, s1.Revoke(ctx, region))
	src1, err := c1.Alloc(64)
	require.NoError(t, err)
	defer src1.Release()
	require.ErrorIs(t, c1.Write(src1, region).Wait(ctx), rdma.ErrRegionRevoked)
	require.ErrorIs(t, c2.Write(src, region).Wait(ctx), rdma.ErrRemoteAccess)
}

// openEngine opens an engine that is closed when the test ends, after the
// connections made on it (cleanups run last first).
func openEngine(t *testing.T, opts []rdma.Option) *rdma.Engine {
	t.Helper()
	e, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// dialer dials from e, for rdmatest.Connect.
func dialer(e *rdma.Engine) func(ctx context.Context, address string) (*rdma.Conn, error) {
	return func(ctx context.Context, address string) (*rdma.Conn, error) {
		return e.Dial(ctx, "rdma", address)
	}
}
