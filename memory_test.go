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

	// Peer 0 sends a full message; its receive buffer goes back to the
	// pool the listener's connections share, and is posted again as a
	// receive for peer 1 (GetReceive: not cleared, since the device
	// writes it). When one of peer 1's short messages lands in it,
	// nothing of the long one shows past the short one's end.
	long := func(from, to int) (addr uint64) {
		t.Helper()
		big, err := peers[from].Alloc(served[to].MaxMessage())
		require.NoError(t, err)
		for i := range big.Bytes() {
			big.Bytes()[i] = 0x5a
		}
		require.NoError(t, peers[from].Send(big).Wait(ctx))
		require.NoError(t, big.Release())
		r := served[to].Recv()
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, served[to].MaxMessage(), r.Len())
		addr = rdma.BufferAddr(r.Buffer())
		require.NoError(t, r.Buffer().Release())
		return addr
	}
	recycled := long(0, 0)
	small, err := peers[1].Alloc(10)
	require.NoError(t, err)
	defer small.Release()
	copy(small.Bytes(), "0123456789")
	reached := false
	for i := 0; i < 1024 && !reached; i++ { // the receives posted before it go first
		require.NoError(t, peers[1].Send(small).Wait(ctx))
		r := served[1].Recv()
		require.NoError(t, r.Wait(ctx))
		got := r.Buffer()
		text := string(got.Bytes())
		reached = rdma.BufferAddr(got) == recycled
		require.NoError(t, got.SetLen(got.Cap()))
		past, zeros := got.Cap()-10, bytes.Count(got.Bytes()[10:], []byte{0})
		require.NoError(t, got.Release())
		require.Equal(t, "0123456789", text)
		require.Equal(t, past, zeros,
			"message %d: a received buffer shows an earlier message past its length (recycled from the long one: %v)", i, reached)
	}
	require.True(t, reached, "no short message landed in the long message's receive buffer")

	// An Alloc that takes a receive buffer just released grows it to
	// its capacity with zeros.
	recycled = long(1, 1)
	a, err := served[1].Alloc(served[1].MaxMessage())
	require.NoError(t, err)
	require.Equal(t, recycled, rdma.BufferAddr(a), "the Alloc did not take the long message's receive buffer")
	zero(t, a)
	require.NoError(t, a.Release())
}
