package soft

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// TestLargeLocalWRsOverlap: an in-process WR over postRemoteMax runs in
// PostSend's goroutine unless the poster pipelines (overlaps): it posts
// before polling the completions of its earlier large WRs. Then the
// worker copies it. Order and data are the same either way.
func TestLargeLocalWRsOverlap(t *testing.T) {
	t.Setenv(EnvTransport, "")
	a, b := pair(t, verbs.RC, connOpt{})
	q := a.qp.(*qp)
	handoffs := func() uint64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.handoffs
	}
	const n = postRemoteMax + 1
	require.GreaterOrEqual(t, len(a.buf), 3*n)
	for i := range a.buf {
		a.buf[i] = byte(i*7 + i>>8)
	}
	write := func(id uint64, off int) {
		a.post(verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(off, n)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()})
	}
	pollNow := func(id uint64) {
		t.Helper()
		var wc [1]verbs.WorkCompletion
		k, err := a.scq.Poll(wc[:])
		require.NoError(t, err)
		require.Equal(t, 1, k, "the WR ran within PostSend")
		require.Equal(t, id, wc[0].WRID)
	}

	// Queue depth 1: each completion polled before the next post.
	for id := uint64(1); id <= 3; id++ {
		write(id, 0)
		pollNow(id)
	}
	require.Zero(t, handoffs())
	require.Zero(t, q.unpolled.Load())

	// Pipelined: the worker copies what is posted while a completion
	// is unpolled.
	write(4, 0)
	require.EqualValues(t, 1, q.unpolled.Load())
	write(5, n)
	write(6, 2*n)
	h := handoffs()
	require.GreaterOrEqual(t, h, uint64(1), "a large WR posted while an earlier one's completion is unpolled goes to the worker")
	for _, id := range []uint64{4, 5, 6} {
		require.Equal(t, id, pollOK(t, a.scq).WRID)
	}
	require.Zero(t, q.unpolled.Load(), "every counted completion was polled")
	require.Equal(t, a.buf[:3*n], b.buf[:3*n])

	// Small WRs are neither counted nor handed off, whatever is unpolled.
	write(7, 0)
	a.post(verbs.SendWR{ID: 8, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 64)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	require.EqualValues(t, 1, q.unpolled.Load())
	pollNow(7)
	pollNow(8)
	require.Equal(t, h, handoffs())
}
