package rdma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: no byte an earlier owner wrote ever shows through a new buffer,
// by any call: not through Alloc, not through SetLen up to Cap, not
// through a received buffer grown past its message, and not across
// connections that share a pool.
func TestNoStaleBytes(t *testing.T) { eachProvider(t, testNoStaleBytes) }

func testNoStaleBytes(t *testing.T, opts []rdma.Option) {
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Two peers of one listener share its pool.
	var peers, served [2]*rdma.Conn
	dial := func(ctx context.Context, address string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", address, opts...)
	}
	for i := range peers {
		peers[i], served[i] = rdmatest.Connect(t, ln, dial)
	}
	zero := func(t *testing.T, b *rdma.Buffer) {
		t.Helper()
		require.NoError(t, b.SetLen(b.Cap()))
		require.True(t, bytes.Count(b.Bytes(), []byte{0}) == b.Cap(), "a grown buffer shows %d non-zero bytes of an earlier owner", b.Cap()-bytes.Count(b.Bytes(), []byte{0}))
	}

	// A small buffer, written to its capacity and released, comes back
	// zero to its capacity.
	for _, n := range []int{10, 32769} {
		b, err := ln.Alloc(n)
		require.NoError(t, err)
		require.NoError(t, b.SetLen(b.Cap()))
		for i := range b.Bytes() {
			b.Bytes()[i] = 0xa5
		}
		require.NoError(t, b.Release())
		b, err = served[1].Alloc(n)
		require.NoError(t, err)
		zero(t, b)
		require.NoError(t, b.Release())
	}

	// Peer 0 sends a full message; the receive buffer goes back to the
	// pool; then peer 1 sends a short one and the receiver, and any Alloc
	// of the same size, grow their buffers to the capacity.
	big, err := peers[0].Alloc(served[0].MaxMessage())
	require.NoError(t, err)
	for i := range big.Bytes() {
		big.Bytes()[i] = 0x5a
	}
	require.NoError(t, peers[0].Send(big).Wait(ctx))
	require.NoError(t, big.Release())
	r := served[0].Recv()
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, served[0].MaxMessage(), r.Len())
	require.NoError(t, r.Buffer().Release())

	small, err := peers[1].Alloc(10)
	require.NoError(t, err)
	copy(small.Bytes(), "0123456789")
	for range 64 { // past every receive posted, so recycled ones are used
		require.NoError(t, peers[1].Send(small).Wait(ctx))
		r := served[1].Recv()
		require.NoError(t, r.Wait(ctx))
		got := r.Buffer()
		require.Equal(t, "0123456789", string(got.Bytes()))
		require.NoError(t, got.SetLen(got.Cap()))
		require.Equal(t, got.Cap()-10, bytes.Count(got.Bytes()[10:], []byte{0}), "a received buffer shows an earlier message past its length")
		require.NoError(t, got.Release())
		a, err := served[1].Alloc(32769)
		require.NoError(t, err)
		zero(t, a)
		require.NoError(t, a.Release())
	}
	require.NoError(t, small.Release())
}
