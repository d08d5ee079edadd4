package rdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: the package-level Dial and Listen of one process share one
// engine per device port: one pool, so a buffer received on one
// connection can be sent on another without a copy (a proxy), and a
// listener's Alloc works on a connection it dialed.
func TestSharedEngine(t *testing.T) { eachProvider(t, testSharedEngine) }

func testSharedEngine(t *testing.T, opts []rdma.Option) {
	// A proxy listens for a client and dials a backend; all in one
	// process, so all on one engine.
	front, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer front.Close()
	back, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer back.Close()
	dial := func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", addr, opts...)
	}
	client, proxyIn := rdmatest.Connect(t, front, dial)
	proxyOut, backend := rdmatest.Connect(t, back, dial)
	require.Equal(t, front.PoolStats(), proxyOut.PoolStats(), "one pool")

	msg, err := client.Alloc(5)
	require.NoError(t, err)
	defer msg.Release()
	copy(msg.Bytes(), "hello")
	in := proxyIn.Recv()
	wait(t, client.Send(msg))
	wait(t, in)
	got := in.Buffer()
	out := backend.Recv()
	wait(t, proxyOut.Send(got)) // forwarded as it came: no copy
	require.NoError(t, got.Release())
	wait(t, out)
	require.Equal(t, "hello", string(out.Buffer().Bytes()))
	require.NoError(t, out.Buffer().Release())

	b, err := front.Alloc(64)
	require.NoError(t, err)
	wait(t, proxyOut.Send(b))
	require.NoError(t, b.Release())
	r := backend.Recv()
	wait(t, r)
	require.NoError(t, r.Buffer().Release())
}

// Rule: an Engine is an explicit handle: its Dial, Listen and Alloc share
// its pool; options of the engine itself belong to OpenEngine; Close
// stops new use while its connections stay up.
func TestEngineHandle(t *testing.T) { eachProvider(t, testEngineHandle) }

func testEngineHandle(t *testing.T, opts []rdma.Option) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	assert.Equal(t, uint8(1), e.Port())
	assert.NotEmpty(t, e.Device())
	ln, err := e.Listen("rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, s := rdmatest.Connect(t, ln, func(ctx context.Context, addr string) (*rdma.Conn, error) {
		return e.Dial(ctx, "rdma", addr, rdma.WithQueueDepth(16, 16))
	})
	assert.Equal(t, e.Device(), c.Device())
	b, err := e.Alloc(8)
	require.NoError(t, err)
	r := s.Recv()
	wait(t, c.Send(b))
	wait(t, r)
	require.NoError(t, r.Buffer().Release())
	require.NoError(t, b.Release())
	// One pool: the two snapshots agree once the shared receive queue's
	// refill after the message is done (it may run between them).
	assert.Eventually(t, func() bool { return e.PoolStats() == ln.PoolStats() }, 10*time.Second, time.Millisecond,
		"engine %+v, listener %+v", e.PoolStats(), ln.PoolStats())

	require.NoError(t, e.Close())
	_, err = e.Dial(ctx, "rdma", ln.Addr().String())
	require.ErrorIs(t, err, rdma.ErrClosed)
	_, err = e.Alloc(8)
	require.ErrorIs(t, err, rdma.ErrClosed)
	b, err = c.Alloc(8) // the connection stays up
	require.NoError(t, err)
	r = s.Recv()
	wait(t, c.Send(b))
	wait(t, r)
	require.NoError(t, r.Buffer().Release())
	require.NoError(t, b.Release())

	_, err = rdma.OpenEngine(append(engineOpts(opts), rdma.WithPort(2))...)
	require.ErrorIs(t, err, rdma.ErrNoDevice)
}

// Rule: a connection tells that it ended, and why, without an operation
// posted: Done closes and Err matches ErrPeerClosed when the peer closes.
func TestConnDone(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	select {
	case <-s.Done():
		t.Fatal("done before anything ended")
	default:
	}
	require.NoError(t, s.Err())
	require.NoError(t, c.Close())
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the peer's close was not noticed")
	}
	require.ErrorIs(t, s.Err(), rdma.ErrPeerClosed)
	require.ErrorIs(t, c.Err(), rdma.ErrClosed)
}
