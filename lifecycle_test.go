package rdma_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// TestLifecycleCounts: an engine counts each connection once when it
// comes up and once when it ends, by how: an orderly close counts as
// closed by the local side on the closing one and by the peer on the
// other; an abort counts as aborted here and as the peer gone there; a
// refused handshake counts on both sides.
func TestLifecycleCounts(t *testing.T) { eachProvider(t, testLifecycleCounts) }

func testLifecycleCounts(t *testing.T, opts []rdma.Option) {
	se, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer ce.Close()
	var refuse atomic.Bool
	ln, err := se.Listen("rdma", "127.0.0.1:0", rdma.WithAcceptCheck(func(rdma.PeerInfo) error {
		if refuse.Load() {
			return errors.New("not you")
		}
		return nil
	}))
	require.NoError(t, err)
	defer ln.Close()
	dial := func(ctx context.Context, address string) (*rdma.Conn, error) { return ce.Dial(ctx, "rdma", address) }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// An orderly close, by the client.
	c, s := rdmatest.Connect(t, ln, dial)
	assert.Equal(t, uint64(1), ce.Stats().Lifecycle.Opened)
	assert.Equal(t, uint64(1), se.Stats().Lifecycle.Opened)
	require.NoError(t, c.Close())
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("the server did not hear the close")
	}
	require.NoError(t, s.Close())
	cl, sl := ce.Stats().Lifecycle, se.Stats().Lifecycle
	assert.Equal(t, rdma.LifecycleStats{Opened: 1, ClosedLocal: 1}, cl)
	assert.Equal(t, rdma.LifecycleStats{Opened: 1, ClosedPeer: 1}, sl)

	// An abort, by the client.
	c, s = rdmatest.Connect(t, ln, dial)
	require.NoError(t, c.Abort(errors.New("test abort")))
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("the server did not hear the abort")
	}
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	cl, sl = ce.Stats().Lifecycle, se.Stats().Lifecycle
	assert.Equal(t, rdma.LifecycleStats{Opened: 2, ClosedLocal: 1, Aborted: 1}, cl)
	assert.Equal(t, rdma.LifecycleStats{Opened: 2, ClosedPeer: 1, PeerGone: 1}, sl)

	// A refused handshake: counted on both sides, no connection opened.
	refuse.Store(true)
	_, err = ce.Dial(ctx, "rdma", ln.Addr().String())
	require.ErrorIs(t, err, rdma.ErrRefused)
	assert.Equal(t, uint64(1), ce.Stats().Lifecycle.HandshakeRefused)
	assert.Equal(t, uint64(2), ce.Stats().Lifecycle.Opened)
	require.Eventually(t, func() bool { return se.Stats().Lifecycle.HandshakeRefused == 1 }, 10*time.Second, time.Millisecond,
		"the listener counts the handshake it refused")
	assert.Equal(t, uint64(2), se.Stats().Lifecycle.Opened)
}
