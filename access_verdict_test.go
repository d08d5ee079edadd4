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

// A killed peer's kernel deregisters its memory before it closes its
// sockets, so a WRITE in flight to it fails with REM_ACCESS_ERR a moment
// before its control channel ends. Rule: that WRITE, and the connection,
// fail with ErrPeerLost (the access error in the chain), as every other
// operation to a dead peer does; CI saw TestStreamPeerKilled/verbs read
// a plain REM_ACCESS_ERR on rxe. Here the peer hears nothing (it cannot
// answer the ping) and its socket then ends under it.
func TestAccessErrorOfDeadPeer(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, region := writableRegion(t, c, s)
	require.NoError(t, c.Write(src, region).Wait(ctx))

	rdma.Deafen(s) // a dying process answers nothing
	region.RKey ^= 0xff
	w := c.Write(src, region)
	require.Eventually(t, func() bool { return rdma.AwaitsVerdict(c) }, 20*time.Second, time.Millisecond,
		"the refused WRITE did not wait for the control channel's word")
	rdma.CutControl(s)
	err := w.Wait(ctx)
	require.ErrorIs(t, err, rdma.ErrPeerLost)
	assert.ErrorIs(t, err, rdma.ErrRemoteAccess, "the completion stays in the chain")
	<-c.Done()
	assert.ErrorIs(t, c.Err(), rdma.ErrPeerLost)
}

// A live peer answers the ping at once: a WRITE it refused fails with
// its own error (ErrRemoteAccess, not ErrPeerLost, which the verdict's
// bound alone would have given) and so does the connection.
func TestAccessErrorOfLivePeer(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, region := writableRegion(t, c, s)
	region.RKey ^= 0xff
	err := c.Write(src, region).Wait(ctx)
	require.ErrorIs(t, err, rdma.ErrRemoteAccess)
	assert.NotErrorIs(t, err, rdma.ErrPeerLost)
	assert.NotErrorIs(t, c.Err(), rdma.ErrPeerLost)
	assert.ErrorIs(t, c.Err(), rdma.ErrRemoteAccess)
}

// A peer's pings cost this side at most one answer queued: a flood of
// them is no protocol error, and the connection keeps working.
func TestPingFlood(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 10000 {
		require.NoError(t, rdma.SendControl(s, rdma.CtrlPing, nil))
	}
	require.NoError(t, rdma.SendControl(s, rdma.CtrlPong, nil), "an answer nobody asked for")
	b, err := s.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	require.NoError(t, s.Send(b).Wait(ctx))
	f := c.Recv()
	require.NoError(t, f.Wait(ctx))
	f.Buffer().Release()
	assert.NoError(t, c.Err())
	assert.NoError(t, s.Err())
}

// A control frame written to a peer whose socket is gone fails the
// connection with the peer's end (ErrPeerLost), as the reader would
// have: TestManyConnsPeerKilled saw a pending Recv fail with "control
// channel: write: connection reset by peer" when a write found the dead
// peer before the reader did. Here the reader is held while the peer's
// socket ends.
func TestControlWriteToDeadPeer(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	release := rdma.SlowControl(c)
	defer release()
	rdma.CutControl(s)
	var err error
	for range 1000 {
		if err = rdma.SendControl(c, rdma.CtrlPing, nil); err != nil {
			break
		}
	}
	require.Error(t, err, "writes to a closed socket kept succeeding")
	assert.ErrorIs(t, err, rdma.ErrPeerLost)
	assert.ErrorIs(t, c.Err(), rdma.ErrPeerLost)
}

// writableRegion is 64 bytes of s's memory exposed for c's WRITEs, and
// 64 bytes of c's to write from; both go back at the test's end.
func writableRegion(t *testing.T, c, s *rdma.Conn) (*rdma.Buffer, rdma.RemoteRegion) {
	t.Helper()
	dst, err := s.Alloc(64)
	require.NoError(t, err)
	t.Cleanup(func() { dst.Release() })
	region, err := s.Expose(dst, rdma.RemoteWrite)
	require.NoError(t, err)
	src, err := c.Alloc(64)
	require.NoError(t, err)
	t.Cleanup(func() { src.Release() })
	return src, region
}
